package router

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/router/connect"
)

// # CloudEvents
//
// With Config.CloudEvents set, every message is a CloudEvent 1.0 in the
// Kafka protocol binding (github.com/cloudevents/spec, kafka-protocol-binding.md):
//
//   - binary mode: the payload is the record's value (the event's data), the
//     attributes are headers ce_<name>, and datacontenttype is the
//     content-type header;
//   - structured mode: the value is the event as JSON (the JSON event
//     format), data inside it, and content-type is
//     application/cloudevents+json; charset=UTF-8.
//
// The attributes come from the row: id from the id column, type from the
// event type column, subject and the partitionkey extension from the
// aggregate id (the record's key, as the binding requires), time from the
// timestamp column when one is mapped, source from the configuration, and the
// traceparent and tracestate extensions (Distributed Tracing) from the row's
// trace context. Attributes ride in the event's extra headers (binary) or its
// value (structured), both of which the retry table stores, so a retried
// event is the same CloudEvent.

// CloudEventsMode is how a CloudEvent is written to a Kafka record.
type CloudEventsMode string

// The modes of the Kafka protocol binding.
const (
	CloudEventsBinary     CloudEventsMode = "binary"
	CloudEventsStructured CloudEventsMode = "structured"
)

// CloudEvents configures CloudEvents output; the zero value is off.
type CloudEvents struct {
	Mode CloudEventsMode // "" off
	// Source is the source attribute: a URI-reference naming the context
	// the events come from (e.g. /orders-service/outbox). Required with a
	// mode.
	Source string
	// ContentType is the datacontenttype attribute. Empty derives it from
	// the payload column's type: application/json for json and jsonb,
	// application/octet-stream for bytea, text/plain; charset=utf-8 for text.
	ContentType string
}

// The headers of the binary mode, and the content type of the structured one.
const (
	ceSpecVersion       = "1.0"
	HeaderContentType   = "content-type"
	ceStructuredContent = "application/cloudevents+json; charset=UTF-8"
)

// ceNames are the context attributes the relay writes after specversion, in
// the structured mode's order, with their binary mode's header names: the
// one list both modes write from.
var ceNames = [...]struct{ attr, header string }{
	{"id", "ce_id"}, {"source", "ce_source"}, {"type", "ce_type"}, {"subject", "ce_subject"}, {"time", "ce_time"},
	{"datacontenttype", HeaderContentType}, {"partitionkey", "ce_partitionkey"},
	{"traceparent", "ce_traceparent"}, {"tracestate", "ce_tracestate"},
}

// ceContentTypeAttr is the index of datacontenttype in ceNames: the binary
// mode writes it last, as the content-type header.
const ceContentTypeAttr = 5

// ceHeaders are the header names the relay sets in binary mode: an entry of
// the headers column with one of these names is dropped (counted as dropped
// headers), so that the attributes are the row's.
var ceHeaders = func() []string {
	hs := []string{"ce_specversion"}
	for _, n := range ceNames {
		hs = append(hs, n.header)
	}
	return hs
}()

// validateCloudEvents checks the CloudEvents settings against the rest of
// the message settings, and reserves the header names the mode sets.
func (c *Config) validateCloudEvents(rt *routing) error {
	ce := &c.CloudEvents
	switch ce.Mode {
	case "":
		if ce.Source != "" || ce.ContentType != "" {
			return field.Errorf("CloudEvents.Source", "{CloudEvents.Source} or {CloudEvents.ContentType} is set but {CloudEvents.Mode} is not: set the mode, or remove them")
		}
		return nil
	case CloudEventsBinary, CloudEventsStructured:
	default:
		return field.Errorf("CloudEvents.Mode", "%q: use %q (attributes in ce_* headers, the payload as the value) or %q (the whole event as JSON in the value)", ce.Mode, CloudEventsBinary, CloudEventsStructured)
	}
	if strings.TrimSpace(ce.Source) == "" {
		return field.Required("CloudEvents.Source", "CloudEvents need a source attribute, a URI-reference naming where the events come from (e.g. /orders-service/outbox)")
	}
	if c.Converter == ConverterJSON {
		return field.Errorf("Converter", "%s and CloudEvents do not go together: CloudEvents define the value themselves; use %s", ConverterJSON, ConverterString)
	}
	for _, f := range c.Fields {
		if f.Placement == PlaceEnvelope {
			return field.Errorf("Fields", "places %s in the envelope, which a CloudEvent does not have: place it as a header instead (%s:header:%s)", f.Column, f.Column, f.Alias)
		}
	}
	if ce.Mode == CloudEventsStructured && c.TombstoneOnEmptyPayload {
		return field.Errorf("TombstoneOnEmptyPayload", "tombstones and {CloudEvents.Mode} %s do not go together: a structured CloudEvent is the record's value, which a tombstone removes; use %s or no tombstones", CloudEventsStructured, CloudEventsBinary)
	}
	if c.Columns.EventType == NoHeaders {
		return field.Errorf("Columns.EventType", "%q, but a CloudEvent needs the event type column (its required type attribute): map it to a column", NoHeaders)
	}
	if ce.Mode == CloudEventsBinary {
		for _, n := range ceHeaders {
			rt.reserved[n] = true
		}
	} else {
		rt.reserved[HeaderContentType] = true
	}
	return nil
}

