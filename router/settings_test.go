package router_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

const (
	oidBool      = 16
	oidInt4      = 23
	oidInt8      = 20
	oidVarchar   = 1043
	oidTimestamp = 1114
)

// debeziumOutbox is Debezium's documented outbox table with two extra
// columns, as pgoutput announces it.
var debeziumOutbox = &replication.Relation{ID: 16400, Namespace: "public", Name: "outbox", Columns: []replication.Column{
	{Name: "id", TypeOID: oidUUID},
	{Name: "aggregatetype", TypeOID: oidVarchar},
	{Name: "aggregateid", TypeOID: oidVarchar},
	{Name: "type", TypeOID: oidVarchar},
	{Name: "payload", TypeOID: oidJSONB},
	{Name: "tenant", TypeOID: oidInt4},
	{Name: "urgent", TypeOID: oidBool},
	{Name: "occurred", TypeOID: oidTimestamp, TypeMod: -1}, // as pgoutput sends a plain timestamp
}}

func dbzRow(vals ...string) replication.Row {
	r := replication.Row{Relation: debeziumOutbox}
	for _, v := range vals {
		if v == "<nil>" {
			r.Values = append(r.Values, nil)
		} else {
			r.Values = append(r.Values, []byte(v))
		}
	}
	return r
}

func debeziumConfig(t *testing.T) router.Config {
	t.Helper()
	cols, err := sql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	return router.Config{Columns: cols, Headers: []string{router.HeaderID}}
}

// The bytes Debezium 3.1 writes through Kafka Connect for these rows, with
// StringConverter or JsonConverter (schemas.enable=false) for key and value.
func TestRouteConverters(t *testing.T) {
	tests := []struct {
		name      string
		converter router.Converter
		tombstone bool
		aggID     string
		payload   string
		wantKey   string
		wantValue string // "<nil>": a Kafka null value
	}{
		{"string", router.ConverterString, false, "A-1", `{"a": 1}`, "A-1", `{"a": 1}`},
		{"string NULL", router.ConverterString, false, "A-1", "<nil>", "A-1", "<nil>"},
		{"json", router.ConverterJSON, false, "A-1", `{"a": "x\"y"}`, `"A-1"`, `"{\"a\": \"x\\\"y\"}"`},
		{"json NULL", router.ConverterJSON, false, "A-1", "<nil>", `"A-1"`, "null"},
		{"json scalar", router.ConverterJSON, false, "A-1", `42`, `"A-1"`, `"42"`},
		{"json quoting like Jackson", router.ConverterJSON, false, "k\"\\\n\x01</>\u2028é", `"\u0000"`,
			`"k\"\\\n\u0001</>` + "\u2028" + `é"`, `"\"\\u0000\""`},
		{"json emoji as surrogates", router.ConverterJSON, false, "Zoë-🙂", `{"e": "🙂x"}`,
			`"Zoë-\uD83D\uDE42"`, `"{\"e\": \"\uD83D\uDE42x\"}"`},
		{"json NULL tombstone", router.ConverterJSON, true, "A-1", "<nil>", `"A-1"`, "<nil>"},
		{"string blank tombstone", router.ConverterString, true, "A-1", "  ", "A-1", "<nil>"},
		{"string blank kept", router.ConverterString, false, "A-1", "  ", "A-1", "  "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := debeziumConfig(t)
			cfg.Converter, cfg.TombstoneOnEmptyPayload = tt.converter, tt.tombstone
			r := mustNew(t, cfg)
			m, err := r.Route(dbzRow("e1", "Order", tt.aggID, "Created", tt.payload, "7", "t", "2026-11-22 10:00:00.5"))
			if err != nil {
				t.Fatalf("Route: %v", err)
			}
			if string(m.Key) != tt.wantKey {
				t.Errorf("key = %q; want %q", m.Key, tt.wantKey)
			}
			got := string(m.Value)
			if m.Value == nil {
				got = "<nil>"
			}
			if got != tt.wantValue {
				t.Errorf("value = %q; want %q", got, tt.wantValue)
			}
			if h := headersString(m.Headers); h != "id=e1" {
				t.Errorf("headers = %q; want only id, as Debezium sends", h)
			}
			if m.AggregateID != tt.aggID {
				t.Errorf("AggregateID = %q; want the column's text %q", m.AggregateID, tt.aggID)
			}
		})
	}
}

