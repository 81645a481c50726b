package router

import (
	"bytes"
	"encoding/base64"
	"math"
	"math/big"
	"strconv"
	"strings"
	"time"
)

// How a column's value is written where Debezium writes its Kafka Connect
// value: a header (Connect's SimpleHeaderConverter), a field of the value's
// Struct under StringConverter (Struct.toString), and a field under
// JsonConverter without schemas. Debezium's PostgreSQL connector maps each
// type to a Connect type (its defaults: time.precision.mode adaptive,
// decimal.handling.mode precise, binary.handling.mode bytes); each writer
// prints that type its own way. Measured against Debezium 3.1.3 by
// internal/compat's TestDebeziumColumnTypes and, for edge values (empty
// strings, ±infinity, BC and five-digit years, NaN, subnormal floats, array
// bounds), TestDebeziumEdgeValues. pgoutput gives the relay Postgres's text
// form, and a domain column's type as the domain (Router.SetBaseTypes maps
// it to its base type); what is not listed here is written as that text,
// which is Debezium's too for text, varchar, uuid, json and jsonb.

// A colType is a column's type OID and modifier (precision, scale).
type colType struct {
	oid uint32
	mod int32
}

// Type OIDs whose value the converters write differently from Postgres's text.
const (
	boolOID        = 16
	int8OID        = 20
	int2OID        = 21
	int4OID        = 23
	oidOID         = 26
	float4OID      = 700
	float8OID      = 701
	dateOID        = 1082
	timeOID        = 1083
	timestampOID   = 1114
	timestamptzOID = 1184
	timetzOID      = 1266
	numericOID     = 1700
	jsonOID        = 114
	jsonbOID       = 3802

	boolArrayOID    = 1000
	int2ArrayOID    = 1005
	int4ArrayOID    = 1007
	textArrayOID    = 1009
	bpcharArrayOID  = 1014
	varcharArrayOID = 1015
	int8ArrayOID    = 1016
	float4ArrayOID  = 1021
	float8ArrayOID  = 1022
	uuidArrayOID    = 2951
)

// arrayElem maps the array types Debezium writes as Connect arrays to their
// element's type.
var arrayElem = map[uint32]uint32{
	boolArrayOID: boolOID, int2ArrayOID: int2OID, int4ArrayOID: int4OID, int8ArrayOID: int8OID,
	textArrayOID: 0, bpcharArrayOID: 0, varcharArrayOID: 0, uuidArrayOID: 0,
	float4ArrayOID: float4OID, float8ArrayOID: float8OID,
}

// Writers of a value.
const (
	inHeader = iota // SimpleHeaderConverter
	inStruct        // Struct.toString (StringConverter's envelope)
	inJSON          // JsonConverter, schemas disabled
)

// headerText is a non-NULL column value as Debezium's header holds it; nil
// for a header with a null value (an empty bytea and a numeric NaN are
// ones), empty (not nil) for an empty string, as Debezium's.
func headerText(ct colType, v []byte) []byte { return render(nil, ct, v, inHeader) }

// structText is a non-NULL column value as Struct.toString prints it; nil
// when Debezium's value is null (the field is then left out), empty (not
// nil) for an empty string.
func structText(ct colType, v []byte) []byte {
	if v == nil {
		return nil
	}
	return render(nil, ct, v, inStruct)
}

// jsonValue appends a column's value as JsonConverter (schemas disabled)
// writes Debezium's value of it; NULL is null.
func jsonValue(dst []byte, ct colType, v []byte) []byte {
	if v == nil {
		return append(dst, "null"...)
	}
	return render(dst, ct, v, inJSON)
}

