package router

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/outbox-relay/outbox-relay/field"
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

// A Placement says where an additional column goes (Debezium's
// table.fields.additional.placement).
type Placement string

const (
	// PlaceHeader sends the column as a Kafka header named by the alias.
	PlaceHeader Placement = "header"
	// PlaceEnvelope wraps the value in an envelope {payload, alias: column,
	// ...}, as Debezium does.
	PlaceEnvelope Placement = "envelope"
)

// A Field is an additional column and where it goes.
type Field struct {
	Column    string
	Placement Placement
	Alias     string // the header or envelope field name; default Column
}

// ParseFields parses Debezium's table.fields.additional.placement syntax:
// column:placement[:alias] entries separated by commas, placement header or
// envelope (partition is not supported: the relay keeps Kafka's key →
// partition map so that per-aggregate order holds). Spaces around entries
// and parts are ignored, as Debezium ignores them.
func ParseFields(s string) ([]Field, error) {
	var fs []Field
	for _, entry := range strings.Split(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		for i := range parts {
			parts[i] = strings.TrimSpace(parts[i])
		}
		if len(parts) < 2 || len(parts) > 3 || parts[0] == "" {
			return nil, field.Errorf("Fields", "entry %q: want column:placement or column:placement:alias, placement header or envelope", entry)
		}
		f := Field{Column: parts[0], Placement: Placement(strings.ToLower(parts[1])), Alias: parts[0]}
		if len(parts) == 3 && parts[2] != "" {
			f.Alias = parts[2]
		}
		switch f.Placement {
		case PlaceHeader, PlaceEnvelope:
		case "partition":
			return nil, field.Errorf("Fields", "entry %q: the partition placement is not supported: the relay sends each aggregate to the partition its key hashes to, which keeps its events in order; remove the entry", entry)
		default:
			return nil, field.Errorf("Fields", "entry %q: placement %q is not header or envelope", entry, parts[1])
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// FieldsString writes fs back in ParseFields' syntax.
func FieldsString(fs []Field) string {
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = f.Column + ":" + string(f.Placement)
		if f.Alias != f.Column {
			parts[i] += ":" + f.Alias
		}
	}
	return strings.Join(parts, ",")
}

// A HeaderSet is the relay's own headers sent on every message, in the
// order id, event_type, aggregate_type. Its zero value is all three (the
// relay layout's default); Debezium sends only id.
type HeaderSet struct {
	set  bool
	mask uint8
}

const (
	hID uint8 = 1 << iota
	hEventType
	hAggregateType
)

// DefaultHeaders are the relay's own headers unless configured otherwise.
var DefaultHeaders = []string{HeaderID, HeaderEventType, HeaderAggregateType}

// NewHeaderSet returns the set of the given names; nil means
// DefaultHeaders, an empty non-nil slice none.
func NewHeaderSet(names []string) (HeaderSet, error) {
	if names == nil {
		return HeaderSet{}, nil
	}
	s := HeaderSet{set: true}
	for _, n := range names {
		switch n {
		case HeaderID:
			s.mask |= hID
		case HeaderEventType:
			s.mask |= hEventType
		case HeaderAggregateType:
			s.mask |= hAggregateType
		default:
			return HeaderSet{}, field.Errorf("Headers", "%q is not one of the relay's headers (%s); send other columns as headers with {Fields}", n, strings.Join(DefaultHeaders, ", "))
		}
	}
	return s, nil
}

func (s HeaderSet) has(bit uint8) bool { return !s.set || s.mask&bit != 0 }

// Names returns the set's header names in order.
func (s HeaderSet) Names() []string {
	names := make([]string, 0, 3)
	for i, bit := range []uint8{hID, hEventType, hAggregateType} {
		if s.has(bit) {
			names = append(names, DefaultHeaders[i])
		}
	}
	return names
}

// Reserved reports whether name is one of the set's headers, which no other
// header may duplicate or override.
func (s HeaderSet) Reserved(name string) bool {
	switch name {
	case HeaderID:
		return s.has(hID)
	case HeaderEventType:
		return s.has(hEventType)
	case HeaderAggregateType:
		return s.has(hAggregateType)
	}
	return false
}

// Build returns an event's Kafka headers: the set's own, then the entries of
// extra whose names are not the set's, in order; dropped counts those left
// out. The pipeline and the retry worker both build headers here, so an event
// carries the same headers whichever path delivers it.
func (s HeaderSet) Build(id, eventType, aggregateType []byte, extra []Header) (hs []Header, dropped int) {
	return s.appendTo(make([]Header, 0, 3+len(extra)), id, eventType, aggregateType, extra)
}

// appendTo is Build appending to hs, for the router's slab.
func (s HeaderSet) appendTo(hs []Header, id, eventType, aggregateType []byte, extra []Header) (_ []Header, dropped int) {
	if s.has(hID) {
		hs = append(hs, Header{Key: HeaderID, Value: id})
	}
	if s.has(hEventType) {
		hs = append(hs, Header{Key: HeaderEventType, Value: eventType})
	}
	if s.has(hAggregateType) {
		hs = append(hs, Header{Key: HeaderAggregateType, Value: aggregateType})
	}
	for _, h := range extra {
		if s.Reserved(h.Key) {
			dropped++
			continue
		}
		hs = append(hs, h)
	}
	return hs, dropped
}

// topicRegex is Debezium's route.topic.regex / route.topic.replacement: the
// aggregate type, when the whole of it matches, becomes the expanded
// replacement; otherwise it is the topic as it is (Kafka Connect's
// RegexRouter).
type topicRegex struct {
	re       *regexp.Regexp
	template string // in regexp.Expand's syntax
}

// compileTopicRegex compiles a Java regex and replacement as Debezium's
// RegexRouter takes them. Go's RE2 accepts Java's common syntax, including
// (?<name>...) groups; what it does not (lookaround, backreferences) is
// reported with the setting to change.
func compileTopicRegex(regex, replacement string) (topicRegex, error) {
	re, err := regexp.Compile(`^(?:` + regex + `)$`)
	if err != nil {
		return topicRegex{}, field.Errorf("TopicRegex", "%q: %v (the relay takes Java's syntax except lookaround and backreferences)", regex, err)
	}
	tmpl, err := javaReplacement(replacement, re)
	if err != nil {
		return topicRegex{}, field.Errorf("TopicReplacement", "%q: %v", replacement, err)
	}
	return topicRegex{re: re, template: tmpl}, nil
}

// javaReplacement turns a java.util.regex replacement ($1, ${name}, \$ and
// \\ escapes) into regexp.Expand's template ($$ for a dollar sign).
func javaReplacement(s string, re *regexp.Regexp) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '\\':
			i++
			if i == len(s) {
				return "", fmt.Errorf("ends with a lone backslash: write \\\\ for a backslash")
			}
			if s[i] == '$' {
				b.WriteString("$$")
			} else {
				b.WriteByte(s[i])
			}
		case '$':
			i++
			if i == len(s) {
				return "", fmt.Errorf("ends with a lone '$': write \\$ for a dollar sign")
			}
			if s[i] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return "", fmt.Errorf("has an unclosed ${")
				}
				name := s[i+1 : i+end]
				if re.SubexpIndex(name) < 0 {
					return "", fmt.Errorf("names group %q, which the regex does not have", name)
				}
				b.WriteString("${" + name + "}")
				i += end
				continue
			}
			if s[i] < '0' || s[i] > '9' {
				return "", fmt.Errorf("has '$' before %q: use $n or ${name}, or \\$ for a dollar sign", s[i])
			}
			// Java reads as many digits as still name a group.
			n := int(s[i] - '0')
			for i+1 < len(s) && s[i+1] >= '0' && s[i+1] <= '9' {
				next := n*10 + int(s[i+1]-'0')
				if next > re.NumSubexp() {
					break
				}
				n = next
				i++
			}
			if n > re.NumSubexp() {
				return "", fmt.Errorf("refers to group %d, but the regex has %d", n, re.NumSubexp())
			}
			b.WriteString("${" + strconv.Itoa(n) + "}")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// topic returns the topic for the aggregate type.
func (t *topicRegex) topic(aggregateType []byte) string {
	m := t.re.FindSubmatchIndex(aggregateType)
	if m == nil {
		return string(aggregateType)
	}
	return string(t.re.Expand(nil, []byte(t.template), aggregateType, m))
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
