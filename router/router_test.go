package router_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

const (
	oidText  = 25
	oidUUID  = 2950
	oidJSONB = 3802
	oidBytea = 17
)

// outbox is the default outbox table as pgoutput announces it.
var outbox = &replication.Relation{ID: 16384, Namespace: "public", Name: "outbox", Columns: []replication.Column{
	{Name: "id", TypeOID: oidUUID},
	{Name: "aggregate_type", TypeOID: oidText},
	{Name: "aggregate_id", TypeOID: oidText},
	{Name: "event_type", TypeOID: oidText},
	{Name: "payload", TypeOID: oidJSONB},
	{Name: "headers", TypeOID: oidJSONB},
	{Name: "created_at", TypeOID: 1184},
}}

// row builds a row of the default outbox table; "<nil>" stands for SQL NULL.
func row(id, aggType, aggID, eventType, payload, headers string) replication.Row {
	vals := make([][]byte, 0, 7)
	for _, v := range []string{id, aggType, aggID, eventType, payload, headers, "2026-01-01 00:00:00+00"} {
		if v == "<nil>" {
			vals = append(vals, nil)
		} else {
			vals = append(vals, []byte(v))
		}
	}
	return replication.Row{Relation: outbox, Values: vals}
}

func mustNew(t testing.TB, cfg router.Config) *router.Router {
	t.Helper()
	r, err := router.New(cfg)
	if err != nil {
		t.Fatalf("New(%+v) = %v", cfg, err)
	}
	return r
}

func TestTopic(t *testing.T) {
	tests := []struct {
		name, template, aggregateType, eventType, want string
	}{
		{"default template", "", "Order", "Created", "outbox.event.Order"},
		{"override", "", "Payment", "Created", "payments"},
		{"override wins over template", "x.{event_type}", "Payment", "", "payments"},
		{"event type", "{aggregate_type}.{event_type}", "Order", "Created", "Order.Created"},
		{"constant", "all-events", "Order", "Created", "all-events"},
		{"legal punctuation", "", "order_line-v2.1", "", "outbox.event.order_line-v2.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, router.Config{Topic: tt.template, Overrides: map[string]string{"Payment": "payments"}})
			// Twice: the second call is served from the topic cache.
			for range 2 {
				if got, err := r.Topic(tt.aggregateType, tt.eventType); err != nil || got != tt.want {
					t.Errorf("Topic(%q, %q) = %q, %v; want %q", tt.aggregateType, tt.eventType, got, err, tt.want)
				}
			}
		})
	}
}

func TestTopicInvalid(t *testing.T) {
	tests := []struct {
		name, template, aggregateType, eventType string
		wantInErr                                []string
	}{
		{"space", "", "Order Line", "", []string{`"outbox.event.Order Line"`, `aggregate type "Order Line"`, "add an override"}},
		{"unicode", "", "Bestellung-ä", "", []string{"Bestellung", "letters, digits"}},
		{"too long", "", strings.Repeat("a", 240), "", []string{"at most 249"}},
		{"dot", "{aggregate_type}", ".", "", []string{`"."`, "not allowed"}},
		{"dotdot", "{aggregate_type}", "..", "", []string{`".."`}},
		{"empty aggregate type", "", "", "Created", []string{"aggregate type is empty"}},
		{"empty event type", "{aggregate_type}.{event_type}", "Order", "", []string{"event type", "{event_type}"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, router.Config{Topic: tt.template})
			got, err := r.Topic(tt.aggregateType, tt.eventType)
			var rerr *router.RouteError
			if !errors.As(err, &rerr) {
				t.Fatalf("Topic(%q, %q) = %q, %v; want a *RouteError", tt.aggregateType, tt.eventType, got, err)
			}
			// The settings to change (topics.overrides, topics.template) are
			// the CLI's to name, by the code (cmd's TestRetryReasonRendered).
			wantCode := router.CodeTopicInvalid
			switch tt.name {
			case "empty aggregate type":
				wantCode = router.CodeAggregateTypeEmpty
			case "empty event type":
				wantCode = router.CodeEventTypeEmpty
			}
			if rerr.Code != wantCode {
				t.Errorf("Topic(%q, %q) code = %q; want %q", tt.aggregateType, tt.eventType, rerr.Code, wantCode)
			}
			for _, w := range tt.wantInErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Topic(%q, %q) error = %q; want it to contain %q", tt.aggregateType, tt.eventType, err, w)
				}
			}
		})
	}
}

