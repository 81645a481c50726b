package sql

import (
	"fmt"
	"slices"
	"strings"
)

// Columns names the outbox table's columns. Empty fields take the
// DefaultColumns. Headers "-" (NoHeaders) means the table has no headers
// column. router.Columns has the same fields: convert with
// sql.Columns(routerColumns).
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
	Headers       string
	// Timestamp, when set, names a timestamp column whose value becomes the
	// Kafka message's timestamp (Debezium's table.field.event.timestamp).
	// It has no default: without it a message carries the time it was sent.
	Timestamp string
	// TracingSpanContext, when set, names a text column holding the
	// event's trace context as Java properties text (traceparent=…,
	// tracestate=…), as Debezium's tracing.span.context.field does; the
	// relay sends it as the W3C traceparent and tracestate headers. No
	// default, like Timestamp.
	TracingSpanContext string
}

// NoHeaders as Columns.Headers means the table has no headers column.
const NoHeaders = "-"

// A Layout names a preset of the outbox table (outbox.layout): the relay's
// own, or the one Debezium's outbox event router expects by default, so that
// an existing Debezium outbox table needs no column mapping. What a layout
// means is one value in layouts: its column names (Columns), the relay's own
// headers its messages carry (Headers), and the table setup creates for it
// (OutboxTable). Everything that knows a layout reads it from there.
type Layout string

const (
	// LayoutRelay: id, aggregate_type, aggregate_id, event_type, payload,
	// headers (jsonb); the headers id, event_type and aggregate_type. The
	// default.
	LayoutRelay Layout = "relay"
	// LayoutDebezium: id, aggregatetype, aggregateid, type, payload, and no
	// headers column, as in Debezium's documentation and EventRouter defaults
	// (table.field.event.id, route.by.field, table.field.event.key,
	// table.field.event.type, table.field.event.payload); the header id
	// only, as Debezium's router sends.
	LayoutDebezium Layout = "debezium"
)

// Layouts lists the layouts in the order the documentation gives them.
var Layouts = []Layout{LayoutRelay, LayoutDebezium}

// A layoutSpec is everything a layout means.
type layoutSpec struct {
	columns Columns
	// headers are the relay's own headers its messages carry
	// (router.Config.Headers, message.headers' default), by the router's
	// names.
	headers []string
	// nameType is the SQL type setup creates the aggregate type, aggregate
	// id and event type columns with.
	nameType string
	about    string // what the layout is, for messages
}

// layouts is the one definition of each layout.
var layouts = map[Layout]layoutSpec{
	LayoutRelay: {
		columns: Columns{ID: "id", AggregateType: "aggregate_type", AggregateID: "aggregate_id",
			EventType: "event_type", Payload: "payload", Headers: "headers"},
		headers:  []string{"id", "event_type", "aggregate_type"},
		nameType: "text",
	},
	LayoutDebezium: {
		columns: Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid",
			EventType: "type", Payload: "payload", Headers: NoHeaders},
		headers:  []string{"id"},
		nameType: "varchar(255)",
		about:    "as Debezium's outbox event router",
	},
}

// spec returns the layout's definition; "" is LayoutRelay.
func (l Layout) spec() (layoutSpec, error) {
	if s, ok := layouts[l.orDefault()]; ok {
		return s, nil
	}
	uses := make([]string, len(Layouts))
	for i, name := range Layouts {
		s := layouts[name]
		uses[i] = fmt.Sprintf("%q (columns %s", string(name), strings.Join(s.columns.names(), ", "))
		if s.about != "" {
			uses[i] += ", " + s.about
		}
		uses[i] += ")"
	}
	return layoutSpec{}, fmt.Errorf("outbox.layout %q is not a layout: use %s", string(l), strings.Join(uses, " or "))
}

func (l Layout) orDefault() Layout {
	if l == "" {
		return LayoutRelay
	}
	return l
}

// String is the layout's name; the empty Layout is LayoutRelay.
func (l Layout) String() string { return string(l.orDefault()) }

// Columns returns the layout's column names; an unknown layout gives an
// error naming the valid ones.
func (l Layout) Columns() (Columns, error) {
	s, err := l.spec()
	return s.columns, err
}

// Headers returns the names of the relay's own headers the layout's messages
// carry (the router's header names; message.headers' default): all three for
// the relay's, only id for Debezium's. Nil for an unknown layout.
func (l Layout) Headers() []string {
	s, _ := l.spec()
	return slices.Clone(s.headers)
}

// names lists the mapped column names, the headers column when there is one.
func (c Columns) names() []string {
	names := []string{c.ID, c.AggregateType, c.AggregateID, c.EventType, c.Payload}
	if c.Headers != NoHeaders {
		names = append(names, c.Headers)
	}
	return names
}

// DefaultColumns returns the default column names of the outbox table, as in
// 001_outbox.sql: LayoutRelay's, id, aggregate_type, aggregate_id,
// event_type, payload, headers. The router and the CLI take them from here.
// Debezium's own defaults differ (aggregatetype, aggregateid, type): use
// LayoutDebezium, or configure those to share a Debezium table.
func DefaultColumns() Columns { return layouts[LayoutRelay].columns }

// WithDefaults returns c with every empty field set from DefaultColumns.
func (c Columns) WithDefaults() Columns { return c.Fill(DefaultColumns()) }

// Fill returns c with every empty field but Timestamp and TracingSpanContext set from d (a
// layout's columns).
func (c Columns) Fill(d Columns) Columns {
	for _, f := range []struct{ field, def *string }{
		{&c.ID, &d.ID}, {&c.AggregateType, &d.AggregateType}, {&c.AggregateID, &d.AggregateID},
		{&c.EventType, &d.EventType}, {&c.Payload, &d.Payload}, {&c.Headers, &d.Headers},
	} {
		if *f.field == "" {
			*f.field = *f.def
		}
	}
	return c
}

// OutboxTable returns the statements creating the outbox table of layout l
// and its created_at index, if missing. The Debezium layout gets the column
// types of Debezium's documentation (varchar(255) names), the relay's gets
// text; both have a uuid id and a jsonb payload, and a created_at column
// that Debezium ignores. A Timestamp column is created as timestamp (without
// time zone), the type Debezium's router accepts for
// table.field.event.timestamp. An unknown layout is taken as LayoutRelay
// (configuration validation refuses it first).
func OutboxTable(t Table, c Columns, l Layout) []string {
	s, err := l.spec()
	if err != nil {
		s = layouts[LayoutRelay]
	}
	c = c.Fill(s.columns)
	extra := ""
	if c.Headers != NoHeaders {
		extra += fmt.Sprintf("\n    %s jsonb,", Ident(c.Headers))
	}
	if c.Timestamp != "" && c.Timestamp != "created_at" {
		extra += fmt.Sprintf("\n    %s timestamp NOT NULL DEFAULT (now() AT TIME ZONE 'UTC'),", Ident(c.Timestamp))
	}
	name := s.nameType
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    %s uuid PRIMARY KEY,
    %s %s NOT NULL,
    %s %s NOT NULL,
    %s %s NOT NULL,
    %s jsonb,%s
    "created_at" timestamptz NOT NULL DEFAULT now()
)`, t.Quoted(), Ident(c.ID), Ident(c.AggregateType), name, Ident(c.AggregateID), name,
			Ident(c.EventType), name, Ident(c.Payload), extra),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("created_at")`,
			Ident(indexName(t.Name, "created_at_idx")), t.Quoted()),
	}
}
