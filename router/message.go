package router

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/replication"
)

// # The content of a logical decoding message
//
// A message outbox (pg_logical_emit_message(true, prefix, content)) carries
// in its content what a row carries in its columns: a JSON object whose keys
// are the configured column names (Columns: the layout's, so Debezium's
// message outbox, {"id", "aggregatetype", "aggregateid", "type",
// "payload"}, reads with the Debezium layout), and the columns of Fields
// under their names. RouteMessage turns it into the row it stands for and
// routes that row as Route does, so a message and a row with the same
// values make the same Kafka message. What each key may hold:
//
//   - id, aggregate id: a string, or a number (its JSON text);
//   - aggregate type, event type, tracing span context: a string;
//   - payload: any JSON value. A string is sent as its text (unescaped),
//     any other value as its JSON text as written; null or no payload is a
//     NULL payload;
//   - headers: as the headers column (a JSON object; anything else is
//     ignored with BadHeaders);
//   - timestamp: an RFC 3339 string;
//   - a field's column: a string is its text, any other value its JSON text.
//
// A missing key or JSON null is NULL. Content that is not a UTF-8 JSON
// object, a key the router reads given twice, or a value of a wrong type is
// a *RouteError: the event goes to the retry table, dead, with the reason
// (and the content as its value when it is not a JSON object), like a row
// that cannot be routed; nothing is guessed.

// JSON kinds a message's key may hold.
const (
	kindString = 1 << iota
	kindNumber
	kindOther // object, array, true, false
)

// A messageColumn is a key of the content and the column it stands for.
type messageColumn struct {
	name  string // the key: the column's name
	what  string // the field it holds, for reasons: never a config key (the CLI names them by the code)
	kinds int    // the kinds it may hold
	ts    bool   // an RFC 3339 time, written as Postgres's timestamptz text
}

// messageShape is what RouteMessage reads: the keys, and the columns a
// message's values are routed as (its payload a string: text; else json).
type messageShape struct {
	cols  []messageColumn
	index map[string]int
	text  rowColumns
	json  rowColumns
	pos   [2]positions // of text and json
}

// shape builds the message shape from the columns the router reads.
func (r *Router) shape() *messageShape {
	if r.msg != nil {
		return r.msg
	}
	c := r.cols
	anyKind := kindString | kindNumber | kindOther
	cols := []messageColumn{
		{name: c.ID, what: "field id", kinds: kindString | kindNumber},
		{name: c.AggregateType, what: "field aggregate_type", kinds: kindString},
		{name: c.AggregateID, what: "field aggregate_id", kinds: kindString | kindNumber},
		{name: c.Payload, what: "field payload", kinds: anyKind},
	}
	if c.EventType != NoHeaders {
		cols = append(cols, messageColumn{name: c.EventType, what: "field event_type", kinds: kindString})
	}
	if c.Headers != NoHeaders {
		cols = append(cols, messageColumn{name: c.Headers, what: "field headers", kinds: anyKind})
	}
	if c.Timestamp != "" {
		cols = append(cols, messageColumn{name: c.Timestamp, what: "field timestamp", kinds: kindString, ts: true})
	}
	if c.TracingSpanContext != "" {
		cols = append(cols, messageColumn{name: c.TracingSpanContext, what: "field tracing_span_context", kinds: kindString})
	}
	s := &messageShape{index: map[string]int{}}
	for _, col := range cols {
		s.index[col.name] = len(s.cols)
		s.cols = append(s.cols, col)
	}
	for _, f := range r.fields {
		if _, dup := s.index[f.Column]; !dup {
			s.index[f.Column] = len(s.cols)
			s.cols = append(s.cols, messageColumn{name: f.Column, what: "an extra field", kinds: anyKind})
		}
	}
	rel := func(payloadOID uint32) rowColumns {
		rel := rowColumns{name: strconv.Quote("logical decoding message")}
		for _, col := range s.cols {
			oid := uint32(pgtype.TextOID)
			switch {
			case col.name == c.Payload:
				oid = payloadOID
			case col.ts:
				oid = pgtype.TimestamptzOID
			}
			rel.cols = append(rel.cols, replication.Column{Name: col.name, TypeOID: oid, TypeMod: -1})
		}
		return rel
	}
	s.text, s.json = rel(pgtype.TextOID), rel(pgtype.JSONOID)
	s.pos = [2]positions{r.resolve(s.text), r.resolve(s.json)}
	r.msg = s
	return s
}

