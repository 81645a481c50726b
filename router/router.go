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
//
// The files follow the concepts: router.go routes a row (Route, Message and
// the errors), topic.go chooses the topic (template, overrides, Debezium's
// regex), columns.go finds the columns (the mapping, additional fields and
// what start-up checks compare with the catalog), headers.go builds the
// headers (the relay's own, the fields', the headers column's; jsonscan.go
// reads the headers column), trace.go and cloudevents.go the trace context and
// CloudEvents, message.go the content of a logical decoding message (routed
// as the row it stands for); config.go validates a Config. Package connect
// writes a column's value (key, value, header and envelope fields) as
// Debezium's Kafka Connect converters write it.
package router

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router/connect"
)

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

// A RouteError is a per-event failure: the event cannot be turned into a
// Kafka message. The pipeline hands it to the failure path (retry table); the
// rest of the stream goes on.
type RouteError struct {
	EventID string // "" when the id itself is missing
	// Code names the reason, stable across versions (see the Code
	// constants): it is stored with the retry row, so that the CLI can say
	// it in the operator's words, with the config keys, which a library
	// does not speak and whose renaming must not change stored text.
	Code   string
	Reason string // what is wrong and how to fix it, in plain words
	Err    error  // underlying error, if any
}

// The codes of a RouteError.
const (
	CodeAggregateTypeEmpty = "aggregate_type_empty"
	CodeAggregateIDEmpty   = "aggregate_id_empty"
	CodeEventIDEmpty       = "event_id_empty"
	CodeEventTypeEmpty     = "event_type_empty" // the topic template uses {event_type}
	CodePayloadNotHex      = "payload_not_hex"
	CodeTopicInvalid       = "topic_template_invalid"    // the template makes an illegal topic
	CodeTopicReplacement   = "topic_invalid_replacement" // the Debezium replacement makes an illegal topic
	CodeMessageNotObject   = "message_not_object"
	CodeMessageFieldKind   = "message_field_kind" // a field of a logical message's content is unreadable
)

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
	bases     map[uint32]BaseType // domain OID → its base type; see SetBaseTypes

	// Single-entry cache: one outbox table is the norm, and its Relation
	// pointer changes only on ALTER TABLE.
	rel *replication.Relation
	pos positions

	topics map[string]string // aggregate type → topic; only when the template ignores the event type

	msg *messageShape // what RouteMessage reads; built on its first call

	// Per-event allocations, shared: see strings and headers.
	interned map[string]string // aggregate and event types seen, which repeat
	scratch  []byte
	hdrs     []Header // the slab headers are carved from
	hdrsRows int      // bytes of the rows whose headers are carved from hdrs
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
	return r.route(row.Values, relName(row.Relation), pos)
}