func TestNewInvalid(t *testing.T) {
	tests := []struct {
		name      string
		cfg       router.Config
		wantInErr []string
	}{
		{"unknown placeholder", router.Config{Topic: "outbox.{aggregate}"}, []string{"Topic: ", "{aggregate}", "{aggregate_type}"}},
		{"unclosed placeholder", router.Config{Topic: "outbox.{aggregate_type"}, []string{"unclosed"}},
		{"illegal literal", router.Config{Topic: "outbox events.{aggregate_type}"}, []string{"Topic: ", "' '"}},
		{"illegal constant", router.Config{Topic: ".."}, []string{"Topic: ", "not allowed"}},
		{"illegal override", router.Config{Overrides: map[string]string{"Order": "orders/eu"}}, []string{"Overrides: ", `"orders/eu"`, `"Order"`}},
		{"empty override topic", router.Config{Overrides: map[string]string{"Order": ""}}, []string{"Overrides: ", "empty"}},
		{"empty override key", router.Config{Overrides: map[string]string{"": "orders"}}, []string{"Overrides: ", "empty aggregate type"}},
		{"duplicate column", router.Config{Columns: router.Columns{AggregateID: "aggregate_type"}}, []string{"Columns.AggregateType", "Columns.AggregateID"}},
		{"disable required column", router.Config{Columns: router.Columns{Payload: "-"}}, []string{"Columns.Payload: ", "only the headers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := router.New(tt.cfg)
			if err == nil {
				t.Fatalf("New(%+v) = %v, nil; want an error", tt.cfg, r)
			}
			for _, w := range tt.wantInErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("New(%+v) error = %q; want it to contain %q", tt.cfg, err, w)
				}
			}
		})
	}
}

func headersString(hs []router.Header) string {
	var b strings.Builder
	for i, h := range hs {
		if i > 0 {
			b.WriteString(" ")
		}
		if h.Value == nil {
			fmt.Fprintf(&b, "%s=<nil>", h.Key)
		} else {
			fmt.Fprintf(&b, "%s=%s", h.Key, h.Value)
		}
	}
	return b.String()
}