// RouteMessage turns the content of a logical decoding message into a
// Message, as Route turns a row (see the section above for the content). It
// has Route's contract: a *RouteError for an event that cannot be routed,
// the Message then holding what could be read.
func (r *Router) RouteMessage(content []byte) (Message, error) {
	s := r.shape()
	raw, problem := s.split(content)
	if problem != "" {
		// Nothing of it can be trusted: the content itself is kept, for
		// the operator to read in the retry table.
		return Message{Event: event.Event{Value: content}}, &RouteError{Code: CodeMessageNotObject, Reason: "the message content " + problem + ": emit a JSON object of the outbox fields"}
	}
	values := make([][]byte, len(s.cols))
	var problems []string
	jsonPayload := false
	for i, col := range s.cols {
		v := raw[i]
		if v == nil || string(v) == "null" {
			continue
		}
		kind := kindOther
		switch v[0] {
		case '"':
			kind = kindString
		case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			kind = kindNumber
		}
		if col.kinds&kind == 0 {
			problems = append(problems, fmt.Sprintf("%q (%s) is %s; want %s", col.name, col.what, kindName(kind), kindNames(col.kinds)))
			continue
		}
		if kind != kindString {
			values[i] = v // its JSON text
			jsonPayload = jsonPayload || col.name == r.cols.Payload
			continue
		}
		text, err := unquote(v)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%q (%s): %v", col.name, col.what, err))
			continue
		}
		if col.ts {
			t, err := time.Parse(time.RFC3339Nano, string(text))
			if err != nil {
				problems = append(problems, fmt.Sprintf("%q (%s) is not an RFC 3339 time: %v", col.name, col.what, err))
				continue
			}
			text = []byte(t.Format("2006-01-02 15:04:05.999999Z07:00"))
		}
		values[i] = text
	}
	rel, pos := s.text, &s.pos[0]
	if jsonPayload {
		rel, pos = s.json, &s.pos[1]
	}
	var m Message
	var err error
	if pos.err != nil {
		err = pos.err // a typed nil must not become a non-nil error
	} else {
		m, err = r.route(values, rel.name, pos)
	}
	if len(problems) > 0 {
		m.Headers = nil
		return m, &RouteError{EventID: m.ID, Code: CodeMessageFieldKind, Reason: "the message content has " + strings.Join(problems, "; ")}
	}
	return m, err
}

// split reads content as a JSON object and returns the raw JSON value of
// each of the shape's keys (nil when missing), or what is wrong with it.
func (s *messageShape) split(content []byte) ([][]byte, string) {
	if !utf8.Valid(content) {
		return nil, "is not valid UTF-8 (JSON is UTF-8)"
	}
	if !json.Valid(content) {
		return nil, "is not valid JSON"
	}
	i := skipSpace(content, 0)
	if content[i] != '{' {
		return nil, "is JSON but " + kindName(jsonKind(content[i])) + ", not an object"
	}
	raw := make([][]byte, len(s.cols))
	i = skipSpace(content, i+1)
	if content[i] == '}' {
		return raw, ""
	}
	for {
		end := stringEnd(content, i)
		key, err := unquote(content[i:end])
		if err != nil {
			return nil, "has a key that cannot be read: " + err.Error()
		}
		i = skipSpace(content, end)
		i = skipSpace(content, i+1) // ':'
		end = valueEnd(content, i)
		if k, ok := s.index[string(key)]; ok {
			if raw[k] != nil {
				// Which one is meant cannot be told, and an event's
				// identity must not depend on a parser's choice.
				return nil, fmt.Sprintf("has the key %q twice", key)
			}
			raw[k] = content[i:end]
		}
		i = skipSpace(content, end)
		if content[i] == '}' {
			return raw, ""
		}
		i = skipSpace(content, i+1) // ','
	}
}

func jsonKind(c byte) int {
	switch c {
	case '"':
		return kindString
	case '{', '[', 't', 'f', 'n':
		return kindOther
	}
	return kindNumber
}

func kindName(k int) string {
	switch k {
	case kindString:
		return "a string"
	case kindNumber:
		return "a number"
	}
	return "an object, an array or a boolean"
}

func kindNames(ks int) string {
	var names []string
	for _, k := range []int{kindString, kindNumber, kindOther} {
		if ks&k != 0 {
			names = append(names, kindName(k))
		}
	}
	return strings.Join(names, " or ")
}
