// Package connect writes a Postgres column's value as Kafka Connect writes
// Debezium's value of it, so that a consumer reads the same bytes after a
// switch from Debezium: in a header (SimpleHeaderConverter), as a field of
// the value's Struct under StringConverter (Struct.toString), and under
// JsonConverter without schemas. The router writes keys, values, header and
// envelope fields with it.
//
// Debezium's PostgreSQL connector maps each type to a Connect type (its
// defaults: time.precision.mode adaptive, decimal.handling.mode precise,
// binary.handling.mode bytes); each writer prints that type its own way.
// Measured against Debezium 3.1.3 by internal/compat's
// TestDebeziumColumnTypes and, for edge values (empty strings, ±infinity,
// BC and five-digit years, NaN, subnormal floats, array bounds),
// TestDebeziumEdgeValues. pgoutput gives Postgres's text form, and a domain
// column's type as the domain (the router passes its base type's Type);
// what is not listed here is written as that text, which is Debezium's too
// for text, varchar, uuid, json and jsonb. The files follow Connect's
// types: connect.go the writers, Struct, strings and bytes; numbers.go,
// times.go and arrays.go the rest.
package connect

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A Type is a column's type OID and modifier (precision, scale), as
// pgoutput's Relation message gives them.
type Type struct {
	OID uint32
	Mod int32
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
	byteaOID       = 17 // its pgoutput text form is hex

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

// Writers of a value.
const (
	inHeader = iota // SimpleHeaderConverter
	inStruct        // Struct.toString (StringConverter's envelope)
	inJSON          // JsonConverter, schemas disabled
)

// HeaderValue is a column value as Debezium's header holds it; nil for NULL
// and for a header with a null value (an empty bytea and a numeric NaN are
// ones), empty (not nil) for an empty string, as Debezium's.
func HeaderValue(ct Type, v []byte) []byte { return render(nil, ct, v, inHeader) }

// structText is a column value as Struct.toString prints it; nil when
// Debezium's value is null (the field is then left out), empty (not nil)
// for an empty string.
func structText(ct Type, v []byte) []byte { return render(nil, ct, v, inStruct) }

// AppendJSON appends a column's value as JsonConverter (schemas disabled)
// writes Debezium's value of it; NULL is null.
func AppendJSON(dst []byte, ct Type, v []byte) []byte { return render(dst, ct, v, inJSON) }

// An Envelope is Debezium's outbox envelope, the record value as a Connect
// Struct of the payload and the fields placed beside it, as a converter
// writes it: under JsonConverter a JSON object, {"payload":...,"name":...},
// a null field as null; under StringConverter Struct.toString,
// Struct{payload=...,name=...}, a null field left out.
type Envelope struct {
	b     []byte
	json  bool
	empty bool // no field written yet
}

// NewEnvelope starts an envelope written by JsonConverter (json) or
// StringConverter, with the payload, a column's text of type t.
func NewEnvelope(json bool, t Type, payload []byte) Envelope {
	e := Envelope{b: make([]byte, 0, len(payload)+64), json: json, empty: true}
	if json {
		e.b = render(append(e.b, `{"payload":`...), t, payload, inJSON)
		e.empty = false
		return e
	}
	e.b = append(e.b, "Struct{"...)
	e.Add("payload", t, payload)
	return e
}

// Add appends the field name, a column's text v of type t (nil: NULL).
func (e *Envelope) Add(name string, t Type, v []byte) {
	if e.json {
		e.b = append(AppendJSONString(append(e.b, ','), []byte(name)), ':')
		e.b = render(e.b, t, v, inJSON)
		return
	}
	text := render(nil, t, v, inStruct)
	if text == nil {
		return // Debezium's null: Struct.toString leaves the field out
	}
	if !e.empty {
		e.b = append(e.b, ',')
	}
	e.b = append(append(append(e.b, name...), '='), text...)
	e.empty = false
}

// Bytes ends the envelope and returns its bytes.
func (e *Envelope) Bytes() []byte { return append(e.b, '}') }

// render appends v, a column's text of type ct, as writer w writes
// Debezium's value of it. A text it cannot read is written as it is (as a
// JSON string for inJSON).
//
// Debezium's null (NULL, a numeric NaN, an empty bytea header) is "null"
// for inJSON and a nil result otherwise; every other value, the empty
// string included, is a non-nil result.
func render(dst []byte, ct Type, v []byte, w int) []byte {
	if v == nil {
		return asNull(dst, w)
	}
	if dst == nil && w != inJSON {
		dst = make([]byte, 0, len(v)+8) // non-nil: an empty string is not a null
	}
	switch ct.OID {
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
		if ct.Mod >= 0 && ct.Mod <= 3 {
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
	if elem, ok := arrayElem[ct.OID]; ok {
		if out, ok := renderArray(dst, elem, v, w); ok {
			return out
		}
	}
	// Text, uuid, json, jsonb and the like: the text as it is (asText,
	// written out as the common case).
	if w == inJSON {
		return AppendJSONString(dst, v)
	}
	return append(dst, v...)
}

// asText appends v as it is: render's answer to a text it cannot read.
func asText(dst, v []byte, w int) []byte {
	if w == inJSON {
		return AppendJSONString(dst, v)
	}
	return append(dst, v...)
}

// asString appends b, a value Debezium writes as a string: quoted for inJSON.
func asString(dst, b []byte, w int) []byte {
	if w == inJSON {
		return AppendJSONString(dst, b)
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

// renderBytea writes a bytea as Connect's BYTES: base64, or a
// java.nio.ByteBuffer's toString in Struct.toString.
func renderBytea(dst, v []byte, w int) []byte {
	b, err := DecodeBytea(v)
	if err != nil {
		return asText(dst, v, w)
	}
	switch w {
	case inStruct:
		// Connect's BYTES value is a java.nio.ByteBuffer; toString.
		n := strconv.Itoa(len(b))
		return append(dst, "java.nio.HeapByteBuffer[pos=0 lim="+n+" cap="+n+"]"...)
	case inHeader:
		// An empty buffer is an empty header value, not a null one, as
		// SimpleHeaderConverter writes it (seen once the suite read Kafka
		// with a client that tells the two apart).
		return base64.StdEncoding.AppendEncode(dst, b)
	}
	dst = append(dst, '"')
	return append(base64.StdEncoding.AppendEncode(dst, b), '"')
}

// DecodeBytea decodes bytea's hex text format, `\x` followed by hex digits.
func DecodeBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, errors.New(`missing \x prefix`)
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("decode hex: %w", err)
	}
	return out, nil
}

// AppendJSONString appends s as a JSON string the way Jackson writes one (Kafka's
// JsonConverter): '"', '\\' and control characters escaped, \b \t \n \f \r
// short, the others as \u00XX in upper-case hex; characters beyond U+FFFF
// (emoji) as a surrogate pair \uD83D\uDE42; everything else, including
// U+2028, U+2029 and '/', as it is. Go's encoding/json differs
// (it escapes <, >, &, U+2028 and U+2029), which would change the bytes.
func AppendJSONString(dst, s []byte) []byte {
	const hexDigits = "0123456789ABCDEF"
	dst = slices.Grow(dst, len(s)+2)
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0xF0 {
			// A character beyond the BMP: Jackson (2.16 on, as in Kafka
			// 3.9) writes it as an escaped UTF-16 surrogate pair.
			r, size := utf8.DecodeRune(s[i:])
			if r == utf8.RuneError || size != 4 {
				continue
			}
			hi, lo := utf16.EncodeRune(r)
			dst = append(dst, s[start:i]...)
			for _, u := range [2]rune{hi, lo} {
				dst = append(dst, '\\', 'u', hexDigits[u>>12&0xF], hexDigits[u>>8&0xF], hexDigits[u>>4&0xF], hexDigits[u&0xF])
			}
			i += size - 1
			start = i + 1
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		start = i + 1
	}
	dst = append(dst, s[start:]...)
	if !utf8.Valid(s) {
		// Postgres text is valid UTF-8 in a UTF8 database; in another
		// encoding Jackson would have replaced bad bytes, and so do we.
		dst = []byte(strings.ToValidUTF8(string(dst), "\uFFFD"))
	}
	return append(dst, '"')
}