func TestRoute(t *testing.T) {
	const base = "id=e1 event_type=Created aggregate_type=Order"
	tests := []struct {
		name        string
		row         replication.Row
		wantTopic   string
		wantKey     string
		wantValue   string // "<nil>" for a nil value
		wantHeaders string
	}{
		{"plain", row("e1", "Order", "o-1", "Created", `{"total": 12.50}`, "<nil>"),
			"outbox.event.Order", "o-1", `{"total": 12.50}`, base},
		{"payload kept byte for byte", row("e1", "Order", "o-1", "Created", `{"b":1,  "a":[1.0e3, "\u00e9"]}`, "<nil>"),
			"outbox.event.Order", "o-1", `{"b":1,  "a":[1.0e3, "\u00e9"]}`, base},
		{"null payload", row("e1", "Order", "o-1", "Created", "<nil>", "<nil>"),
			"outbox.event.Order", "o-1", "<nil>", base},
		{"null event type", row("e1", "Order", "o-1", "<nil>", "{}", "<nil>"),
			"outbox.event.Order", "o-1", "{}", "id=e1 event_type=<nil> aggregate_type=Order"},
		{"headers in stored order", row("e1", "Order", "o-1", "Created", "{}", `{"z": "last?", "a": "no, stored order"}`),
			"outbox.event.Order", "o-1", "{}", base + " z=last? a=no, stored order"},
		{"header values by JSON kind", row("e1", "Order", "o-1", "Created", "{}", `{"s": "text", "n": 42, "f": -1.5e2, "t": true, "o": {"x": [1, "}"]}, "l": [1, 2], "skip": null}`),
			"outbox.event.Order", "o-1", "{}", base + ` s=text n=42 f=-1.5e2 t=true o={"x": [1, "}"]} l=[1, 2]`},
		{"escaped header strings", row("e1", "Order", "o-1", "Created", "{}", `{"tr\"ace": "a\"b\u00e9\n"}`),
			"outbox.event.Order", "o-1", "{}", base + " tr\"ace=a\"b\u00e9\n"},
		{"empty headers object", row("e1", "Order", "o-1", "Created", "{}", ` { } `),
			"outbox.event.Order", "o-1", "{}", base},
		{"empty string header", row("e1", "Order", "o-1", "Created", "{}", `{"e": ""}`),
			"outbox.event.Order", "o-1", "{}", base + " e="},
	}
	r := mustNew(t, router.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Route(tt.row)
			if err != nil {
				t.Fatalf("Route(%q) = %v", tt.row.Values, err)
			}
			if m.Topic != tt.wantTopic {
				t.Errorf("Route(%q).Topic = %q; want %q", tt.row.Values, m.Topic, tt.wantTopic)
			}
			if string(m.Key) != tt.wantKey {
				t.Errorf("Route(%q).Key = %q; want %q", tt.row.Values, m.Key, tt.wantKey)
			}
			if tt.wantValue == "<nil>" {
				if m.Value != nil {
					t.Errorf("Route(%q).Value = %q; want nil", tt.row.Values, m.Value)
				}
			} else if string(m.Value) != tt.wantValue {
				t.Errorf("Route(%q).Value = %q; want %q", tt.row.Values, m.Value, tt.wantValue)
			}
			if got := headersString(m.Headers); got != tt.wantHeaders {
				t.Errorf("Route(%q).Headers = %q; want %q", tt.row.Values, got, tt.wantHeaders)
			}
			if m.ID != "e1" || m.AggregateType != "Order" || m.AggregateID != "o-1" {
				t.Errorf("Route(%q) ids = %q, %q, %q; want e1, Order, o-1", tt.row.Values, m.ID, m.AggregateType, m.AggregateID)
			}
		})
	}
}

// The value must be the Row's own bytes: copying every payload is what the
// hot path must avoid.
func TestRouteSharesPayload(t *testing.T) {
	r := mustNew(t, router.Config{})
	rw := row("e1", "Order", "o-1", "Created", `{"a":1}`, "<nil>")
	m, err := r.Route(rw)
	if err != nil {
		t.Fatalf("Route = %v", err)
	}
	if &m.Value[0] != &rw.Values[4][0] {
		t.Errorf("Route(...).Value is a copy; want it to share the Row's bytes")
	}
}

func TestRouteBytea(t *testing.T) {
	rel := &replication.Relation{Name: "outbox", Columns: append([]replication.Column(nil), outbox.Columns...)}
	rel.Columns[4].TypeOID = oidBytea
	tests := []struct {
		name, payload string
		want          []byte
		wantErr       string
	}{
		{"hex", `\x00ff7b7d`, []byte{0x00, 0xff, '{', '}'}, ""},
		{"empty", `\x`, []byte{}, ""},
		{"bad hex", `\x0g`, nil, "hex"},
		{"odd length", `\x0`, nil, "hex"},
		{"escape format", `abc`, nil, "bytea_output"},
	}
	r := mustNew(t, router.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rw := row("e1", "Order", "o-1", "Created", tt.payload, "<nil>")
			rw.Relation = rel
			m, err := r.Route(rw)
			if tt.wantErr != "" {
				var rerr *router.RouteError
				if !errors.As(err, &rerr) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("Route(payload %q) = %v; want a *RouteError containing %q", tt.payload, err, tt.wantErr)
				}
				return
			}
			if err != nil || string(m.Value) != string(tt.want) || m.Value == nil {
				t.Errorf("Route(payload %q).Value = %x, %v; want %x", tt.payload, m.Value, err, tt.want)
			}
		})
	}
}

