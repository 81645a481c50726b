// Package router turns outbox rows into Kafka messages: topic from the
// aggregate type, key from the aggregate id, value from the payload, headers
// from the event id, event type, aggregate type and the headers column.
//
// The router does no I/O and is deterministic: the same row and Config always
// give the same Message. Invariants:
//
//   - The value is the payload exactly as stored (json, jsonb and text columns as
//     their text, bytea decoded from pgoutput's hex text). It is never decoded
//     and re-encoded as JSON, and it shares its bytes with the Row (no copy),
//     except for bytea, which has to be decoded. The key and the id,
//     event_type and aggregate_type header values share the Row's bytes too: the
//     Row must not be modified while its Message is in use.
//   - A NULL payload gives a nil value (a Kafka null value, tombstone-like), as
//     Debezium's outbox router does.
//   - A row that cannot be routed (a NULL or empty id, aggregate type or
//     aggregate id, an illegal topic name) gives a *RouteError saying what is
//     wrong and how to fix it; it never panics and never guesses a topic.
//   - A table that no longer has a mapped column (dropped, renamed) gives a
//     *SchemaError: no row of that table can be delivered whole, so the caller
//     must stop before confirming it, rather than store empty events.
//   - The event's identity and the relay's own headers (id, event_type,
//     aggregate_type) come from their columns only. The headers column can
//     add headers but never duplicate or override those: an entry with one of
//     their names is dropped and counted (Message.DroppedHeaders). A headers
//     value that is not a JSON object does not stop delivery either: the
//     event goes without extra headers and Message.BadHeaders says why.
//   - Kafka topic names are checked against Kafka's rules (ASCII letters,
//     digits, '.', '_', '-'; 1 to 249 characters; not "." or "..") before a
//     Message is returned.
//
// A Router caches column positions per *replication.Relation (a new Relation
// value arrives after ALTER TABLE, so the cache follows schema changes) and
// topics per aggregate type. It is therefore not safe for concurrent use: use
// one Router per goroutine (New is cheap).
package router

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/replication"
)

// A Header is a Kafka record header: the envelope's.
type Header = event.Header

// A Message is a routed outbox event: the envelope (without its place in the
// WAL, which the caller knows), and what the router left out of its headers.
type Message struct {
	event.Event

	// DroppedHeaders counts the headers column's entries dropped because
	// they used a name the relay sets.
	DroppedHeaders int
	// BadHeaders, when not empty, says why the headers column's value was
	// ignored (not a JSON object); the event is delivered without it.
	BadHeaders string
	// BadTrace, when not empty, says why the tracing span context column's
	// value was ignored (no valid W3C traceparent in it); the event is
	// delivered without a trace context.
	BadTrace string
}

// Header names set on every message; the names Debezium's outbox router uses
// for the event id, so consumers' dedup logic carries over.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
)

// A RouteError is a per-event failure: the event cannot be turned into a
// Kafka message. The pipeline hands it to the failure path (retry table); the
// rest of the stream goes on.
type RouteError struct {
	EventID string // "" when the id itself is missing
	Reason  string // what is wrong and how to fix it, in plain words
	Err     error  // underlying error, if any
}

func (e *RouteError) Error() string {
	id := e.EventID
	if id == "" {
		id = "(no id)"
	}
	if e.Err != nil {
		return fmt.Sprintf("route event %s: %s: %v", id, e.Reason, e.Err)
	}
	return fmt.Sprintf("route event %s: %s", id, e.Reason)
}

func (e *RouteError) Unwrap() error { return e.Err }

// A SchemaError says that the outbox table, as the WAL now describes it, no
// longer fits the configured columns (a mapped column was dropped, renamed,
// or the row does not match its relation). Every later event of the table
// would be incomplete, so it is not a per-event failure: the caller stops
// before confirming the event, and the operator fixes the table or the
// config and restarts.
type SchemaError struct {
	Table  string // as schema.table
	Column string // the missing column, "" when the row itself is malformed
	Reason string // what is wrong and how to fix it
}

