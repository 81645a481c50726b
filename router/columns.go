package router

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router/connect"
)

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

type positions struct {
	id, aggregateType, aggregateID, eventType, payload, headers int // headers -1: none
	timestamp                                                   int // -1: none
	trace                                                       int // the tracing span context column; -1: none
	payloadBytea                                                bool
	payloadType, keyType                                        connect.Type
	timestampType                                               uint32
	fields                                                      []fieldPos // as Router.fields
	max                                                         int        // highest position used
	err                                                         *SchemaError
}

// fieldPos is where an additional field's column is, and its type.
type fieldPos struct {
	pos int
	typ connect.Type
}

// positions returns the cached column positions for rel, resolving them on
// the first row of a new Relation value.
func (r *Router) positions(rel *replication.Relation) *positions {
	if rel != nil && rel == r.rel {
		return &r.pos
	}
	if rel == nil {
		r.pos = positions{err: &SchemaError{Reason: "the row has no relation (a decoder bug; please report it)"}}
	} else {
		r.pos = r.resolve(relColumns(rel))
	}
	r.rel = rel
	return &r.pos
}

// rowColumns is what resolve reads of the rows a router is given: whose
// they are (for reasons) and their columns, in the order of a row's values.
// A table's come from its Relation (relColumns); a logical decoding
// message's from the message shape, which is no table.
type rowColumns struct {
	name string // quoted, as reasons name it
	cols []replication.Column
}

func relColumns(rel *replication.Relation) rowColumns {
	return rowColumns{name: relName(rel), cols: rel.Columns}
}

func (r *Router) resolve(rc rowColumns) positions {
	find := func(name, key string) (int, *SchemaError) {
		for i, c := range rc.cols {
			if c.Name == name {
				return i, nil
			}
		}
		reason := fmt.Sprintf("it has no column %q (dropped or renamed while the relay ran): restore the column, or set %s%s to its new name", name, keyColumns, key)
		if key == "headers" {
			reason += fmt.Sprintf(" (or to %q to send no extra headers)", NoHeaders)
		}
		reason += ", then restart the relay; no event from this change on was confirmed, so none is lost"
		return -1, &SchemaError{Table: rc.name, Column: name, Reason: reason}
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
	p.payloadType = r.colTypeOf(rc.cols[p.payload])
	p.payloadBytea = p.payloadType.OID == pgtype.ByteaOID
	p.keyType = r.colTypeOf(rc.cols[p.aggregateID])
	if p.timestamp >= 0 {
		p.timestampType = r.colTypeOf(rc.cols[p.timestamp]).OID
	}
	for _, f := range r.fields {
		i, err := find(f.Column, "")
		if err != nil {
			err.Reason = fmt.Sprintf("it has no column %q, which %s places as %s %q (dropped or renamed while the relay ran): restore the column or change %s, then restart the relay; no event from this change on was confirmed, so none is lost",
				f.Column, keyFields, f.Placement, f.Alias, keyFields)
			return positions{err: err}
		}
		p.fields = append(p.fields, fieldPos{pos: i, typ: r.colTypeOf(rc.cols[i])})
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

func (r *Router) colTypeOf(c replication.Column) connect.Type {
	if b, ok := r.bases[c.TypeOID]; ok {
		return connect.Type(b)
	}
	return connect.Type{OID: c.TypeOID, Mod: c.TypeMod}
}

// A BaseType is the type a domain is over, through every domain it is over
// (a domain over a domain over numeric(10,2) is numeric with the modifier of
// (10,2)), and that type's modifier.
type BaseType struct {
	OID uint32
	Mod int32
}

// SetBaseTypes tells the router each domain's base type (keyed by the
// domain's OID), read from the catalog (placement.BaseTypes) at start-up.
// pgoutput names a column's type by its own OID, a domain's too; Debezium
// writes a domain's value as its base type's, and so does the router for
// the domains it knows. The relay tells it again when a relation names a
// type it has not been told of (a domain created while it runs).
func (r *Router) SetBaseTypes(bases map[uint32]BaseType) {
	r.bases = bases
	r.rel = nil // resolve the columns again
}