func TestRouteErrors(t *testing.T) {
	tests := []struct {
		name        string
		row         replication.Row
		wantEventID string
		wantInErr   []string
	}{
		{"null id", row("<nil>", "Order", "o-1", "Created", "{}", "<nil>"), "", []string{`"id"`, "NULL"}},
		{"empty id", row("", "Order", "o-1", "Created", "{}", "<nil>"), "", []string{`"id"`}},
		{"null aggregate type", row("e1", "<nil>", "o-1", "Created", "{}", "<nil>"), "e1", []string{`"aggregate_type"`, "no topic"}},
		{"empty aggregate type", row("e1", "", "o-1", "Created", "{}", "<nil>"), "e1", []string{`"aggregate_type"`}},
		{"null aggregate id", row("e1", "Order", "<nil>", "Created", "{}", "<nil>"), "e1", []string{`"aggregate_id"`}},
		{"illegal topic", row("e1", "Order Line", "o-1", "Created", "{}", "<nil>"), "e1", []string{`"outbox.event.Order Line"`, `"Order Line"`}},
	}
	r := mustNew(t, router.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Route(tt.row)
			var rerr *router.RouteError
			if !errors.As(err, &rerr) {
				t.Fatalf("Route(%q) = %+v, %v; want a *RouteError", tt.row.Values, m, err)
			}
			if rerr.EventID != tt.wantEventID {
				t.Errorf("Route(%q) error EventID = %q; want %q", tt.row.Values, rerr.EventID, tt.wantEventID)
			}
			for _, w := range tt.wantInErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Route(%q) error = %q; want it to contain %q", tt.row.Values, err, w)
				}
			}
		})
	}
}

// A malformed row or a missing relation is not one event's fault: every
// event after it would be incomplete, so it is a *SchemaError.
func TestRouteSchemaErrors(t *testing.T) {
	r := mustNew(t, router.Config{})
	for name, rw := range map[string]replication.Row{
		"short row":   {Relation: outbox, Values: [][]byte{[]byte("e1")}},
		"no relation": {Values: [][]byte{[]byte("e1")}},
	} {
		var se *router.SchemaError
		if _, err := r.Route(rw); !errors.As(err, &se) {
			t.Errorf("Route(%s) = %v; want a *SchemaError", name, err)
		}
	}
}

// The headers column can add headers, never override or duplicate the
// relay's own; and a value that is not a JSON object costs the event its
// extra headers, not its delivery.
func TestRouteHeadersColumn(t *testing.T) {
	const base = "id=e1 event_type=Created aggregate_type=Order"
	tests := []struct {
		name, headers, want string
		dropped             int
		bad                 bool
	}{
		{"id in headers", `{"id": "DUP", "x": "1"}`, base + " x=1", 1, false},
		{"every reserved name", `{"event_type": "X", "aggregate_type": "Y", "id": "", "id": "again"}`, base, 4, false},
		{"similar names kept", `{"ID": "a", "id ": "b", "Id": "c"}`, base + " ID=a id =b Id=c", 0, false},
		{"array", `["a"]`, base, 0, true},
		{"string", `"a"`, base, 0, true},
		{"number", `42`, base, 0, true},
		{"JSON null", `null`, base, 0, false},
		{"not JSON", `{"a":`, base, 0, true},
		{"empty text", ``, base, 0, true},
		{"invalid UTF-8 in a value", "{\"x\": \"a\xff\"}", base, 0, true},
		{"invalid UTF-8 in a key", "{\"\x93\": \"v\"}", base, 0, true},
	}
	r := mustNew(t, router.Config{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.Route(row("e1", "Order", "o-1", "Created", "{}", tt.headers))
			if err != nil {
				t.Fatalf("Route(headers %q) = %v; want the event delivered", tt.headers, err)
			}
			if got := headersString(m.Headers); got != tt.want {
				t.Errorf("Route(headers %q).Headers = %q; want %q", tt.headers, got, tt.want)
			}
			if m.DroppedHeaders != tt.dropped {
				t.Errorf("Route(headers %q).DroppedHeaders = %d; want %d", tt.headers, m.DroppedHeaders, tt.dropped)
			}
			if (m.BadHeaders != "") != tt.bad {
				t.Errorf("Route(headers %q).BadHeaders = %q; want bad = %t", tt.headers, m.BadHeaders, tt.bad)
			}
		})
	}
}

