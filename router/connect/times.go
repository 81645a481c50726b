package connect

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"time"
)

// renderTimestamp writes a timestamp (without time zone) adaptively:
// precision 0-3 is io.debezium.time.Timestamp (ms), 4-6 MicroTimestamp (µs).
func renderTimestamp(dst []byte, ct Type, v []byte, w int) []byte {
	ms := ct.Mod >= 0 && ct.Mod <= 3
	switch string(v) {
	case "infinity", "-infinity":
		// Debezium's sentinels for them (pgjdbc's infinities
		// converted through LocalDateTime).
		s := tsInfinity[string(v)]
		if ms {
			s = s[:len(s)-3]
		}
		return append(dst, s...)
	}
	t, ok := ParseTimestamp(v, false)
	if !ok {
		return asText(dst, v, w)
	}
	if ms {
		return strconv.AppendInt(dst, t.UnixMilli(), 10)
	}
	return strconv.AppendInt(dst, t.UnixMicro(), 10)
}

// renderTimestamptz writes a timestamp with time zone as
// io.debezium.time.ZonedTimestamp: ISO 8601 in UTC, the fraction as wide as
// the column's precision; years as java.time prints them (-0043, +12345).
func renderTimestamptz(dst []byte, ct Type, v []byte, w int) []byte {
	t, ok := ParseTimestamp(v, true)
	if !ok {
		return asText(dst, v, w) // ±infinity: Debezium writes the text too
	}
	t = t.UTC()
	b := appendJavaYear(nil, t.Year())
	b = t.AppendFormat(b, "-01-02T15:04:05")
	if p := precision(ct.Mod); p > 0 {
		frac := strconv.AppendInt(nil, int64(t.Nanosecond())/int64(math.Pow10(9-p)), 10)
		b = append(append(b, '.'), bytes.Repeat([]byte{'0'}, p-len(frac))...)
		b = append(b, frac...)
	}
	b = append(b, 'Z')
	return asString(dst, b, w)
}

// renderDate writes a date as io.debezium.time.Date: days since the epoch.
func renderDate(dst, v []byte, w int) []byte {
	switch string(v) {
	case "infinity":
		return append(dst, "-2147472692"...) // Debezium's sentinels, as written by 3.1.3
	case "-infinity":
		return append(dst, "-2147472691"...)
	}
	d, bc := bytes.CutSuffix(v, []byte(" BC"))
	d = append(d[:len(d):len(d)], " 00:00:00"...)
	if bc {
		d = append(d, " BC"...)
	}
	t, ok := ParseTimestamp(d, false)
	if !ok {
		return asText(dst, v, w)
	}
	return strconv.AppendInt(dst, t.Unix()/86400, 10)
}

// precision is a timestamp's or time's precision from its type modifier.
func precision(mod int32) int {
	if mod < 0 || mod > 6 {
		return 6
	}
	return int(mod)
}

// parseTimeOfDay reads Postgres's text of a time (HH:MM:SS[.ffffff], up to
// 24:00:00) as microseconds since midnight.
func parseTimeOfDay(s string) (int64, bool) {
	hms, frac, _ := strings.Cut(s, ".")
	parts := strings.Split(hms, ":")
	if len(parts) != 3 || len(frac) > 6 {
		return 0, false
	}
	var n [3]int64
	for i, p := range parts {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil || len(p) != 2 {
			return 0, false
		}
		n[i] = v
	}
	us := ((n[0]*60+n[1])*60 + n[2]) * 1e6
	if frac != "" {
		f, err := strconv.ParseInt(frac+strings.Repeat("0", 6-len(frac)), 10, 64)
		if err != nil {
			return 0, false
		}
		us += f
	}
	return us, us <= 24*3600*1e6
}

// zonedTime is io.debezium.time.ZonedTime of Postgres's text of a timetz
// (HH:MM:SS[.ffffff]±HH[:MM[:SS]]): the time in UTC, ISO 8601, the fraction
// without trailing zeros (none when zero), then Z.
func zonedTime(s string) ([]byte, bool) {
	i := strings.LastIndexAny(s, "+-")
	if i < 0 {
		return nil, false
	}
	us, ok := parseTimeOfDay(s[:i])
	if !ok {
		return nil, false
	}
	off := strings.Split(s[i+1:], ":")
	var secs int64
	for k, p := range off {
		v, err := strconv.ParseInt(p, 10, 64)
		if err != nil || k > 2 {
			return nil, false
		}
		secs += v * []int64{3600, 60, 1}[k]
	}
	if s[i] == '+' {
		secs = -secs
	}
	const day = 24 * 3600 * 1e6
	us = ((us+secs*1e6)%day + day) % day
	b := []byte(time.UnixMicro(us).UTC().Format("15:04:05"))
	if f := us % 1e6; f != 0 {
		b = append(b, '.')
		b = append(b, strings.TrimRight(strconv.FormatInt(f+1e6, 10)[1:], "0")...)
	}
	return append(b, 'Z'), true
}

// tsInfinity are the microsecond values Debezium 3.1.3 writes for a
// timestamp's ±infinity (the millisecond ones are these without their last
// three digits).
var tsInfinity = map[string]string{
	"infinity":  "9223372036825200000",
	"-infinity": "-9223372036832400000",
}

// appendJavaYear appends a year as java.time's ISO formatter prints it: four
// digits at least, a sign when negative (1 BC is year 0, 2 BC -0001) and a
// '+' above 9999.
func appendJavaYear(dst []byte, y int) []byte {
	switch {
	case y < 0:
		dst = append(dst, '-')
		y = -y
	case y > 9999:
		dst = append(dst, '+')
	}
	s := strconv.Itoa(y)
	if len(s) < 4 {
		dst = append(dst, "0000"[len(s):]...)
	}
	return append(dst, s...)
}

// ParseTimestamp parses pgoutput's text of a timestamp (withZone false:
// read as UTC, as Debezium reads it) or timestamptz (Postgres writes the
// offset as +HH, +HH:MM or +HH:MM:SS). Years may have five digits or more,
// and " BC" ends a date before year 1 (1 BC is the proleptic year 0, as
// java.time counts).
func ParseTimestamp(v []byte, withZone bool) (time.Time, bool) {
	s := string(v)
	bc := strings.HasSuffix(s, " BC")
	s = strings.TrimSuffix(s, " BC")
	dash := strings.IndexByte(s, '-')
	if dash < 4 {
		return time.Time{}, false
	}
	year, err := strconv.Atoi(s[:dash])
	if err != nil || year < 1 {
		return time.Time{}, false
	}
	if bc {
		year = 1 - year
	}
	rest := "2000" + s[dash:] // a leap year, for 02-29
	layouts := []string{"2006-01-02 15:04:05.999999"}
	if withZone {
		layouts = []string{"2006-01-02 15:04:05.999999Z07", "2006-01-02 15:04:05.999999Z07:00", "2006-01-02 15:04:05.999999Z07:00:00"}
	}
	for _, layout := range layouts {
		if t, err := time.Parse(layout, rest); err == nil {
			return time.Date(year, t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), t.Location()), true
		}
	}
	return time.Time{}, false
}
