package router

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A Converter says how keys and values are written, matching the Kafka
// Connect converter a Debezium user had, so that consumers read the same
// bytes and keys land on the same partitions after a switch.
type Converter string

const (
	// ConverterString writes the key and the payload as their bytes: what
	// Debezium writes with StringConverter for key and value. The default.
	ConverterString Converter = "string"
	// ConverterJSON writes the key and the value as JsonConverter with
	// schemas.enable=false does: a text key JSON-quoted ("A-1"), a text or
	// json payload as a JSON string holding its text, a NULL payload as the
	// four bytes null.
	ConverterJSON Converter = "json"
)

// Converters lists the converters in the order the documentation gives them.
var Converters = []Converter{ConverterString, ConverterJSON}

// byteaOID is the type OID of bytea, whose pgoutput text form is hex.
const byteaOID = 17

// key is the Kafka key of an aggregate id as the converter writes it. An
// empty id stays empty, so that Route can refuse it.
func (r *Router) key(pos *positions, aggID []byte) []byte {
	if r.converter != ConverterJSON || len(aggID) == 0 {
		return aggID
	}
	return jsonValue(nil, pos.keyType, aggID)
}

// value is the Kafka value: the payload (decoded from bytea already), in the
// converter's form, in an envelope when fields are placed there, or nil for
// a tombstone.
func (r *Router) value(pos *positions, payload []byte, row [][]byte) []byte {
	if r.tombstone && (payload == nil || len(bytes.TrimSpace(payload)) == 0) {
		return nil
	}
	envelope := r.envelope
	if r.converter == ConverterString && !envelope {
		return payload // the common case: the payload's bytes as stored
	}
	raw := row[pos.payload] // the text form, as Debezium has it
	switch {
	case r.converter == ConverterJSON && !envelope:
		return jsonValue(nil, pos.payloadType, raw)
	case r.converter == ConverterJSON:
		b := append(make([]byte, 0, len(raw)+64), `{"payload":`...)
		b = jsonValue(b, pos.payloadType, raw)
		for i, f := range r.fields {
			if f.Placement == PlaceEnvelope {
				b = append(jsonString(append(b, ','), []byte(f.Alias)), ':')
				b = jsonValue(b, pos.fields[i].typ, row[pos.fields[i].pos])
			}
		}
		return append(b, '}')
	case envelope:
		// Kafka Connect's Struct.toString, which StringConverter writes:
		// Struct{name=value,...}, null fields left out.
		b := append(make([]byte, 0, len(raw)+64), "Struct{"...)
		first := true
		add := func(name string, v []byte) {
			if v == nil {
				return
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(append(append(b, name...), '='), v...)
		}
		add("payload", structText(pos.payloadType, raw))
		for i, f := range r.fields {
			if f.Placement == PlaceEnvelope {
				if v := row[pos.fields[i].pos]; v != nil {
					add(f.Alias, structText(pos.fields[i].typ, v))
				}
			}
		}
		return append(b, '}')
	}
	return payload
}

// decodeBytea decodes bytea's hex text format, `\x` followed by hex digits.
func decodeBytea(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0] != '\\' || b[1] != 'x' {
		return nil, errors.New(`missing \x prefix`)
	}
	out := make([]byte, hex.DecodedLen(len(b)-2))
	if _, err := hex.Decode(out, b[2:]); err != nil {
		return nil, fmt.Errorf("decode hex: %w", err)
	}
	return out, nil
}

// jsonString appends s as a JSON string the way Jackson writes one (Kafka's
// JsonConverter): '"', '\\' and control characters escaped, \b \t \n \f \r
// short, the others as \u00XX in upper-case hex; characters beyond U+FFFF
// (emoji) as a surrogate pair \uD83D\uDE42; everything else, including
// U+2028, U+2029 and '/', as it is. Go's encoding/json differs
// (it escapes <, >, &, U+2028 and U+2029), which would change the bytes.
func jsonString(dst, s []byte) []byte {
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