// An integer aggregate id is a JSON number under JsonConverter, as Debezium
// sends an int column; a text one is quoted.
func TestRouteJSONIntegerKey(t *testing.T) {
	rel := &replication.Relation{ID: 1, Namespace: "public", Name: "outbox", Columns: []replication.Column{
		{Name: "id", TypeOID: oidInt8},
		{Name: "aggregatetype", TypeOID: oidText},
		{Name: "aggregateid", TypeOID: oidInt8},
		{Name: "type", TypeOID: oidText},
		{Name: "payload", TypeOID: oidText},
	}}
	cfg := debeziumConfig(t)
	cfg.Converter = router.ConverterJSON
	m, err := mustNew(t, cfg).Route(replication.Row{Relation: rel, Values: [][]byte{[]byte("5"), []byte("Order"), []byte("42"), []byte("C"), []byte("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Key) != "42" || string(m.Value) != `"hi"` || headersString(m.Headers) != "id=5" {
		t.Errorf("key %q value %q headers %q; want 42, \"hi\", id=5", m.Key, m.Value, headersString(m.Headers))
	}
}

func TestRouteFields(t *testing.T) {
	fields, err := router.ParseFields(" type:header:eventType , tenant:HEADER, urgent:envelope:isUrgent,occurred:header , tenant:envelope")
	if err != nil {
		t.Fatal(err)
	}
	if got := router.FieldsString(fields); got != "type:header:eventType,tenant:header,urgent:envelope:isUrgent,occurred:header,tenant:envelope" {
		t.Errorf("FieldsString = %q", got)
	}
	const micros = "1763805600500000" // 2025-11-22 10:00:00.5 UTC
	tests := []struct {
		converter   router.Converter
		tenant      string
		wantHeaders string
		wantValue   string
	}{
		{router.ConverterJSON, "7", "id=e1 eventType=Created tenant=7 occurred=" + micros,
			`{"payload":"{\"a\": 1}","isUrgent":true,"tenant":7}`},
		{router.ConverterJSON, "<nil>", "id=e1 eventType=Created tenant=<nil> occurred=" + micros,
			`{"payload":"{\"a\": 1}","isUrgent":true,"tenant":null}`},
		// StringConverter writes Kafka Connect's Struct.toString, nulls left out.
		{router.ConverterString, "7", "id=e1 eventType=Created tenant=7 occurred=" + micros,
			`Struct{payload={"a": 1},isUrgent=true,tenant=7}`},
		{router.ConverterString, "<nil>", "id=e1 eventType=Created tenant=<nil> occurred=" + micros,
			`Struct{payload={"a": 1},isUrgent=true}`},
	}
	for _, tt := range tests {
		cfg := debeziumConfig(t)
		cfg.Fields, cfg.Converter = fields, tt.converter
		m, err := mustNew(t, cfg).Route(dbzRow("e1", "Order", "A-1", "Created", `{"a": 1}`, tt.tenant, "t", "2025-11-22 10:00:00.5"))
		if err != nil {
			t.Fatal(err)
		}
		if got := nullHeaders(m.Headers); got != tt.wantHeaders {
			t.Errorf("%s tenant %s: headers = %q; want %q", tt.converter, tt.tenant, got, tt.wantHeaders)
		}
		if string(m.Value) != tt.wantValue {
			t.Errorf("%s tenant %s: value = %s; want %s", tt.converter, tt.tenant, m.Value, tt.wantValue)
		}
	}
}

func nullHeaders(hs []router.Header) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		v := string(h.Value)
		if h.Value == nil {
			v = "<nil>"
		}
		parts[i] = h.Key + "=" + v
	}
	return strings.Join(parts, " ")
}

func TestRouteTimestampColumn(t *testing.T) {
	cfg := debeziumConfig(t)
	cfg.Columns.Timestamp = "occurred"
	r := mustNew(t, cfg)
	m, err := r.Route(dbzRow("e1", "Order", "A-1", "Created", `{}`, "1", "f", "2026-11-22 10:00:00.123456"))
	if err != nil {
		t.Fatal(err)
	}
	if want := time.Date(2026, 11, 22, 10, 0, 0, 123456000, time.UTC); !m.Time.Equal(want) {
		t.Errorf("Time = %v; want %v (the column, read as UTC as Debezium reads it)", m.Time, want)
	}
	// NULL: the send time, as Debezium falls back to its processing time.
	m, err = r.Route(dbzRow("e2", "Order", "A-1", "Created", `{}`, "1", "f", "<nil>"))
	if err != nil || !m.Time.IsZero() {
		t.Errorf("Route(NULL timestamp) = %v, %v; want a zero Time", m.Time, err)
	}
	// timestamptz works too (Debezium refuses it).
	rel := *outbox
	cfgRelay := router.Config{Columns: router.Columns{Timestamp: "created_at"}}
	row := row("e3", "Order", "A-1", "Created", "{}", "<nil>")
	row.Relation = &rel
	row.Values[6] = []byte("2026-11-22 11:30:00.25+01:30")
	m, err = mustNew(t, cfgRelay).Route(row)
	if want := time.Date(2026, 11, 22, 10, 0, 0, 250000000, time.UTC); err != nil || !m.Time.Equal(want) {
		t.Errorf("Route(timestamptz) = %v, %v; want %v", m.Time, err, want)
	}
}

func TestRouteTopicRegex(t *testing.T) {
	tests := []struct {
		regex, replacement, aggregateType, want string
	}{
		// Debezium's defaults give the default template's topics.
		{"(?<routedByValue>.*)", "outbox.event.${routedByValue}", "Order", "outbox.event.Order"},
		{`(.*)Event`, `events.$1`, "OrderEvent", "events.Order"},
		{`(.*)Event`, `events.$1`, "Payment", "Payment"}, // no whole match: the value itself
		{`(?<t>[a-z]+)`, `x.\${t}.${t}`, "abc", "x.${t}.abc"},
		{`(a)(b)(c)(d)(e)(f)(g)(h)(i)(j)`, `$10-$11`, "abcdefghij", "j-a1"},
	}
	for _, tt := range tests {
		cfg := router.Config{TopicRegex: tt.regex, TopicReplacement: tt.replacement}
		if strings.ContainsAny(tt.want, "${}") {
			// Not a legal topic: the router says so, per event.
			if _, err := mustNew(t, cfg).Topic(tt.aggregateType, ""); err == nil {
				t.Errorf("Topic(%q) with %q → %q: no error for an illegal topic", tt.aggregateType, tt.regex, tt.replacement)
			}
			continue
		}
		for range 2 { // the second from the cache
			if got, err := mustNew(t, cfg).Topic(tt.aggregateType, ""); err != nil || got != tt.want {
				t.Errorf("Topic(%q) with %q → %q = %q, %v; want %q", tt.aggregateType, tt.regex, tt.replacement, got, err, tt.want)
			}
		}
	}
}

func TestNewInvalidMessageSettings(t *testing.T) {
	tests := []struct {
		name      string
		cfg       router.Config
		wantInErr string
	}{
		{"regex alone", router.Config{TopicRegex: "(.*)"}, "TopicRegex: TopicRegex and TopicReplacement go together"},
		{"regex and template", router.Config{Topic: "x", TopicRegex: "(.*)", TopicReplacement: "$1"}, "routing takes one of them"},
		{"bad regex", router.Config{TopicRegex: "(?=x)", TopicReplacement: "y"}, "TopicRegex: \"(?=x)\""},
		{"unknown group", router.Config{TopicRegex: "(?<a>.*)", TopicReplacement: "${b}"}, `names group "b"`},
		{"lone dollar", router.Config{TopicRegex: "(.*)", TopicReplacement: "x$"}, "lone '$'"},
		{"unknown header", router.Config{Headers: []string{"trace"}}, `"trace" is not one of the relay's headers`},
		{"alias takes id", router.Config{Fields: []router.Field{{Column: "type", Placement: router.PlaceHeader, Alias: "id"}}}, `header "id" of column "type"`},
		{"envelope payload", router.Config{Fields: []router.Field{{Column: "type", Placement: router.PlaceEnvelope, Alias: "payload"}}}, `envelope field "payload"`},
		{"converter", router.Config{Converter: "avro"}, `Converter: "avro"`},
	}
	for _, tt := range tests {
		_, err := router.New(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.wantInErr) {
			t.Errorf("%s: New = %v; want an error containing %q", tt.name, err, tt.wantInErr)
		}
	}
	for _, s := range []string{"type", "type:partition", "type:body", ":header"} {
		if _, err := router.ParseFields(s); err == nil {
			t.Errorf("ParseFields(%q) = nil error", s)
		}
	}
}

// With id as its only own header, the relay lets the headers column carry
// event_type; the header fields' names are reserved like id.
func TestRouteReservedNamesFollowConfig(t *testing.T) {
	r := mustNew(t, router.Config{
		Headers: []string{router.HeaderID},
		Fields:  []router.Field{{Column: "event_type", Placement: router.PlaceHeader, Alias: "kind"}},
	})
	m, err := r.Route(row("e1", "Order", "A-1", "Created", "{}", `{"event_type":"x","kind":"y","id":"z","t":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := headersString(m.Headers); got != "id=e1 kind=Created event_type=x t=1" || m.DroppedHeaders != 2 {
		t.Errorf("headers = %q, %d dropped; want id, the field, then the column's event_type and t, 2 dropped", got, m.DroppedHeaders)
	}
}

// A header or envelope column dropped while running is a schema change,
// not an empty field.
func TestRouteFieldColumnDropped(t *testing.T) {
	cfg := debeziumConfig(t)
	cfg.Fields = []router.Field{{Column: "gone", Placement: router.PlaceHeader, Alias: "gone"}}
	_, err := mustNew(t, cfg).Route(dbzRow("e1", "Order", "A-1", "Created", `{}`, "1", "f", "<nil>"))
	var se *router.SchemaError
	if !errors.As(err, &se) || se.Column != "gone" || !strings.Contains(se.Error(), "message.fields") {
		t.Errorf("Route = %v; want a *SchemaError for column gone naming message.fields", err)
	}
}