// An event without an id still has its topic: its aggregate's later events
// must wait behind it.
func TestRouteErrorKeepsTopic(t *testing.T) {
	r := mustNew(t, router.Config{})
	m, err := r.Route(row("<nil>", "Order", "o-1", "Created", "{}", "<nil>"))
	if err == nil || m.Topic != "outbox.event.Order" || string(m.Key) != "o-1" {
		t.Errorf("Route(no id) = topic %q, key %q, %v; want outbox.event.Order, o-1 and a *RouteError", m.Topic, m.Key, err)
	}
}

// A route failure keeps the headers column's entries: a requeued event must
// reach Kafka with them.
func TestRouteErrorKeepsExtraHeaders(t *testing.T) {
	r := mustNew(t, router.Config{})
	m, err := r.Route(row("e1", "Bad Type", "o-1", "Created", "{}", `{"trace": "t-1", "id": "DUP"}`))
	var re *router.RouteError
	if !errors.As(err, &re) {
		t.Fatalf("Route(bad type) = %v; want a *RouteError", err)
	}
	if got := headersString(m.Extra); got != "trace=t-1" {
		t.Errorf("Route(bad type).Extra = %q; want %q", got, "trace=t-1")
	}
	hs, dropped := router.HeaderSet{}.Build([]byte("e1"), []byte("Created"), []byte("Bad"), append(m.Extra, router.Header{Key: "id", Value: []byte("x")}))
	if got := headersString(hs); got != "id=e1 event_type=Created aggregate_type=Bad trace=t-1" || dropped != 1 {
		t.Errorf("Headers(...) = %q, %d; want the relay's three, then trace, and 1 dropped", got, dropped)
	}
}

func TestRouteColumns(t *testing.T) {
	custom := &replication.Relation{Namespace: "app", Name: "events", Columns: []replication.Column{
		{Name: "body", TypeOID: oidText},
		{Name: "kind", TypeOID: oidText},
		{Name: "event_uuid", TypeOID: oidUUID},
		{Name: "stream", TypeOID: oidText},
		{Name: "stream_id", TypeOID: oidText},
	}}
	cols := router.Columns{ID: "event_uuid", AggregateType: "stream", AggregateID: "stream_id", EventType: "kind", Payload: "body", Headers: router.NoHeaders}
	r := mustNew(t, router.Config{Columns: cols})
	m, err := r.Route(replication.Row{Relation: custom, Values: [][]byte{[]byte("hello"), []byte("Said"), []byte("e9"), []byte("Greeting"), []byte("g-1")}})
	if err != nil {
		t.Fatalf("Route = %v", err)
	}
	if got := fmt.Sprintf("%s %s %s %s", m.Topic, m.Key, m.Value, headersString(m.Headers)); got != "outbox.event.Greeting g-1 hello id=e9 event_type=Said aggregate_type=Greeting" {
		t.Errorf("Route(custom columns) = %q; want %q", got, "outbox.event.Greeting g-1 hello id=e9 event_type=Said aggregate_type=Greeting")
	}

	// The default headers column is expected unless disabled.
	r = mustNew(t, router.Config{Columns: router.Columns{ID: "event_uuid", AggregateType: "stream", AggregateID: "stream_id", EventType: "kind", Payload: "body"}})
	_, err = r.Route(replication.Row{Relation: custom, Values: make([][]byte, 5)})
	if err == nil || !strings.Contains(err.Error(), "outbox.columns.headers") || !strings.Contains(err.Error(), `"-"`) || !strings.Contains(err.Error(), `"app.events"`) {
		t.Errorf("Route(table without headers) = %v; want an error naming outbox.columns.headers, \"-\" and the table", err)
	}
}

