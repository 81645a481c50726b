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
// internal/compat's TestDebeziumColumnTypes. pgoutput gives the relay
// Postgres's text form; what is not listed here is written as that text,
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
// for a header with a null value (an empty bytea is one).
func headerText(ct colType, v []byte) []byte { return render(nil, ct, v, inHeader) }

// structText is a non-NULL column value as Struct.toString prints it.
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
func render(dst []byte, ct colType, v []byte, w int) []byte {
	asText := func() []byte {
		if w == inJSON {
			return jsonString(dst, v)
		}
		return append(dst, v...)
	}
	switch ct.oid {
	case int2OID, int4OID, int8OID, oidOID:
		return append(dst, v...)
	case boolOID:
		return append(dst, boolText(v)...)
	case float4OID, float8OID:
		bits := 64
		if ct.oid == float4OID {
			bits = 32
		}
		f, err := strconv.ParseFloat(string(v), bits)
		if err != nil {
			return asText()
		}
		s := javaFloat(f, bits)
		if w == inJSON && (math.IsNaN(f) || math.IsInf(f, 0)) {
			return jsonString(dst, []byte(s)) // Jackson quotes non-numeric numbers
		}
		return append(dst, s...)
	case timestampOID:
		t, ok := parseTimestamp(v, false)
		if !ok {
			return asText()
		}
		// adaptive: precision 0-3 is io.debezium.time.Timestamp (ms),
		// 4-6 MicroTimestamp (µs).
		if ct.mod >= 0 && ct.mod <= 3 {
			return strconv.AppendInt(dst, t.UnixMilli(), 10)
		}
		return strconv.AppendInt(dst, t.UnixMicro(), 10)
	case timestamptzOID:
		t, ok := parseTimestamp(v, true)
		if !ok {
			return asText()
		}
		// io.debezium.time.ZonedTimestamp: ISO 8601 in UTC, the fraction as
		// wide as the column's precision.
		b := t.UTC().AppendFormat(nil, "2006-01-02T15:04:05")
		if p := precision(ct.mod); p > 0 {
			frac := strconv.AppendInt(nil, int64(t.Nanosecond())/int64(math.Pow10(9-p)), 10)
			b = append(append(b, '.'), bytes.Repeat([]byte{'0'}, p-len(frac))...)
			b = append(b, frac...)
		}
		b = append(b, 'Z')
		if w == inJSON {
			return jsonString(dst, b)
		}
		return append(dst, b...)
	case dateOID:
		t, err := time.Parse("2006-01-02", string(v))
		if err != nil {
			return asText()
		}
		return strconv.AppendInt(dst, t.Unix()/86400, 10) // io.debezium.time.Date: days since the epoch
	case timeOID:
		us, ok := parseTimeOfDay(string(v))
		if !ok {
			return asText()
		}
		if ct.mod >= 0 && ct.mod <= 3 {
			return strconv.AppendInt(dst, us/1000, 10) // io.debezium.time.Time (ms)
		}
		return strconv.AppendInt(dst, us, 10) // MicroTime (µs)
	case timetzOID:
		b, ok := zonedTime(string(v))
		if !ok {
			return asText()
		}
		if w == inJSON {
			return jsonString(dst, b)
		}
		return append(dst, b...)
	case numericOID:
		return renderNumeric(dst, ct, v, w, asText)
	case byteaOID:
		b, err := decodeBytea(v)
		if err != nil {
			return asText()
		}
		switch w {
		case inStruct:
			// Connect's BYTES value is a java.nio.ByteBuffer; toString.
			n := strconv.Itoa(len(b))
			return append(dst, "java.nio.HeapByteBuffer[pos=0 lim="+n+" cap="+n+"]"...)
		case inHeader:
			if len(b) == 0 {
				return nil // SimpleHeaderConverter writes an empty buffer as null
			}
			return base64.StdEncoding.AppendEncode(dst, b)
		}
		dst = append(dst, '"')
		return append(base64.StdEncoding.AppendEncode(dst, b), '"')
	}
	if elem, ok := arrayElem[ct.oid]; ok {
		if out, ok := renderArray(dst, elem, v, w); ok {
			return out
		}
	}
	return asText()
}

// renderNumeric writes a numeric. With a declared scale it is a Connect
// Decimal: BigDecimal.toString in text, the unscaled value's two's
// complement bytes in base64 under JsonConverter. Without one it is
// Debezium's VariableScaleDecimal Struct {scale, value}: a JSON object in a
// header and under JsonConverter; Struct.toString prints the bytes' Java
// identity ([B@1b2c3d), which cannot be reproduced, so the text is written
// (migrate reports it). NaN and infinities are written as text.
func renderNumeric(dst []byte, ct colType, v []byte, w int, asText func() []byte) []byte {
	unscaled, scale, ok := parseDecimal(string(v))
	if !ok {
		return asText()
	}
	if ct.mod < 0 {
		if w == inStruct {
			return asText()
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
// (32) does, which Connect's converters and Jackson use: plain between 10^-3
// and 10^7 with at least one fraction digit, else d.dddE±n.
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
	if a := math.Abs(f); a >= 1e-3 && a < 1e7 {
		s := strconv.FormatFloat(f, 'f', -1, bits)
		if !strings.Contains(s, ".") {
			s += ".0"
		}
		return s
	}
	mant, exp, _ := strings.Cut(strconv.FormatFloat(f, 'e', -1, bits), "e")
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	e, _ := strconv.Atoi(exp)
	return mant + "E" + strconv.Itoa(e)
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
// Multi-dimensional arrays and ones with explicit bounds are not read.
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
		case elem == 0 && w != inStruct: // text-like: a JSON string
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

// parseTimestamp parses pgoutput's text of a timestamp (withZone false:
// read as UTC, as Debezium reads it) or timestamptz (Postgres writes the
// offset as +HH, +HH:MM or +HH:MM:SS).
func parseTimestamp(v []byte, withZone bool) (time.Time, bool) {
	layouts := []string{"2006-01-02 15:04:05.999999"}
	if withZone {
		layouts = []string{"2006-01-02 15:04:05.999999Z07", "2006-01-02 15:04:05.999999Z07:00", "2006-01-02 15:04:05.999999Z07:00:00"}
	}
	for _, layout := range layouts {
		if t, err := time.Parse(layout, string(v)); err == nil {
			return t, true
		}
	}
	return time.Time{}, false
}