// render appends v, a column's text of type ct, as writer w writes
// Debezium's value of it. A text it cannot read is written as it is (as a
// JSON string for inJSON).
//
// Debezium's null (a numeric NaN, an empty bytea header) is "null" for
// inJSON and a nil result otherwise; every other value, the empty string
// included, is a non-nil result.
func render(dst []byte, ct colType, v []byte, w int) []byte {
	if dst == nil && w != inJSON {
		dst = make([]byte, 0, len(v)+8) // non-nil: an empty string is not a null
	}
	switch ct.oid {
	case int2OID, int4OID, int8OID, oidOID:
		return append(dst, v...)
	case boolOID:
		return append(dst, boolText(v)...)
	case float4OID, float8OID:
		return renderFloat(dst, ct, v, w)
	case timestampOID:
		return renderTimestamp(dst, ct, v, w)
	case timestamptzOID:
		return renderTimestamptz(dst, ct, v, w)
	case dateOID:
		return renderDate(dst, v, w)
	case timeOID:
		us, ok := parseTimeOfDay(string(v))
		if !ok {
			return asText(dst, v, w)
		}
		if ct.mod >= 0 && ct.mod <= 3 {
			return strconv.AppendInt(dst, us/1000, 10) // io.debezium.time.Time (ms)
		}
		return strconv.AppendInt(dst, us, 10) // MicroTime (µs)
	case timetzOID:
		b, ok := zonedTime(string(v))
		if !ok {
			return asText(dst, v, w)
		}
		return asString(dst, b, w)
	case numericOID:
		return renderNumeric(dst, ct, v, w)
	case byteaOID:
		return renderBytea(dst, v, w)
	}
	if elem, ok := arrayElem[ct.oid]; ok {
		if out, ok := renderArray(dst, elem, v, w); ok {
			return out
		}
	}
	return asText(dst, v, w)
}

// asText appends v as it is: render's answer to a text it cannot read.
func asText(dst, v []byte, w int) []byte {
	if w == inJSON {
		return jsonString(dst, v)
	}
	return append(dst, v...)
}

// asString appends b, a value Debezium writes as a string: quoted for inJSON.
func asString(dst, b []byte, w int) []byte {
	if w == inJSON {
		return jsonString(dst, b)
	}
	return append(dst, b...)
}

// asNull is Debezium's null: "null" for inJSON, else a nil result.
func asNull(dst []byte, w int) []byte {
	if w == inJSON {
		return append(dst, "null"...)
	}
	return nil
}

// renderFloat writes a real or double precision as Java prints it.
func renderFloat(dst []byte, ct colType, v []byte, w int) []byte {
	bits := 64
	if ct.oid == float4OID {
		bits = 32
	}
	f, err := strconv.ParseFloat(string(v), bits)
	if err != nil {
		return asText(dst, v, w)
	}
	s := javaFloat(f, bits)
	if w == inJSON && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return jsonString(dst, []byte(s)) // Jackson quotes non-numeric numbers
	}
	return append(dst, s...)
}