// After ALTER TABLE a new Relation value arrives, possibly with other column
// positions or without a mapped column: the router must follow it.
func TestRouteRelationChange(t *testing.T) {
	r := mustNew(t, router.Config{})
	if _, err := r.Route(row("e1", "Order", "o-1", "Created", "{}", "<nil>")); err != nil {
		t.Fatalf("Route = %v", err)
	}

	reordered := &replication.Relation{Name: "outbox", Columns: []replication.Column{
		{Name: "payload", TypeOID: oidJSONB}, {Name: "headers", TypeOID: oidJSONB}, {Name: "event_type", TypeOID: oidText},
		{Name: "aggregate_id", TypeOID: oidText}, {Name: "aggregate_type", TypeOID: oidText}, {Name: "id", TypeOID: oidUUID},
	}}
	m, err := r.Route(replication.Row{Relation: reordered, Values: [][]byte{[]byte(`{"v":2}`), nil, []byte("Paid"), []byte("o-2"), []byte("Order"), []byte("e2")}})
	if err != nil || m.ID != "e2" || string(m.Key) != "o-2" || string(m.Value) != `{"v":2}` || m.Type != "Paid" {
		t.Errorf("Route(reordered) = %+v, %v; want event e2, key o-2, value {\"v\":2}, event type Paid", m, err)
	}

	dropped := &replication.Relation{Name: "outbox", Columns: []replication.Column{
		{Name: "id", TypeOID: oidUUID}, {Name: "aggregate_type", TypeOID: oidText}, {Name: "aggregate_id", TypeOID: oidText},
		{Name: "event_type", TypeOID: oidText}, {Name: "data", TypeOID: oidJSONB}, {Name: "headers", TypeOID: oidJSONB},
	}}
	_, err = r.Route(replication.Row{Relation: dropped, Values: make([][]byte, 6)})
	var se *router.SchemaError
	if !errors.As(err, &se) || se.Column != "payload" || !strings.Contains(err.Error(), "outbox.columns.payload") || !strings.Contains(err.Error(), `"payload"`) {
		t.Errorf("Route(table without payload) = %v; want a *SchemaError naming column \"payload\" and outbox.columns.payload", err)
	}

	// And back to the original table.
	if _, err := r.Route(row("e3", "Order", "o-1", "Created", "{}", "<nil>")); err != nil {
		t.Errorf("Route(original table again) = %v", err)
	}
}