func (e *SchemaError) Error() string { return "outbox table " + e.Table + " changed: " + e.Reason }

// byteaOID is the type OID of bytea, whose pgoutput text form is hex.
const byteaOID = 17

// maxTopicCache bounds the per-aggregate-type topic cache; past it the cache
// starts over, so a flood of distinct aggregate types cannot grow memory.
const maxTopicCache = 4096

// A Router routes rows. See the package doc for its invariants and
// concurrency rules.
type Router struct {
	cols      Columns
	tmpl      template
	rt        routing
	fields    []Field
	envelope  bool // a field is placed in the envelope
	converter Converter
	tombstone bool
	overrides map[string]string
	ce        ceRouting
	spans     bool

	// Single-entry cache: one outbox table is the norm, and its Relation
	// pointer changes only on ALTER TABLE.
	rel *replication.Relation
	pos positions

	topics map[string]string // aggregate type → topic; only when the template ignores the event type

	// Per-event allocations, shared: see strings and headers.
	interned map[string]string // aggregate and event types seen, which repeat
	scratch  []byte
	hdrs     []Header // the slab headers are carved from
}

// maxInterned bounds the interned aggregate and event types; past it the
// table starts over, so a flood of distinct values cannot grow memory.
const maxInterned = 4096

// intern returns b as a string, shared with earlier events of the same
// value: aggregate and event types take a handful of values, and a string
// per event for them was a good part of the relay's allocations.
func (r *Router) intern(b []byte) string {
	if s, ok := r.interned[string(b)]; ok { // no allocation for the lookup
		return s
	}
	if r.interned == nil || len(r.interned) >= maxInterned {
		r.interned = make(map[string]string)
	}
	s := string(b)
	r.interned[s] = s
	return s
}

// strings returns a and b as strings made with one allocation (an event's
// id and aggregate id, which are distinct per event).
func (r *Router) strings(a, b []byte) (string, string) {
	r.scratch = append(append(r.scratch[:0], a...), b...)
	s := string(r.scratch)
	if cap(r.scratch) > 4096 {
		r.scratch = nil // a huge id is not kept for the next event
	}
	return s[:len(a)], s[len(a):]
}

// headerSlab returns an empty slice with room for n headers, carved from a
// shared array so that an event's headers cost no allocation of their own.
// Its capacity is clipped: appending beyond n cannot reach a neighbour's.
func (r *Router) headerSlab(n int) []Header {
	if n > cap(r.hdrs)-len(r.hdrs) {
		r.hdrs = make([]Header, 0, max(n, 1024))
	}
	start := len(r.hdrs)
	r.hdrs = r.hdrs[:start+n]
	return r.hdrs[start : start : start+n]
}

type positions struct {
	id, aggregateType, aggregateID, eventType, payload, headers int // headers -1: none
	timestamp                                                   int // -1: none
	trace                                                       int // the tracing span context column; -1: none
	payloadBytea                                                bool
	payloadType, keyType                                        colType
	timestampType                                               uint32
	fields                                                      []fieldPos // as Router.fields
	max                                                         int        // highest position used
	err                                                         *SchemaError
}

// fieldPos is where an additional field's column is, and its type.
type fieldPos struct {
	pos int
	typ colType
}

// New validates cfg, fills its defaults and returns a Router. A bad template
// or override is reported with the setting to change.
func New(cfg Config) (*Router, error) {
	rt, err := cfg.validate()
	if err != nil {
		return nil, fmt.Errorf("router config: %w", err)
	}
	tmpl := rt.tmpl
	overrides := make(map[string]string, len(cfg.Overrides))
	for k, v := range cfg.Overrides {
		overrides[k] = v
	}
	r := &Router{cols: cfg.Columns, tmpl: tmpl, rt: rt, overrides: overrides,
		fields: slices.Clone(cfg.Fields), converter: cfg.Converter, tombstone: cfg.TombstoneOnEmptyPayload,
		ce:    ceRouting{mode: cfg.CloudEvents.Mode, source: cfg.CloudEvents.Source, contentType: cfg.CloudEvents.ContentType},
		spans: cfg.Spans}
	for _, f := range r.fields {
		r.envelope = r.envelope || f.Placement == PlaceEnvelope
	}
	if r.cols.EventType == NoHeaders && r.UsesEventType() {
		what := "{Headers} includes " + HeaderEventType
		if !r.rt.headers.has(hEventType) {
			what = fmt.Sprintf("{Topic} %q uses {event_type}", cfg.Topic)
		}
		return nil, field.Errorf("Columns.EventType", "%q (no event type column) but %s: map the column, or stop using the event type", NoHeaders, what)
	}
	if !tmpl.useEventType || rt.regex != nil {
		r.topics = make(map[string]string)
	}
	return r, nil
}

