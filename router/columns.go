package router

// A Need is a column of the outbox table the router reads, and the types it
// can read it as. Start-up checks (check, setup, run) compare them with the
// catalog, so that a mapping that cannot work fails before the first event.
type Need struct {
	Key    string   // the setting that names it: outbox.columns.<field> or message.fields
	Column string   // its name
	Types  []string // base types as format_type spells them; nil: any
}

// Types of columns the router can read.
var (
	idTypes      = []string{"uuid", "text", "character varying", "character", "smallint", "integer", "bigint"}
	nameTypes    = []string{"text", "character varying", "character"}
	payloadTypes = []string{"jsonb", "json", "text", "bytea"}
	// A text headers column is read as JSON text, as json is.
	headersTypes = []string{"jsonb", "json", "text", "character varying"}
	timeTypes    = []string{"timestamp without time zone", "timestamp with time zone"}
)

// UsesEventType reports whether anything reads the event type column: the
// event_type header, an {event_type} topic template, or CloudEvents (whose
// type attribute it is). Otherwise the column
// may be absent, as Debezium's router reads table.field.event.type only when
// something uses it.
func (r *Router) UsesEventType() bool {
	return r.rt.headers.has(hEventType) || r.tmpl.useEventType && r.rt.regex == nil || r.ce.mode != ""
}

// Needs returns the columns the router reads: the mapped ones (headers,
// timestamp and tracing span context when set, the event type when something uses it) and those of
// message.fields.
func (r *Router) Needs() []Need {
	c := r.cols
	needs := []Need{
		{keyColumns + "id", c.ID, idTypes},
		{keyColumns + "aggregate_type", c.AggregateType, nameTypes},
		{keyColumns + "aggregate_id", c.AggregateID, idTypes},
	}
	if c.EventType != NoHeaders && r.UsesEventType() {
		needs = append(needs, Need{keyColumns + "event_type", c.EventType, nameTypes})
	}
	needs = append(needs, Need{keyColumns + "payload", c.Payload, payloadTypes})
	if c.Headers != NoHeaders {
		needs = append(needs, Need{keyColumns + "headers", c.Headers, headersTypes})
	}
	if c.Timestamp != "" {
		needs = append(needs, Need{keyColumns + "timestamp", c.Timestamp, timeTypes})
	}
	if c.TracingSpanContext != "" {
		needs = append(needs, Need{keyColumns + "tracing_span_context", c.TracingSpanContext, nameTypes})
	}
	for _, f := range r.fields {
		needs = append(needs, Need{keyFields, f.Column, nil})
	}
	return needs
}
