package router

import (
	"sort"
	"strings"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Columns names the outbox table's columns (sql.Columns: one definition,
// with the defaults in sql.DefaultColumns). Empty fields take the defaults.
//
// Headers is the only optional column: set it to NoHeaders ("-") when the
// table has no headers column. An empty Headers means the default "headers",
// and a table without that column then stops the relay with an error saying
// so, rather than silently dropping headers someone expected.
type Columns = sql.Columns

// NoHeaders as Columns.Headers means the table has no headers column.
const NoHeaders = sql.NoHeaders

// DefaultTopic is the topic template used when Config.Topic is empty: the
// Debezium outbox event router's default, so consumers can move over unchanged.
const DefaultTopic = "outbox.event.{aggregate_type}"

// Config configures a Router. The zero value means the documented defaults.
type Config struct {
	Columns Columns
	// Topic is the topic template, default DefaultTopic. It may contain the
	// placeholders {aggregate_type} and {event_type}; every other character must
	// be legal in a Kafka topic name.
	Topic string
	// Overrides maps an exact aggregate type to a topic, bypassing the template.
	Overrides map[string]string
	// TopicRegex and TopicReplacement route as Debezium's route.topic.regex
	// and route.topic.replacement do: an aggregate type the regex matches
	// whole goes to the expanded replacement ($1, ${name}), any other to the
	// topic named as the aggregate type. Set, they replace the template.
	TopicRegex, TopicReplacement string

	// Headers names the relay's own headers (nil: DefaultHeaders, all
	// three; empty: none). Debezium sends only id.
	Headers []string
	// Fields places more columns as headers or envelope fields (Debezium's
	// table.fields.additional.placement).
	Fields []Field
	// Converter writes keys and values as a Kafka Connect converter would;
	// default ConverterString.
	Converter Converter
	// TombstoneOnEmptyPayload sends a NULL or blank payload as a Kafka null
	// value (a tombstone), as Debezium's route.tombstone.on.empty.payload.
	TombstoneOnEmptyPayload bool
	// CloudEvents, when its Mode is set, writes every message as a
	// CloudEvent (see cloudevents.go).
	CloudEvents CloudEvents
	// Spans gives every event that carries a valid trace context a span of
	// its own (Message.Span), a child of the row's, and points its
	// traceparent header at it: the relay then exports that span.
	Spans bool
}

// A Converter says how keys and values are written, matching the Kafka
// Connect converter a Debezium user had, so that consumers read the same
// bytes and keys land on the same partitions after a switch (package
// connect writes them).
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

// Config keys as the operator sees them, in the reasons of failures found
// while routing (stored with the event in the retry table) and in Needs.
const (
	keyColumns          = "outbox.columns."
	keyTopic            = "topics.template"
	keyOverrides        = "topics.overrides"
	keyTopicRegex       = "topics.regex"
	keyTopicReplacement = "topics.replacement"
	keyHeaders          = "message.headers"
	keyFields           = "message.fields"
	keyConverter        = "message.converter"
)

// A routing is what validate makes of a Config: the parsed template or
// regex, the header set, and the names other headers may not take.
type routing struct {
	tmpl     template
	regex    *topicRegex
	headers  HeaderSet
	reserved map[string]bool // the header set's names and the header fields' aliases
}

// Validate fills defaults and returns what cannot work, as a *field.Error
// naming the field and the fix: what New would refuse.
func (c *Config) Validate() error {
	if _, err := New(*c); err != nil {
		return err
	}
	_, err := c.validate()
	return err
}

// validate is Validate, returning what it made of the Config.
func (c *Config) validate() (routing, error) {
	rt, err := c.validateMessage()
	if err != nil {
		return routing{}, err
	}
	if rt.tmpl, err = c.validateTopics(); err != nil {
		return routing{}, err
	}
	if err := c.validateCloudEvents(&rt); err != nil {
		return routing{}, err
	}
	if c.TopicRegex != "" || c.TopicReplacement != "" {
		if c.TopicRegex == "" || c.TopicReplacement == "" {
			return routing{}, field.Errorf("TopicRegex", "{TopicRegex} and {TopicReplacement} go together: set both (Debezium's route.topic.regex and route.topic.replacement), or neither to use {Topic}")
		}
		if c.Topic != DefaultTopic {
			return routing{}, field.Errorf("Topic", "%q and {TopicRegex} are both set: routing takes one of them; remove one", c.Topic)
		}
		re, err := compileTopicRegex(c.TopicRegex, c.TopicReplacement)
		if err != nil {
			return routing{}, err
		}
		rt.regex = &re
	}
	return rt, nil
}

// validateMessage checks the headers, fields and converter settings.
func (c *Config) validateMessage() (routing, error) {
	var rt routing
	var err error
	if rt.headers, err = NewHeaderSet(c.Headers); err != nil {
		return routing{}, err
	}
	switch c.Converter {
	case "":
		c.Converter = ConverterString
	case ConverterString, ConverterJSON:
	default:
		return routing{}, field.Errorf("Converter", "%q: use %q (Kafka Connect's StringConverter) or %q (JsonConverter with schemas.enable=false)", c.Converter, ConverterString, ConverterJSON)
	}
	rt.reserved = make(map[string]bool)
	for _, n := range rt.headers.Names() {
		rt.reserved[n] = true
	}
	envelope := map[string]bool{"payload": true}
	for _, f := range c.Fields {
		if f.Column == "" || f.Alias == "" {
			return routing{}, field.Errorf("Fields", "an entry has an empty column or name: want column:placement[:alias]")
		}
		switch f.Placement {
		case PlaceHeader:
			if rt.reserved[f.Alias] {
				return routing{}, field.Errorf("Fields", "header %q of column %q is already a header of the relay ({Headers}) or of another field: give it another alias (column:header:alias)", f.Alias, f.Column)
			}
			rt.reserved[f.Alias] = true
		case PlaceEnvelope:
			if envelope[f.Alias] {
				return routing{}, field.Errorf("Fields", "envelope field %q of column %q is already in the envelope (payload is the payload's): give it another alias (column:envelope:alias)", f.Alias, f.Column)
			}
			envelope[f.Alias] = true
		default:
			return routing{}, field.Errorf("Fields", "placement %q of column %q is not header or envelope", f.Placement, f.Column)
		}
	}
	return rt, nil
}

// validateTopics checks the columns, the template and the overrides.
func (c *Config) validateTopics() (template, error) {
	c.Columns = c.Columns.WithDefaults()
	cols := []struct {
		field *string
		name  string // the field of Columns
	}{
		{&c.Columns.ID, "ID"},
		{&c.Columns.AggregateType, "AggregateType"},
		{&c.Columns.AggregateID, "AggregateID"},
		{&c.Columns.EventType, "EventType"},
		{&c.Columns.Payload, "Payload"},
		{&c.Columns.Headers, "Headers"},
		{&c.Columns.Timestamp, "Timestamp"},
		{&c.Columns.TracingSpanContext, "TracingSpanContext"},
	}
	seen := make(map[string]string, len(cols))
	for _, col := range cols {
		name := *col.field
		if (col.name == "Timestamp" || col.name == "TracingSpanContext") && name == "" {
			continue
		}
		if name == NoHeaders {
			if col.name != "Headers" && col.name != "EventType" {
				return template{}, field.Errorf("Columns."+col.name, "%q: only the headers and event type columns may be disabled with %q", name, NoHeaders)
			}
			continue
		}
		if other, dup := seen[name]; dup {
			return template{}, field.Errorf("Columns."+col.name, "{Columns.%s} and {Columns.%s} both name column %q: map each to its own column", other, col.name, name)
		}
		seen[name] = col.name
	}

	if c.Topic == "" {
		c.Topic = DefaultTopic
	}
	tmpl, err := parseTemplate(c.Topic)
	if err != nil {
		return template{}, err
	}

	// Sorted so that the error for several bad overrides is deterministic.
	keys := make([]string, 0, len(c.Overrides))
	for k := range c.Overrides {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, aggregateType := range keys {
		topic := c.Overrides[aggregateType]
		if aggregateType == "" {
			return template{}, field.Errorf("Overrides", "an empty aggregate type (for topic %q): events with an empty aggregate type are never routed, remove the entry", topic)
		}
		if why := invalidTopic(topic); why != "" {
			return template{}, field.Errorf("Overrides", "topic %q for aggregate type %q %s", topic, aggregateType, why)
		}
	}
	return tmpl, nil
}

func parseTemplate(s string) (template, error) {
	var t template
	rest := s
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			t.parts = append(t.parts, part{lit: rest})
			break
		}
		if open > 0 {
			t.parts = append(t.parts, part{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return template{}, field.Errorf("Topic", "%q has an unclosed '{': placeholders are {aggregate_type} and {event_type}", s)
		}
		name := rest[open+1 : open+end]
		switch name {
		case "aggregate_type":
			t.parts = append(t.parts, part{placeholder: aggregateTypeP})
		case "event_type":
			t.parts = append(t.parts, part{placeholder: eventTypeP})
			t.useEventType = true
		default:
			return template{}, field.Errorf("Topic", "%q has unknown placeholder {%s}: use {aggregate_type} or {event_type}", s, name)
		}
		rest = rest[open+end+1:]
	}
	t.constant = true
	var lits strings.Builder
	for _, p := range t.parts {
		if p.placeholder != literal {
			t.constant = false
			continue
		}
		lits.WriteString(p.lit)
	}
	// Literal text must be legal on its own; the placeholders are checked per
	// event once their values are known.
	if lits.Len() > 0 {
		if why := invalidTopicChars(lits.String()); why != "" {
			return template{}, field.Errorf("Topic", "%q: the text outside placeholders %s", s, why)
		}
	}
	if t.constant {
		if why := invalidTopic(s); why != "" {
			return template{}, field.Errorf("Topic", "%q %s", s, why)
		}
	}
	return t, nil
}