// Headers returns the relay's own headers the Router sends: the retry
// worker sends the same.
func (r *Router) Headers() HeaderSet { return r.rt.headers }

// Topic returns the topic for an event of the given aggregate and event type:
// the override for aggregateType if there is one, else the expanded template.
// The error, a *RouteError, says why the result would not be a legal topic.
func (r *Router) Topic(aggregateType, eventType string) (string, error) {
	if aggregateType == "" {
		return "", &RouteError{Reason: "the aggregate type is empty, so the event has no topic"}
	}
	topic, reason := r.topic([]byte(aggregateType), []byte(eventType))
	if reason != "" {
		return "", &RouteError{Reason: reason}
	}
	return topic, nil
}

// topic returns the topic or the reason it cannot route. It takes bytes so
// that the hot path can look up the caches without allocating.
func (r *Router) topic(aggregateType, eventType []byte) (string, string) {
	if len(r.overrides) > 0 {
		if t, ok := r.overrides[string(aggregateType)]; ok {
			return t, ""
		}
	}
	if r.rt.regex == nil && r.tmpl.constant {
		return r.tmpl.parts[0].lit, ""
	}
	if r.topics != nil {
		if t, ok := r.topics[string(aggregateType)]; ok {
			return t, ""
		}
	}
	if r.rt.regex != nil {
		topic := r.rt.regex.topic(aggregateType)
		if why := invalidTopic(topic); why != "" {
			return "", fmt.Sprintf("topic %q for aggregate type %q %s; add an override in %s or change %s", topic, aggregateType, why, keyOverrides, keyTopicReplacement)
		}
		r.cacheTopic(aggregateType, topic)
		return topic, ""
	}
	if r.tmpl.useEventType && len(eventType) == 0 {
		return "", fmt.Sprintf("the event type is NULL or empty but %s %q uses {event_type}: insert the event with an event type, or add an override in %s for aggregate type %q",
			keyTopic, r.tmplString(), keyOverrides, aggregateType)
	}
	n := 0
	for _, p := range r.tmpl.parts {
		switch p.placeholder {
		case literal:
			n += len(p.lit)
		case aggregateTypeP:
			n += len(aggregateType)
		case eventTypeP:
			n += len(eventType)
		}
	}
	b := make([]byte, 0, n)
	for _, p := range r.tmpl.parts {
		switch p.placeholder {
		case literal:
			b = append(b, p.lit...)
		case aggregateTypeP:
			b = append(b, aggregateType...)
		case eventTypeP:
			b = append(b, eventType...)
		}
	}
	topic := string(b)
	if why := invalidTopic(topic); why != "" {
		return "", fmt.Sprintf("topic %q for aggregate type %q %s; add an override in %s or change %s", topic, aggregateType, why, keyOverrides, keyTopic)
	}
	r.cacheTopic(aggregateType, topic)
	return topic, ""
}

func (r *Router) cacheTopic(aggregateType []byte, topic string) {
	if r.topics == nil {
		return
	}
	if len(r.topics) >= maxTopicCache {
		clear(r.topics)
	}
	r.topics[string(aggregateType)] = topic
}