// route routes the values of one row of name (quoted, for reasons) with its
// column positions (resolved without error).
func (r *Router) route(values [][]byte, name string, pos *positions) (Message, error) {
	if len(values) <= pos.max {
		return Message{}, &SchemaError{Table: name, Reason: fmt.Sprintf("the row has %d values but the table needs column %d: the row does not match its relation (a decoder bug; please report it)",
			len(values), pos.max+1)}
	}
	// m collects what could be read, so that a failed event can be stored
	// for retry with its fields (see RouteError).
	var m Message
	if pos.payload >= 0 {
		m.Value = values[pos.payload]
	}
	id := values[pos.id]
	m.ID, m.AggregateID = r.strings(id, values[pos.aggregateID])
	m.AggregateType = r.intern(values[pos.aggregateType])
	m.Key = values[pos.aggregateID]
	if r.converter == ConverterJSON && len(m.Key) > 0 { // an empty id stays empty, refused below
		m.Key = connect.AppendJSON(nil, pos.keyType, m.Key)
	}
	var eventType []byte // nil: no event type column (see UsesEventType)
	if pos.eventType >= 0 {
		eventType = values[pos.eventType]
	}
	m.Type = r.intern(eventType)
	r.fieldHeaders(&m, pos, values)
	if pos.headers >= 0 {
		r.extraHeaders(&m, values[pos.headers])
	}
	if pos.timestamp >= 0 {
		m.Time, _ = connect.ParseTimestamp(values[pos.timestamp], pos.timestampType == pgtype.TimestamptzOID)
	}
	if pos.trace >= 0 {
		r.traceHeaders(&m, values[pos.trace])
	}
	if r.spans {
		r.span(&m)
	}
	// The value and the CloudEvents attributes before the checks below: a
	// failed event is stored for retry with them (its value and extra
	// headers are what the retry worker sends), so that once its cause is
	// fixed it goes out as the same message.
	value := values[pos.payload]
	var valueErr *RouteError
	if pos.payloadBytea && value != nil {
		v, err := connect.DecodeBytea(value)
		if err != nil {
			valueErr = &RouteError{EventID: m.ID, Code: CodePayloadNotHex, Reason: fmt.Sprintf("the bytea payload (column %q) is not in hex format: set bytea_output = 'hex' for the replication role", r.cols.Payload), Err: err}
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
			m.Value = r.value(pos, value, values)
		default:
			m.Value = r.value(pos, value, values)
		}
	}
	eventID := m.ID
	aggType := values[pos.aggregateType]
	if len(aggType) == 0 {
		return m, &RouteError{EventID: eventID, Code: CodeAggregateTypeEmpty, Reason: fmt.Sprintf("the aggregate type (column %q) is NULL or empty, so the event has no topic: insert it with an aggregate type", r.cols.AggregateType)}
	}
	// The topic first: with the key it places a failed event in its
	// aggregate's lane, so that the aggregate's later events wait behind it.
	topic, code, reason := r.topic(aggType, eventType)
	if reason != "" {
		return m, &RouteError{EventID: eventID, Code: code, Reason: reason}
	}
	m.Topic = topic
	if len(id) == 0 {
		return m, &RouteError{Code: CodeEventIDEmpty, Reason: fmt.Sprintf("the event id (column %q) is NULL or empty: every event needs an id, its consumers' dedup key", r.cols.ID)}
	}
	aggID := values[pos.aggregateID]
	if len(aggID) == 0 {
		return m, &RouteError{EventID: eventID, Code: CodeAggregateIDEmpty, Reason: fmt.Sprintf("the aggregate id (column %q) is NULL or empty, so the event has no Kafka key and no order: insert it with an aggregate id", r.cols.AggregateID)}
	}

	if valueErr != nil {
		return m, valueErr
	}
	// Extra holds no reserved name (extraHeaders dropped them, and Config
	// gives fields no reserved alias): no need to filter as Build does.
	m.Headers = append(r.rt.headers.appendOwn(r.headerSlab(3+len(m.Extra), valuesSize(values)), id, eventType, aggType), m.Extra...)
	return m, nil
}

// value is the Kafka value: the payload (decoded from bytea already), in the
// converter's form, in an envelope when fields are placed there, or nil for
// a tombstone.
func (r *Router) value(pos *positions, payload []byte, row [][]byte) []byte {
	if r.tombstone && (payload == nil || len(bytes.TrimSpace(payload)) == 0) {
		return nil
	}
	json := r.converter == ConverterJSON
	if !json && !r.envelope {
		return payload // the common case: the payload's bytes as stored
	}
	raw := row[pos.payload] // the text form, as Debezium has it
	if !r.envelope {
		return connect.AppendJSON(nil, pos.payloadType, raw)
	}
	e := connect.NewEnvelope(json, pos.payloadType, raw)
	for i, f := range r.fields {
		if f.Placement == PlaceEnvelope {
			e.Add(f.Alias, pos.fields[i].typ, row[pos.fields[i].pos])
		}
	}
	return e.Bytes()
}

// valuesSize is the bytes of a row's values, which size its header slab.
func valuesSize(values [][]byte) int {
	n := 0
	for _, v := range values {
		n += len(v)
	}
	return n
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
//
// Header values point into their row's bytes (the id is a slice of the
// row's one allocation, payload included), and a shared array stays alive
// while any event carved from it does: so it is shared only by events of
// rows totalling at most slabRowBytes, and the headers of a row of size
// rowBytes larger than that get an array of their own. One event still
// held (in a Kafka write, on its way to the retry table) then pins at most
// slabRowBytes of other rows, never a large transaction's worth.
func (r *Router) headerSlab(n, rowBytes int) []Header {
	if rowBytes > slabRowBytes {
		return make([]Header, 0, n)
	}
	if n > cap(r.hdrs)-len(r.hdrs) || r.hdrsRows+rowBytes > slabRowBytes {
		r.hdrs = make([]Header, 0, max(n, 1024))
		r.hdrsRows = 0
	}
	r.hdrsRows += rowBytes
	start := len(r.hdrs)
	r.hdrs = r.hdrs[:start+n]
	return r.hdrs[start : start : start+n]
}

// slabRowBytes bounds the bytes of the rows whose events share an array of
// headers (headerSlab): ~300-byte events fill the 1024 headers first.
const slabRowBytes = 64 << 10
