package debezium

import (
	"strings"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// debeziumColumns are the EventRouter's default columns: the Debezium
// layout's, which outbox.layout debezium sets.
var debeziumColumns, _ = sql.LayoutDebezium.Columns()

// The EventRouter's column options, their Debezium defaults and the relay
// key each maps to.
var routerColumns = []struct{ option, def, relayKey string }{
	{"table.field.event.id", debeziumColumns.ID, "outbox.columns.id"},
	{"route.by.field", debeziumColumns.AggregateType, "outbox.columns.aggregate_type"},
	{"table.field.event.key", debeziumColumns.AggregateID, "outbox.columns.aggregate_id"},
	{"table.field.event.type", debeziumColumns.EventType, "outbox.columns.event_type"},
	{"table.field.event.payload", debeziumColumns.Payload, "outbox.columns.payload"},
	{"table.field.event.timestamp", debeziumColumns.Timestamp, "outbox.columns.timestamp"},
}

// outbox maps the EventRouter's options.
func (c *converter) outbox() {
	typeKey := c.routerKey("type")
	c.set("outbox.layout", string(sql.LayoutDebezium), typeKey)
	for _, col := range routerColumns {
		v, has := c.opt(col.option)
		if has && v != "" && v != col.def {
			c.set(col.relayKey, v, c.routerKey(col.option))
		}
	}
	regex, hasRegex := c.opt("route.topic.regex")
	repl, hasRepl := c.opt("route.topic.replacement")
	if !hasRegex || regex == "" {
		regex = defaultRegex
	}
	if !hasRepl || repl == "" {
		repl = defaultReplacement
	}
	// The defaults route as the relay's default template does,
	// outbox.event.{aggregate_type}; the relay needs both keys or neither.
	if regex != defaultRegex || repl != defaultReplacement {
		// The relay's own check: Java's regex syntax is wider than Go's
		// (lookaround, backreferences, possessive quantifiers), and a
		// setting the relay refuses at load is a gap, not a setting.
		if _, err := router.New(router.Config{TopicRegex: regex, TopicReplacement: repl}); err != nil {
			c.gap(c.routerKey("route.topic.regex"), regex, "the relay cannot route with it: %v; rewrite the expression without Java-only syntax, or route these aggregate types with topics.overrides", err)
		} else {
			c.set("topics.regex", regex, c.routerKey("route.topic.regex"))
			c.set("topics.replacement", repl, c.routerKey("route.topic.replacement"))
		}
	}
	keyCol, has := c.opt("table.field.event.key")
	if !has || keyCol == "" {
		keyCol = debeziumColumns.AggregateID
	}
	c.note(c.routerKey("table.field.event.key"), keyCol,
		"an event whose aggregate id is NULL or empty: Debezium sends it with an empty key; the relay does not send it: it parks the event in the retry table as dead with the reason (`outbox-relay retries list --status dead` shows it), and delivers the rest; give every event an aggregate id (a NOT NULL column with CHECK (%s <> ''))", keyCol)
	c.set("message.headers", strings.Join(sql.LayoutDebezium.Headers(), ","), typeKey)
	if v, has := c.opt("table.fields.additional.placement"); has && v != "" {
		c.fields(v)
	}
	if v, has := c.opt("route.tombstone.on.empty.payload"); has {
		switch strings.ToLower(v) {
		case "true":
			c.set("message.tombstone_on_empty_payload", "true", c.routerKey("route.tombstone.on.empty.payload"))
		case "false", "":
		default:
			c.gap(c.routerKey("route.tombstone.on.empty.payload"), v, "not a boolean: set message.tombstone_on_empty_payload to true or false")
		}
	}
	c.routerOptions()
}

// fields copies table.fields.additional.placement, leaving out what the relay
// cannot do.
func (c *converter) fields(v string) {
	key := c.routerKey("table.fields.additional.placement")
	var keep []string
	dropped := false
	for entry := range strings.SplitSeq(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		// The relay's own parser, entry by entry: what it refuses is a gap,
		// the rest is kept.
		fs, err := router.ParseFields(entry)
		switch {
		case err != nil:
			c.gap(key, entry, "%v; the entry is left out of message.fields", err)
		case fs[0].Placement == router.PlaceHeader && fs[0].Alias == router.HeaderID:
			c.gap(key, entry, "Debezium sends this header next to its own id header, two headers named id; the relay sends one (message.headers: id): the entry is left out of message.fields, give it another alias to keep it")
		default:
			keep = append(keep, entry)
			continue
		}
		dropped = true
	}
	if len(keep) == 0 {
		return
	}
	if !dropped {
		keep = []string{v} // verbatim
	}
	c.set("message.fields", strings.Join(keep, ","), key)
}

// routerOptions handles the EventRouter options that are not mapped, and
// unknown ones.
func (c *converter) routerOptions() {
	expand := false
	if v, has := c.opt("table.expand.json.payload"); has && strings.EqualFold(v, "true") {
		expand = true
		c.gap(c.routerKey("table.expand.json.payload"), v, "the relay sends the payload's bytes as stored; Debezium parsed a JSON string payload into a structure, so with JsonConverter consumers got a JSON object where the relay sends a JSON string: store the payload as json or jsonb with message.converter string, or change consumers")
	}
	for _, o := range []string{"table.json.payload.null.behavior", "table.json.payload.empty.array.behavior"} {
		if v, has := c.opt(o); has && !expand {
			c.note(c.routerKey(o), v, "has no effect without table.expand.json.payload")
		} else if has {
			c.gap(c.routerKey(o), v, "part of table.expand.json.payload, which the relay does not do")
		}
	}
	if v, has := c.opt("table.op.invalid.behavior"); has {
		switch strings.ToLower(v) {
		case "warn", "":
		case "error":
			c.note(c.routerKey("table.op.invalid.behavior"), v, "Debezium logged an error for each update or delete of the outbox table; the relay ignores them too, counting them and logging once per kind")
		default:
			c.gap(c.routerKey("table.op.invalid.behavior"), v, "Debezium stopped on an update or delete of the outbox table; the relay ignores them, counting them and logging once per kind: alert on the relay's log or metrics if they must not happen")
		}
	}
	if v, has := c.opt("table.field.additional.missing"); has && !strings.EqualFold(v, "error") {
		c.gap(c.routerKey("table.field.additional.missing"), v, "Debezium skipped a message.fields column missing from the table; the relay stops at it: remove such columns from message.fields")
	}
	if v, has := c.opt("table.field.event.schema.version"); has {
		c.gap(c.routerKey("table.field.event.schema.version"), v, "the relay sets no schema version; Debezium put it in the value's Connect schema, which only a schema-carrying converter (Avro, JsonConverter with schemas) writes: drop the option if consumers do not read it")
	}
	if v, has := c.opt("tracing.span.context.field"); has && v != "" {
		// The relay sends the column's trace context as traceparent and
		// tracestate, without a span of its own (Debezium's db-log-write).
		c.set("outbox.columns.tracing_span_context", v, c.routerKey("tracing.span.context.field"))
	}
	for _, o := range []string{"predicate", "negate"} {
		if v, has := c.opt(o); has {
			c.gap(c.routerKey(o), v, "the relay routes every insert of the outbox table; a predicate limiting the router has no equivalent")
		}
	}
	prefix := c.routerKey("")
	for _, k := range sortedKeys(c.conn) {
		if !strings.HasPrefix(k, prefix) || c.used[k] {
			continue
		}
		c.used[k] = true
		v := c.conn[k]
		option := strings.TrimPrefix(k, prefix)
		if strings.HasPrefix(option, "tracing.") {
			c.gap(k, v, "the relay propagates the row's trace context (outbox.columns.tracing_span_context) as the traceparent and tracestate headers, but creates no span of its own (Debezium's db-log-write span, ActivateTracingSpan)")
			continue
		}
		c.gap(k, v, "not an EventRouter option the relay knows: check what it does; the relay has no equivalent")
	}
}