func (r *Router) tmplString() string {
	var s string
	for _, p := range r.tmpl.parts {
		switch p.placeholder {
		case literal:
			s += p.lit
		case aggregateTypeP:
			s += "{aggregate_type}"
		case eventTypeP:
			s += "{event_type}"
		}
	}
	return s
}

// Route turns an inserted outbox row into a Message. A row that cannot be
// routed gives a *RouteError; the Message is then the zero value.
//
// On a *RouteError the returned Message still carries the fields that could
// be read (ID, AggregateType, AggregateID, Type, Key, Value as
// stored, Extra, and Topic whenever it could be chosen, even when the id or
// the aggregate id is missing), so the failure path can store the event for
// retry in its aggregate's place; Headers is then nil.
func (r *Router) Route(row replication.Row) (Message, error) {
	pos := r.positions(row.Relation)
	if pos.err != nil {
		return Message{}, pos.err
	}
	if len(row.Values) <= pos.max {
		return Message{}, &SchemaError{Table: relName(row.Relation), Reason: fmt.Sprintf("the row has %d values but the table needs column %d: the row does not match its relation (a decoder bug; please report it)",
			len(row.Values), pos.max+1)}
	}
	// m collects what could be read, so that a failed event can be stored
	// for retry with its fields (see RouteError).
	var m Message
	if pos.payload >= 0 {
		m.Value = row.Values[pos.payload]
	}
	id := row.Values[pos.id]
	m.ID, m.AggregateID = r.strings(id, row.Values[pos.aggregateID])
	m.AggregateType = r.intern(row.Values[pos.aggregateType])
	m.Key = r.key(pos, row.Values[pos.aggregateID])
	var eventType []byte // nil: no event type column (see UsesEventType)
	if pos.eventType >= 0 {
		eventType = row.Values[pos.eventType]
	}
	m.Type = r.intern(eventType)
	r.fieldHeaders(&m, pos, row.Values)
	if pos.headers >= 0 {
		r.extraHeaders(&m, row.Values[pos.headers])
	}
	if pos.timestamp >= 0 {
		m.Time, _ = parseTimestamp(row.Values[pos.timestamp], pos.timestampType == timestamptzOID)
	}
	if pos.trace >= 0 {
		r.traceHeaders(&m, row.Values[pos.trace])
	}
	if r.spans {
		r.span(&m)
	}
	// The value and the CloudEvents attributes before the checks below: a
	// failed event is stored for retry with them (its value and extra
	// headers are what the retry worker sends), so that once its cause is
	// fixed it goes out as the same message.
	value := row.Values[pos.payload]
	var valueErr *RouteError
	if pos.payloadBytea && value != nil {
		v, err := decodeBytea(value)
		if err != nil {
			valueErr = &RouteError{EventID: m.ID, Reason: fmt.Sprintf("the bytea payload (column %q) is not in hex format: set bytea_output = 'hex' for the replication role", r.cols.Payload), Err: err}
		} else {
			value = v
		}
	}
	if valueErr == nil {
		switch r.ce.mode {
		case CloudEventsStructured:
			m.Value = r.ceStructured(&m, pos, r.ceAttrs(&m, pos), value)
		case CloudEventsBinary:
			r.ceBinaryHeaders(&m, r.ceAttrs(&m, pos))
			m.Value = r.value(pos, value, row.Values)
		default:
			m.Value = r.value(pos, value, row.Values)
		}
	}
	eventID := m.ID
	aggType := row.Values[pos.aggregateType]
	if len(aggType) == 0 {
		return m, &RouteError{EventID: eventID, Reason: fmt.Sprintf("the aggregate type (column %q) is NULL or empty, so the event has no topic: insert it with an aggregate type", r.cols.AggregateType)}
	}
	// The topic first: with the key it places a failed event in its
	// aggregate's lane, so that the aggregate's later events wait behind it.
	topic, reason := r.topic(aggType, eventType)
	if reason != "" {
		return m, &RouteError{EventID: eventID, Reason: reason}
	}
	m.Topic = topic
	if len(id) == 0 {
		return m, &RouteError{Reason: fmt.Sprintf("the event id (column %q) is NULL or empty: every event needs an id, its consumers' dedup key", r.cols.ID)}
	}
	aggID := row.Values[pos.aggregateID]
	if len(aggID) == 0 {
		return m, &RouteError{EventID: eventID, Reason: fmt.Sprintf("the aggregate id (column %q) is NULL or empty, so the event has no Kafka key and no order: insert it with an aggregate id", r.cols.AggregateID)}
	}

	if valueErr != nil {
		return m, valueErr
	}
	m.Headers, _ = r.rt.headers.appendTo(r.headerSlab(3+len(m.Extra)), id, eventType, aggType, m.Extra) // Extra holds no reserved name
	return m, nil
}

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

