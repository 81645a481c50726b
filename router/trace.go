package router

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/outbox-relay/outbox-relay/event"
)

// W3C Trace Context header names, as OpenTelemetry's Kafka instrumentations
// read them from a record's headers.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// traceHeaders sends the tracing span context column's trace context as the
// traceparent and tracestate headers, in place of entries of those names
// from the headers column: the column is the row's own record of its trace,
// as for Debezium. A NULL or empty column leaves the headers column's.
func (r *Router) traceHeaders(m *Message, text []byte) {
	if len(bytes.TrimSpace(text)) == 0 {
		return
	}
	tc, ok := parseSpanContext(text)
	if !ok {
		m.BadTrace = fmt.Sprintf("the tracing span context column %q holds no valid W3C traceparent (traceparent=00-<32 hex>-<16 hex>-<2 hex> in Java properties text): the event is delivered without it", r.cols.TracingSpanContext)
		return
	}
	if tc.parent == "" {
		return
	}
	m.Extra = slices.DeleteFunc(m.Extra, func(h Header) bool { return h.Key == HeaderTraceparent || h.Key == HeaderTracestate })
	m.Extra = append(m.Extra, Header{Key: HeaderTraceparent, Value: []byte(tc.parent)})
	if tc.state != "" {
		m.Extra = append(m.Extra, Header{Key: HeaderTracestate, Value: []byte(tc.state)})
	}
}

// span gives m a span of the relay's own when its extra headers carry a
// valid traceparent (from the tracing column or the headers column): a new
// span id in the same trace, parented by the row's span, and the traceparent
// header rewritten to name it, so that consumers' spans are children of the
// relay's, which is exported once Kafka acknowledges the event.
func (r *Router) span(m *Message) {
	for i, h := range m.Extra {
		if h.Key != HeaderTraceparent || !validTraceparent(string(h.Value)) {
			continue
		}
		s := &event.Span{}
		v := h.Value
		hex.Decode(s.TraceID[:], v[3:35])
		hex.Decode(s.Parent[:], v[36:52])
		var f [1]byte
		hex.Decode(f[:], v[53:55])
		s.Flags = f[0]
		for {
			binary.LittleEndian.PutUint64(s.SpanID[:], rand.Uint64())
			if s.SpanID != [8]byte{} {
				break
			}
		}
		for _, st := range m.Extra {
			if st.Key == HeaderTracestate {
				s.State = string(st.Value)
			}
		}
		tp := make([]byte, 0, 55)
		tp = append(tp, "00-"...)
		tp = hex.AppendEncode(tp, s.TraceID[:])
		tp = append(tp, '-')
		tp = hex.AppendEncode(tp, s.SpanID[:])
		tp = append(tp, '-')
		tp = hex.AppendEncode(tp, f[:])
		m.Extra[i].Value = tp
		m.Span = s
		return
	}
}

// traceContext is a row's trace context: a valid traceparent, and the
// tracestate that goes with it ("" when none).
type traceContext struct {
	parent, state string
}

// parseSpanContext reads the tracing span context column as Debezium's
// outbox router does: the text of a java.util.Properties (key=value lines),
// from which OpenTelemetry's propagator extracts traceparent and tracestate.
// A traceparent that is not valid W3C Trace Context gives ok false: the event
// is delivered without a trace context (a trace is not worth an event), and
// the caller counts it.
func parseSpanContext(text []byte) (tc traceContext, ok bool) {
	props := javaProperties(string(text))
	parent, found := props[HeaderTraceparent]
	if !found {
		// No trace context at all (an empty column): nothing to report.
		return traceContext{}, len(props) == 0
	}
	if !validTraceparent(parent) {
		return traceContext{}, false
	}
	tc.parent = parent
	if st := props[HeaderTracestate]; validTracestate(st) {
		tc.state = st
	}
	return tc, true
}

// validTraceparent checks a traceparent header value against W3C Trace
// Context: version-traceid-parentid-flags in lowercase hex, version not ff,
// trace id and parent id not all zeros. A later version may append fields
// after the flags ("-…"), which a reader of version 00 must accept.
func validTraceparent(s string) bool {
	if len(s) < 55 {
		return false
	}
	hex := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
		return true
	}
	zero := func(s string) bool { return strings.Trim(s, "0") == "" }
	version, traceID, parentID, flags := s[0:2], s[3:35], s[36:52], s[53:55]
	if s[2] != '-' || s[35] != '-' || s[52] != '-' || !hex(version) || !hex(traceID) || !hex(parentID) || !hex(flags) {
		return false
	}
	if version == "ff" || zero(traceID) || zero(parentID) {
		return false
	}
	if version == "00" {
		return len(s) == 55
	}
	return len(s) == 55 || s[55] == '-'
}

// validTracestate accepts a tracestate a Kafka header can carry as is: at
// most 512 characters of printable ASCII (W3C Trace Context lets a
// propagator drop a tracestate it cannot keep).
func validTracestate(s string) bool {
	if s == "" || len(s) > 512 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// javaProperties parses the text format of java.util.Properties.load: one
// key and value per logical line, separated by '=', ':' or white space;
// lines starting with '#' or '!' are comments; a backslash escapes the next
// character (\t, \n, \r, \f, \uXXXX, or the character itself), and at the end
// of a line joins the next one. The last value of a repeated key wins, as
// in Java.
func javaProperties(text string) map[string]string {
	props := map[string]string{}
	lines := strings.Split(strings.ReplaceAll(strings.ReplaceAll(text, "\r\n", "\n"), "\r", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimLeft(lines[i], " \t\f")
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		// Join continuation lines: an odd number of trailing backslashes.
		for trailingBackslashes(line)%2 == 1 && i+1 < len(lines) {
			i++
			line = line[:len(line)-1] + strings.TrimLeft(lines[i], " \t\f")
		}
		key, rest := splitProperty(line)
		props[unescapeProperty(key)] = unescapeProperty(rest)
	}
	return props
}

func trailingBackslashes(s string) int {
	n := 0
	for i := len(s) - 1; i >= 0 && s[i] == '\\'; i-- {
		n++
	}
	return n
}

// splitProperty splits a logical line into its key and the rest, as
// Properties.load: the key ends at the first unescaped '=', ':' or white
// space; white space and then one '=' or ':' after it are skipped.
func splitProperty(line string) (key, value string) {
	i := 0
	for i < len(line) {
		c := line[i]
		if c == '\\' {
			i += 2
			continue
		}
		if c == '=' || c == ':' || c == ' ' || c == '\t' || c == '\f' {
			break
		}
		i++
	}
	if i > len(line) {
		i = len(line)
	}
	key, rest := line[:i], line[i:]
	rest = strings.TrimLeft(rest, " \t\f")
	if rest != "" && (rest[0] == '=' || rest[0] == ':') {
		rest = strings.TrimLeft(rest[1:], " \t\f")
	}
	return key, rest
}

func unescapeProperty(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 't':
			b.WriteByte('\t')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 'f':
			b.WriteByte('\f')
		case 'u':
			if i+5 <= len(s) {
				if r, err := strconv.ParseUint(s[i+1:i+5], 16, 16); err == nil {
					b.WriteRune(rune(r))
					i += 4
					continue
				}
			}
			b.WriteByte('u')
		default:
			b.WriteByte(s[i])
		}
	}
	return b.String()
}