// renderTimestamp writes a timestamp (without time zone) adaptively:
// precision 0-3 is io.debezium.time.Timestamp (ms), 4-6 MicroTimestamp (µs).
func renderTimestamp(dst []byte, ct colType, v []byte, w int) []byte {
	ms := ct.mod >= 0 && ct.mod <= 3
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
	t, ok := parseTimestamp(v, false)
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
func renderTimestamptz(dst []byte, ct colType, v []byte, w int) []byte {
	t, ok := parseTimestamp(v, true)
	if !ok {
		return asText(dst, v, w) // ±infinity: Debezium writes the text too
	}
	t = t.UTC()
	b := appendJavaYear(nil, t.Year())
	b = t.AppendFormat(b, "-01-02T15:04:05")
	if p := precision(ct.mod); p > 0 {
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
	t, ok := parseTimestamp(d, false)
	if !ok {
		return asText(dst, v, w)
	}
	return strconv.AppendInt(dst, t.Unix()/86400, 10)
}

// renderBytea writes a bytea as Connect's BYTES: base64, or a
// java.nio.ByteBuffer's toString in Struct.toString.
func renderBytea(dst, v []byte, w int) []byte {
	b, err := decodeBytea(v)
	if err != nil {
		return asText(dst, v, w)
	}
	switch w {
	case inStruct:
		// Connect's BYTES value is a java.nio.ByteBuffer; toString.
		n := strconv.Itoa(len(b))
		return append(dst, "java.nio.HeapByteBuffer[pos=0 lim="+n+" cap="+n+"]"...)
	case inHeader:
		if len(b) == 0 {
			return asNull(dst, w) // SimpleHeaderConverter writes an empty buffer as null
		}
		return base64.StdEncoding.AppendEncode(dst, b)
	}
	dst = append(dst, '"')
	return append(base64.StdEncoding.AppendEncode(dst, b), '"')
}

// renderNumeric writes a numeric. With a declared scale it is a Connect
// Decimal: BigDecimal.toString in text, the unscaled value's two's
// complement bytes in base64 under JsonConverter. Without one it is
// Debezium's VariableScaleDecimal Struct {scale, value}: a JSON object in a
// header and under JsonConverter; Struct.toString prints the bytes' Java
// identity ([B@1b2c3d), which cannot be reproduced, so the text is written
// (migrate reports it), so the number is written, at Debezium's scale. NaN
// and the infinities (Postgres 14 on) are null, as Debezium's.
func renderNumeric(dst []byte, ct colType, v []byte, w int) []byte {
	switch string(v) {
	case "NaN", "Infinity", "-Infinity":
		// Debezium writes them as null (decimal.handling.mode precise,
		// logging an error); the infinities are Postgres 14's.
		return asNull(dst, w)
	}
	unscaled, scale, ok := parseDecimal(string(v))
	if !ok {
		return asText(dst, v, w)
	}
	if ct.mod < 0 {
		// VariableScaleDecimal drops the fraction's trailing zeros (-1.10
		// is scale 1, 100.000 scale 0) but never goes below scale 0.
		for scale > 0 && new(big.Int).Rem(unscaled, big.NewInt(10)).Sign() == 0 {
			unscaled.Quo(unscaled, big.NewInt(10))
			scale--
		}
		if w == inStruct {
			return append(dst, bigDecimalString(unscaled, scale)...)
		}
		dst = append(strconv.AppendInt(append(dst, `{"scale":`...), int64(scale), 10), `,"value":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, twosComplement(unscaled))
		return append(dst, `"}`...)
	}
	if w == inJSON {
		dst = append(dst, '"')
		return append(base64.StdEncoding.AppendEncode(dst, twosComplement(unscaled)), '"')
	}
	return append(dst, bigDecimalString(unscaled, scale)...)
}

func boolText(v []byte) []byte {
	switch string(v) {
	case "t":
		return []byte("true")
	case "f":
		return []byte("false")
	}
	return v
}

// precision is a timestamp's or time's precision from its type modifier.
func precision(mod int32) int {
	if mod < 0 || mod > 6 {
		return 6
	}
	return int(mod)
}

// javaFloat formats f as Java's Double.toString (bits 64) or Float.toString
// (32) does from JDK 19 on (Raffaello Giulietti's specification), which
// Connect's converters and Jackson use: the shortest decimal that reads back
// as f, but when that has one digit, the closest one of at most two (Java
// writes Float.MIN_VALUE 1.4E-45 where Go writes 1e-45); plain between 10^-3
// and 10^7 with at least one fraction digit, else d.dddE±n. JDK 17 and 18
// print a few values with more digits than needed (1.0E23 as
// 9.999999999999999E22): docs/debezium.md names them.
func javaFloat(f float64, bits int) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	case f == 0 && math.Signbit(f):
		return "-0.0"
	case f == 0:
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, bits)
	if mant, _, _ := strings.Cut(e, "e"); !strings.Contains(mant, ".") {
		// One digit: the closest two-digit decimal, if it reads back as f.
		if two := strconv.FormatFloat(f, 'e', 1, bits); parsesAs(two, f, bits) {
			e = two
		}
	}
	mant, exp, _ := strings.Cut(e, "e")
	neg := strings.HasPrefix(mant, "-")
	mant = strings.TrimPrefix(mant, "-")
	digits := strings.TrimRight(strings.Replace(mant, ".", "", 1), "0")
	if digits == "" {
		digits = "0"
	}
	x, _ := strconv.Atoi(exp) // f = 0.d1d2... × 10^(x+1)
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	if a := math.Abs(f); a >= 1e-3 && a < 1e7 {
		switch {
		case x < 0:
			b.WriteString("0.")
			b.WriteString(strings.Repeat("0", -x-1))
			b.WriteString(digits)
		case len(digits) > x+1:
			b.WriteString(digits[:x+1])
			b.WriteByte('.')
			b.WriteString(digits[x+1:])
		default:
			b.WriteString(digits)
			b.WriteString(strings.Repeat("0", x+1-len(digits)))
			b.WriteString(".0")
		}
		return b.String()
	}
	b.WriteString(digits[:1])
	b.WriteByte('.')
	if len(digits) > 1 {
		b.WriteString(digits[1:])
	} else {
		b.WriteByte('0')
	}
	b.WriteByte('E')
	b.WriteString(strconv.Itoa(x))
	return b.String()
}

// parsesAs reports whether s reads back as f at bits' precision.
func parsesAs(s string, f float64, bits int) bool {
	g, err := strconv.ParseFloat(s, bits)
	return err == nil && g == f
}

// parseDecimal reads Postgres's text of a finite numeric into its unscaled
// value and scale (the digits after the point).
func parseDecimal(s string) (*big.Int, int, bool) {
	intPart, frac, _ := strings.Cut(s, ".")
	u, ok := new(big.Int).SetString(intPart+frac, 10)
	if !ok || strings.ContainsAny(frac, "+-") {
		return nil, 0, false
	}
	return u, len(frac), true
}

// bigDecimalString is Java's BigDecimal.toString of unscaled × 10^-scale:
// plain unless the adjusted exponent is below -6, then scientific (1.23E-8,
// 0E-10).
func bigDecimalString(unscaled *big.Int, scale int) string {
	coeff := new(big.Int).Abs(unscaled).String()
	sign := ""
	if unscaled.Sign() < 0 {
		sign = "-"
	}
	adjusted := len(coeff) - 1 - scale
	if scale >= 0 && adjusted >= -6 {
		switch {
		case scale == 0:
			return sign + coeff
		case len(coeff) > scale:
			return sign + coeff[:len(coeff)-scale] + "." + coeff[len(coeff)-scale:]
		default:
			return sign + "0." + strings.Repeat("0", scale-len(coeff)) + coeff
		}
	}
	s := sign + coeff[:1]
	if len(coeff) > 1 {
		s += "." + coeff[1:]
	}
	s += "E"
	if adjusted > 0 {
		s += "+"
	}
	return s + strconv.Itoa(adjusted)
}

// twosComplement is Java's BigInteger.toByteArray: the shortest big-endian
// two's complement bytes of x.
func twosComplement(x *big.Int) []byte {
	mag := x
	if x.Sign() < 0 {
		mag = new(big.Int).Sub(new(big.Int).Neg(x), big.NewInt(1))
	}
	n := mag.BitLen()/8 + 1
	if x.Sign() >= 0 {
		return x.FillBytes(make([]byte, n))
	}
	v := new(big.Int).Add(new(big.Int).Lsh(big.NewInt(1), uint(8*n)), x)
	return v.FillBytes(make([]byte, n))
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

// renderArray writes a one-dimensional Postgres array text ({a,"b c",NULL})
// as a Connect array: a JSON array in a header and under JsonConverter
// ([1,2,3], ["a","b c"]), Java's List.toString in a Struct ([a, b c]).
// Explicit bounds are dropped, as Debezium drops them; a multi-dimensional
// array is a null per top-level element ([null, null]), as Debezium's.
func renderArray(dst []byte, elem uint32, v []byte, w int) ([]byte, bool) {
	items, ok := parseArray(string(v))
	if !ok {
		return nil, false
	}
	sep := ","
	if w == inStruct {
		sep = ", "
	}
	dst = append(dst, '[')
	for i, it := range items {
		if i > 0 {
			dst = append(dst, sep...)
		}
		if it == nil {
			dst = append(dst, "null"...)
			continue
		}
		switch {
		case elem == 0 && w == inHeader:
			// Connect's Values.convertToString quotes a string escaping only
			// '\\' and '"': other characters, non-ASCII and control ones
			// included, are written as they are.
			dst = append(dst, '"')
			for _, c := range []byte(*it) {
				if c == '\\' || c == '"' {
					dst = append(dst, '\\')
				}
				dst = append(dst, c)
			}
			dst = append(dst, '"')
		case elem == 0 && w == inJSON: // a JSON string, as Jackson writes it
			dst = jsonString(dst, []byte(*it))
		case elem == 0:
			dst = append(dst, *it...)
		default:
			dst = render(dst, colType{oid: elem, mod: -1}, []byte(*it), inJSON)
		}
	}
	return append(dst, ']'), true
}

// parseArray splits a one-dimensional array's text into its elements, nil
// for NULL, with quotes and backslash escapes removed.
func parseArray(s string) ([]*string, bool) {
	if strings.HasPrefix(s, "[") {
		// Explicit bounds ([2:3]={1,2}): Debezium's list has the elements
		// only.
		i := strings.Index(s, "]={")
		if i < 0 {
			return nil, false
		}
		s = s[i+2:]
	}
	if strings.HasPrefix(s, "{{") {
		// More than one dimension: Debezium's list holds a null per
		// top-level element ({{1,2},{3,4}} is [null, null]).
		var items []*string
		depth := 0
		for i := 1; i < len(s)-1; i++ {
			switch s[i] {
			case '"':
				for i++; i < len(s) && s[i] != '"'; i++ {
					if s[i] == '\\' {
						i++
					}
				}
			case '{':
				if depth == 0 {
					items = append(items, nil)
				}
				depth++
			case '}':
				depth--
			}
		}
		return items, depth == 0
	}
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	body := s[1 : len(s)-1]
	var items []*string
	if body == "" {
		return items, true
	}
	for i := 0; i <= len(body); {
		if i < len(body) && body[i] == '{' {
			return nil, false // multi-dimensional
		}
		var sb strings.Builder
		quoted := i < len(body) && body[i] == '"'
		if quoted {
			i++
			for i < len(body) && body[i] != '"' {
				if body[i] == '\\' && i+1 < len(body) {
					i++
				}
				sb.WriteByte(body[i])
				i++
			}
			if i >= len(body) {
				return nil, false
			}
			i++ // closing quote
		} else {
			for i < len(body) && body[i] != ',' {
				sb.WriteByte(body[i])
				i++
			}
		}
		it := sb.String()
		if !quoted && strings.EqualFold(it, "NULL") {
			items = append(items, nil)
		} else {
			items = append(items, &it)
		}
		if i < len(body) && body[i] != ',' {
			return nil, false
		}
		i++
	}
	return items, true
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

// parseTimestamp parses pgoutput's text of a timestamp (withZone false:
// read as UTC, as Debezium reads it) or timestamptz (Postgres writes the
// offset as +HH, +HH:MM or +HH:MM:SS). Years may have five digits or more,
// and " BC" ends a date before year 1 (1 BC is the proleptic year 0, as
// java.time counts).
func parseTimestamp(v []byte, withZone bool) (time.Time, bool) {
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