// fieldHeaders appends the header fields to m.Extra, in their order, as
// Debezium's router adds them after id. A NULL column gives a header with a
// null value, as Debezium's does.
func (r *Router) fieldHeaders(m *Message, pos *positions, row [][]byte) {
	for i, f := range r.fields {
		if f.Placement != PlaceHeader {
			continue
		}
		v := row[pos.fields[i].pos]
		if v != nil {
			v = headerText(pos.fields[i].typ, v)
		}
		m.Extra = append(m.Extra, Header{Key: f.Alias, Value: v})
	}
}

// extraHeaders reads the headers column into m.Extra, leaving out reserved
// names (counted in m.DroppedHeaders). A value that is not a JSON object is
// ignored with m.BadHeaders saying why: an optional header is not worth an
// event.
func (r *Router) extraHeaders(m *Message, b []byte) {
	if b == nil || string(b) == "null" { // SQL NULL, or JSON null: no extra headers
		return
	}
	n := len(m.Extra) // the header fields come first
	hs, err := appendJSONHeaders(slices.Grow(m.Extra, estimateHeaders(b)), b)
	if err != nil {
		m.Extra = m.Extra[:n]
		m.BadHeaders = fmt.Sprintf("the headers column %q is not a JSON object of header names to values (%v): the event is delivered without its extra headers", r.cols.Headers, err)
		return
	}
	kept := slices.DeleteFunc(hs[n:], func(h Header) bool { return r.rt.reserved[h.Key] })
	m.DroppedHeaders = len(hs) - n - len(kept)
	m.Extra = hs[:n+len(kept)]
}

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

// positions returns the cached column positions for rel, resolving them on
// the first row of a new Relation value.
func (r *Router) positions(rel *replication.Relation) *positions {
	if rel != nil && rel == r.rel {
		return &r.pos
	}
	r.pos = r.resolve(rel)
	r.rel = rel
	return &r.pos
}

func (r *Router) resolve(rel *replication.Relation) positions {
	if rel == nil {
		return positions{err: &SchemaError{Reason: "the row has no relation (a decoder bug; please report it)"}}
	}
	find := func(name, key string) (int, *SchemaError) {
		for i, c := range rel.Columns {
			if c.Name == name {
				return i, nil
			}
		}
		reason := fmt.Sprintf("it has no column %q (dropped or renamed while the relay ran): restore the column, or set %s%s to its new name", name, keyColumns, key)
		if key == "headers" {
			reason += fmt.Sprintf(" (or to %q to send no extra headers)", NoHeaders)
		}
		reason += ", then restart the relay; no event from this change on was confirmed, so none is lost"
		return -1, &SchemaError{Table: relName(rel), Column: name, Reason: reason}
	}
	var p positions
	var err *SchemaError
	cols := []struct {
		dst       *int
		name, key string
	}{
		{&p.id, r.cols.ID, "id"},
		{&p.aggregateType, r.cols.AggregateType, "aggregate_type"},
		{&p.aggregateID, r.cols.AggregateID, "aggregate_id"},
		{&p.eventType, r.cols.EventType, "event_type"},
		{&p.payload, r.cols.Payload, "payload"},
		{&p.headers, r.cols.Headers, "headers"},
		{&p.timestamp, r.cols.Timestamp, "timestamp"},
		{&p.trace, r.cols.TracingSpanContext, "tracing_span_context"},
	}
	for _, c := range cols {
		if c.name == NoHeaders || (c.key == "timestamp" || c.key == "tracing_span_context") && c.name == "" {
			*c.dst = -1
			continue
		}
		if *c.dst, err = find(c.name, c.key); err != nil {
			if c.key == "event_type" && !r.UsesEventType() {
				// Read only when something uses it, as Debezium does.
				*c.dst = -1
				continue
			}
			return positions{err: err}
		}
		p.max = max(p.max, *c.dst)
	}
	p.payloadType = colTypeOf(rel.Columns[p.payload])
	p.payloadBytea = p.payloadType.oid == byteaOID
	p.keyType = colTypeOf(rel.Columns[p.aggregateID])
	if p.timestamp >= 0 {
		p.timestampType = rel.Columns[p.timestamp].TypeOID
	}
	for _, f := range r.fields {
		i, err := find(f.Column, "")
		if err != nil {
			err.Reason = fmt.Sprintf("it has no column %q, which %s places as %s %q (dropped or renamed while the relay ran): restore the column or change %s, then restart the relay; no event from this change on was confirmed, so none is lost",
				f.Column, keyFields, f.Placement, f.Alias, keyFields)
			return positions{err: err}
		}
		p.fields = append(p.fields, fieldPos{pos: i, typ: colTypeOf(rel.Columns[i])})
		p.max = max(p.max, i)
	}
	return p
}