func BenchmarkRoute(b *testing.B) {
	payload := `{"orderId":"3f1c2a9e-1b2c-4d5e-8f90-123456789abc","customer":{"id":4711,"name":"Jane Doe","email":"jane@example.com"},"lines":[{"sku":"A-1","qty":2,"price":12.5},{"sku":"B-7","qty":1,"price":99.99}],"total":124.99,"currency":"EUR"}`
	rows := []replication.Row{
		row("3f1c2a9e-1b2c-4d5e-8f90-123456789abc", "Order", "order-4711", "OrderCreated", payload, "<nil>"),
		row("4f1c2a9e-1b2c-4d5e-8f90-123456789abc", "Order", "order-4712", "OrderCreated", payload, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": 7}`),
	}
	for _, rw := range rows {
		b.Run(fmt.Sprintf("headers=%t", rw.Values[5] != nil), func(b *testing.B) {
			r := mustNew(b, router.Config{})
			b.ReportAllocs()
			b.SetBytes(int64(len(payload)))
			for b.Loop() {
				if _, err := r.Route(rw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A failed event keeps what could be read, for the retry table.
func TestRouteErrorKeepsFields(t *testing.T) {
	r, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Route(row("e-1", "Bad Type", "a-1", "Changed", `{"x": 1}`, ""))
	var re *router.RouteError
	if !errors.As(err, &re) {
		t.Fatalf("Route(aggregate type %q) error = %v; want a *RouteError", "Bad Type", err)
	}
	if m.ID != "e-1" || m.AggregateType != "Bad Type" || m.AggregateID != "a-1" || m.Type != "Changed" ||
		string(m.Key) != "a-1" || string(m.Value) != `{"x": 1}` || m.Topic != "" {
		t.Errorf("Route of an unroutable event = %+v; want its id, aggregate, event type, key and value, and no topic", m)
	}
}

// TestHeldEventPinsOnlyItsRow: an event the relay still holds (in a Kafka
// write, on its way to the retry table) must not keep other rows in memory.
// Its header values are slices of its row's bytes, and the headers of many
// events shared one array, so one held event of a transaction of large rows
// pinned all of them (issue 34).
func TestHeldEventPinsOnlyItsRow(t *testing.T) {
	const rows, size = 40, 1 << 20
	r := mustNew(t, router.Config{})
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	before := heap()
	var held router.Message
	for i := range rows {
		// One allocation per row, as the decoder makes it.
		id := fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		fields := []string{id, "Order", "o-1", "Created", `"` + strings.Repeat("x", size) + `"`, "", "2026-01-01 00:00:00+00"}
		data := []byte(strings.Join(fields, ""))
		vals := make([][]byte, len(fields))
		for j, f := range fields {
			vals[j], data = data[:len(f):len(f)], data[len(f):]
		}
		vals[5] = nil
		m, err := r.Route(replication.Row{Relation: outbox, Values: vals})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			held = m
		}
	}
	grown := int64(heap()) - int64(before)
	if len(held.Headers) == 0 || held.ID != "00000000-0000-0000-0000-000000000000" {
		t.Fatalf("held event = %q with %d headers; want the first one, with headers", held.ID, len(held.Headers))
	}
	if limit := int64(3 * size); grown > limit {
		t.Errorf("heap grew by %d bytes holding one event of a %d-byte row of %d; want at most %d: a held event pins other rows", grown, size, rows, limit)
	}
	runtime.KeepAlive(held)
	runtime.KeepAlive(r)
}

// Route appends the set's own headers and then Extra without filtering it:
// the headers it sends must be those HeaderSet.Build (the retry worker's
// path) makes of the same Extra, with nothing dropped.
func TestRouteHeadersAreBuild(t *testing.T) {
	fields, err := router.ParseFields("event_type:header:kind,aggregate_id:header")
	if err != nil {
		t.Fatal(err)
	}
	configs := map[string]router.Config{
		"default":            {},
		"id only":            {Headers: []string{router.HeaderID}},
		"none, fields":       {Headers: []string{}, Fields: fields},
		"binary CloudEvents": {Fields: fields, CloudEvents: router.CloudEvents{Mode: router.CloudEventsBinary, Source: "/orders"}},
	}
	headers := `{"id": "DUP", "event_type": "X", "aggregate_type": "Y", "kind": "K", "aggregate_id": "A", "ce_id": "C", "content-type": "T", "x": "1"}`
	for name, cfg := range configs {
		r := mustNew(t, cfg)
		m, err := r.Route(row("e1", "Order", "o-1", "Created", "{}", headers))
		if err != nil {
			t.Fatalf("%s: Route = %v", name, err)
		}
		want, dropped := r.Headers().Build([]byte("e1"), []byte("Created"), []byte("Order"), m.Extra)
		if got := headersString(m.Headers); got != headersString(want) || dropped != 0 {
			t.Errorf("%s: Route(...).Headers = %q; want Build's %q with none dropped (dropped %d)", name, got, headersString(want), dropped)
		}
	}
}