// ceRouting is what the router keeps of the CloudEvents settings.
type ceRouting struct {
	mode        CloudEventsMode
	source      string
	contentType string // "" derives it from the payload column
}

// ceContentType is the datacontenttype of an event whose payload column has
// type t.
func (r *Router) ceContentType(t connect.Type) string {
	if r.ce.contentType != "" {
		return r.ce.contentType
	}
	switch t.OID {
	case pgtype.JSONOID, pgtype.JSONBOID:
		return "application/json"
	case pgtype.ByteaOID:
		return "application/octet-stream"
	}
	return "text/plain; charset=utf-8"
}

// ceAttributes are an event's context attributes, in the order the
// structured mode writes them.
type ceAttributes struct {
	id, typ, subject, time, contentType, traceparent, tracestate string
}

// ceAttrs reads the attributes of m, whose extra headers already hold its
// trace context, if any.
func (r *Router) ceAttrs(m *Message, pos *positions) ceAttributes {
	a := ceAttributes{id: m.ID, typ: m.Type, subject: m.AggregateID, contentType: r.ceContentType(pos.payloadType)}
	if !m.Time.IsZero() {
		a.time = m.Time.UTC().Format(time.RFC3339Nano)
	}
	for _, h := range m.Extra {
		switch h.Key {
		case HeaderTraceparent:
			if validTraceparent(string(h.Value)) {
				a.traceparent = string(h.Value)
			}
		case HeaderTracestate:
			a.tracestate = string(h.Value)
		}
	}
	if a.traceparent == "" || !validTracestate(a.tracestate) {
		a.tracestate = ""
	}
	return a
}

// values returns the attributes' values in ceNames' order; "" leaves one out.
func (a ceAttributes) values(source string) [len(ceNames)]string {
	return [...]string{a.id, source, a.typ, a.subject, a.time, a.contentType, a.subject, a.traceparent, a.tracestate}
}

// ceBinaryHeaders appends the binary mode's headers to m.Extra.
func (r *Router) ceBinaryHeaders(m *Message, a ceAttributes) {
	add := func(k, v string) {
		if v != "" {
			m.Extra = append(m.Extra, Header{Key: k, Value: []byte(v)})
		}
	}
	add("ce_specversion", ceSpecVersion)
	vs := a.values(r.ce.source)
	for i, n := range ceNames {
		if i != ceContentTypeAttr {
			add(n.header, vs[i])
		}
	}
	add(HeaderContentType, a.contentType)
}

// ceStructured returns the structured mode's value, the event in the JSON
// event format with the payload as data: embedded when it is JSON text
// under a JSON content type, base64 (data_base64) for bytea, a JSON string
// otherwise; no data for a NULL payload. It also appends the content-type
// header to m.Extra.
func (r *Router) ceStructured(m *Message, pos *positions, a ceAttributes, payload []byte) []byte {
	b := make([]byte, 0, len(payload)+256)
	b = append(b, `{"specversion":"`+ceSpecVersion+`"`...)
	for i, v := range a.values(r.ce.source) {
		if v != "" {
			b = append(b, ',', '"')
			b = append(b, ceNames[i].attr...)
			b = append(b, '"', ':')
			b = connect.AppendJSONString(b, []byte(v))
		}
	}
	switch {
	case payload == nil:
	case pos.payloadBytea:
		b = append(b, `,"data_base64":"`...)
		b = base64.StdEncoding.AppendEncode(b, payload)
		b = append(b, '"')
	case jsonContentType(a.contentType) && json.Valid(payload):
		b = append(b, `,"data":`...)
		b = append(b, payload...)
	default:
		b = append(b, `,"data":`...)
		b = connect.AppendJSONString(b, payload)
	}
	m.Extra = append(m.Extra, Header{Key: HeaderContentType, Value: []byte(ceStructuredContent)})
	return append(b, '}')
}

// jsonContentType reports whether a media type is JSON: application/json or
// a +json suffix, parameters aside (the CloudEvents JSON format's rule for
// embedding data as JSON).
func jsonContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "text/json"
}