func relName(rel *replication.Relation) string {
	if rel.Namespace == "" {
		return strconv.Quote(rel.Name)
	}
	return strconv.Quote(rel.Namespace + "." + rel.Name)
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

// estimateHeaders guesses the number of entries in a headers object from its
// colons, so that the Headers slice is allocated once. Colons inside strings
// only make the guess too high, which is harmless.
func estimateHeaders(b []byte) int {
	n := 0
	for _, c := range b {
		if c == ':' {
			n++
		}
	}
	return n
}

// appendJSONHeaders appends the entries of the JSON object b in stored order:
// strings as their unescaped text, other values as their JSON text, nulls
// skipped. Values share b's bytes where no unescaping is needed.
func appendJSONHeaders(dst []Header, b []byte) ([]Header, error) {
	if !json.Valid(b) {
		return dst, errors.New("not valid JSON")
	}
	// b is valid JSON from here on, so the scanner below need not re-check it.
	i := skipSpace(b, 0)
	if b[i] != '{' {
		return dst, errors.New("not a JSON object")
	}
	i = skipSpace(b, i+1)
	if b[i] == '}' {
		return dst, nil
	}
	for {
		end := stringEnd(b, i)
		key, err := unquote(b[i:end])
		if err != nil {
			return dst, err
		}
		i = skipSpace(b, end)
		i = skipSpace(b, i+1) // ':'
		end = valueEnd(b, i)
		raw := b[i:end]
		switch raw[0] {
		case 'n': // null: no header
		case '"':
			v, err := unquote(raw)
			if err != nil {
				return dst, err
			}
			dst = append(dst, Header{Key: string(key), Value: v})
		default:
			dst = append(dst, Header{Key: string(key), Value: raw})
		}
		i = skipSpace(b, end)
		if b[i] == '}' {
			return dst, nil
		}
		i = skipSpace(b, i+1) // ','
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at b[i].
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

// valueEnd returns the index just past the JSON value starting at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	default: // number, true, false, null
		j := i
		for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
			j++
		}
		return j
	}
}

// unquote returns the contents of the JSON string s, sharing s's bytes when it
// has no escapes.
func unquote(s []byte) ([]byte, error) {
	inner := s[1 : len(s)-1]
	for _, c := range inner {
		if c == '\\' {
			var out string
			if err := json.Unmarshal(s, &out); err != nil {
				return nil, fmt.Errorf("decode header string: %w", err)
			}
			return []byte(out), nil
		}
	}
	return inner, nil
}

func colTypeOf(c replication.Column) colType { return colType{oid: c.TypeOID, mod: c.TypeMod} }
