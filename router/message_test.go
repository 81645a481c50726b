package router_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

func headerText(m router.Message) string {
	var parts []string
	for _, h := range m.Headers {
		parts = append(parts, h.Key+"="+string(h.Value))
	}
	return strings.Join(parts, " ")
}

// TestRouteMessageAsRow: a message and a row with the same values make the
// same Kafka message.
func TestRouteMessageAsRow(t *testing.T) {
	r := mustNew(t, router.Config{})
	fromRow, err := r.Route(row("e1", "Order", "o-1", "Created", `{"a": 1}`, `{"x": "y", "id": "evil"}`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.RouteMessage([]byte(`{"id": "e1", "aggregate_type": "Order", "aggregate_id": "o-1", "event_type": "Created",
		"payload": {"a": 1}, "headers": {"x": "y", "id": "evil"}, "unread": [1, 2]}`))
	if err != nil {
		t.Fatalf("RouteMessage: %v", err)
	}
	if m.Topic != fromRow.Topic || string(m.Key) != string(fromRow.Key) || string(m.Value) != string(fromRow.Value) || headerText(m) != headerText(fromRow) {
		t.Errorf("RouteMessage = topic %q key %q value %q headers %q; want the row's %q %q %q %q",
			m.Topic, m.Key, m.Value, headerText(m), fromRow.Topic, fromRow.Key, fromRow.Value, headerText(fromRow))
	}
	if m.ID != "e1" || m.AggregateType != "Order" || m.AggregateID != "o-1" || m.Type != "Created" || m.DroppedHeaders != 1 {
		t.Errorf("RouteMessage envelope = %+v; want id e1, Order/o-1, Created, one header dropped", m.Event)
	}
}

// TestRouteMessageDebezium reads Debezium's message outbox shape with the
// Debezium layout: its keys, and the header id only.
func TestRouteMessageDebezium(t *testing.T) {
	cols, err := sql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	r := mustNew(t, router.Config{Columns: cols, Headers: sql.LayoutDebezium.Headers()})
	m, err := r.RouteMessage([]byte(`{"id":"4d47e190-0402-4048-bc2c-89dd54343cdc","aggregatetype":"order","aggregateid":"1","type":"OrderCreated","payload":{"id":1,"customerId":123}}`))
	if err != nil {
		t.Fatalf("RouteMessage: %v", err)
	}
	if m.Topic != "outbox.event.order" || string(m.Key) != "1" || string(m.Value) != `{"id":1,"customerId":123}` || headerText(m) != "id=4d47e190-0402-4048-bc2c-89dd54343cdc" {
		t.Errorf("RouteMessage = %q %q %q %q; want outbox.event.order, key 1, the payload's JSON, header id only", m.Topic, m.Key, m.Value, headerText(m))
	}
}

func TestRouteMessageValues(t *testing.T) {
	r := mustNew(t, router.Config{Columns: router.Columns{Timestamp: "ts"}})
	tests := []struct {
		name, content  string
		id, key, value string
		nilValue       bool
		time           time.Time
	}{
		{"string payload is its text", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","payload":"line\n\"q\" é\u0001"}`, "a", "k", "line\n\"q\" é\x01", false, time.Time{}},
		{"number ids", `{"id":42,"aggregate_type":"T","aggregate_id":-7.5e3,"event_type":"E","payload":[1, 2]}`, "42", "-7.5e3", "[1, 2]", false, time.Time{}},
		{"null payload", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","payload":null}`, "a", "k", "", true, time.Time{}},
		{"no payload", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E"}`, "a", "k", "", true, time.Time{}},
		{"timestamp", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","payload":true,"ts":"2026-11-26T01:02:03.456+01:00"}`, "a", "k", "true", false,
			time.Date(2026, 11, 26, 0, 2, 3, 456e6, time.UTC)},
		{"unicode and escapes in keys and ids", `{"id":"\u00e9✓😀","aggregate_type":"T","aggregate_id":"k\ttab","event_type":"E","payload":{}}`, "é✓😀", "k\ttab", "{}", false, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.RouteMessage([]byte(tt.content))
			if err != nil {
				t.Fatalf("RouteMessage(%s) = %v", tt.content, err)
			}
			if m.ID != tt.id || string(m.Key) != tt.key || string(m.Value) != tt.value || (m.Value == nil) != tt.nilValue {
				t.Errorf("RouteMessage(%s) = id %q key %q value %q (nil %v); want %q %q %q (nil %v)", tt.content, m.ID, m.Key, m.Value, m.Value == nil, tt.id, tt.key, tt.value, tt.nilValue)
			}
			if !m.Time.Equal(tt.time) {
				t.Errorf("RouteMessage(%s).Time = %v; want %v", tt.content, m.Time, tt.time)
			}
		})
	}
}

// TestRouteMessageHostile: content that is no outbox event is a *RouteError
// with a reason, never a guess; what could be read stays with the event so
// that it waits in its aggregate's lane.
func TestRouteMessageHostile(t *testing.T) {
	r := mustNew(t, router.Config{Columns: router.Columns{Timestamp: "ts"}})
	huge := `{"id":"h","aggregate_type":"T","aggregate_id":"k","event_type":"E","payload":"` + strings.Repeat("x", 5<<20) + `"}`
	tests := []struct {
		name, content  string
		reason         string // in the RouteError's reason
		valueIsContent bool
		aggType, aggID string // what was read
	}{
		{"empty", ``, "not valid JSON", true, "", ""},
		{"not JSON", `{not json`, "not valid JSON", true, "", ""},
		{"trailing garbage", `{"id":"a"} x`, "not valid JSON", true, "", ""},
		{"raw control character", "{\"id\":\"a\x01\"}", "not valid JSON", true, "", ""},
		{"invalid UTF-8", "{\"id\":\"a\xff\"}", "not valid UTF-8", true, "", ""},
		{"array", `[1,2]`, "not an object", true, "", ""},
		{"string", `"event"`, "not an object", true, "", ""},
		{"number", `12`, "not an object", true, "", ""},
		{"null", `null`, "not an object", true, "", ""},
		{"duplicate id", `{"id":"a","aggregate_type":"T","aggregate_id":"k","id":"b"}`, `the key "id" twice`, true, "", ""},
		{"id an object", `{"id":{"x":1},"aggregate_type":"T","aggregate_id":"k","event_type":"E"}`, `"id" (field id) is an object`, false, "T", "k"},
		{"aggregate type a number", `{"id":"a","aggregate_type":7,"aggregate_id":"k","event_type":"E"}`, `"aggregate_type" (field aggregate_type) is a number; want a string`, false, "", "k"},
		{"event type an array", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":["E"]}`, `"event_type"`, false, "T", "k"},
		{"aggregate id a boolean", `{"id":"a","aggregate_type":"T","aggregate_id":true,"event_type":"E"}`, `"aggregate_id"`, false, "T", ""},
		{"bad timestamp", `{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","ts":"yesterday"}`, "not an RFC 3339 time", false, "T", "k"},
		{"no id", `{"aggregate_type":"T","aggregate_id":"k","event_type":"E"}`, "event id", false, "T", "k"},
		{"empty object", `{}`, "aggregate type", false, "", ""},
		{"invalid topic", `{"id":"a","aggregate_type":"bad type","aggregate_id":"k","event_type":"E"}`, "topic", false, "bad type", "k"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := r.RouteMessage([]byte(tt.content))
			var re *router.RouteError
			if !errors.As(err, &re) || !strings.Contains(re.Reason, tt.reason) {
				t.Fatalf("RouteMessage(%.60q) error = %v; want a *RouteError saying %q", tt.content, err, tt.reason)
			}
			// The field's setting (outbox.columns.<field>) is the CLI's to
			// name, by the code (cmd's TestRetryReasonRendered).
			if strings.Contains(tt.reason, "(field ") && re.Code != router.CodeMessageFieldKind {
				t.Errorf("RouteMessage(%.60q) code = %q; want %q", tt.content, re.Code, router.CodeMessageFieldKind)
			}
			if tt.valueIsContent && string(m.Value) != tt.content {
				t.Errorf("RouteMessage(%.60q).Value = %.60q; want the content itself", tt.content, m.Value)
			}
			if m.AggregateType != tt.aggType || m.AggregateID != tt.aggID {
				t.Errorf("RouteMessage(%.60q) read %q/%q; want %q/%q", tt.content, m.AggregateType, m.AggregateID, tt.aggType, tt.aggID)
			}
			if m.Headers != nil {
				t.Errorf("RouteMessage(%.60q).Headers = %v; want nil for a failed event", tt.content, m.Headers)
			}
		})
	}
	m, err := r.RouteMessage([]byte(huge))
	if err != nil || len(m.Value) != 5<<20 {
		t.Errorf("RouteMessage(5 MiB payload) = %d bytes, %v; want it routed (the sink judges its size)", len(m.Value), err)
	}
	// Headers that are not an object do not hold the event back, as with
	// the headers column.
	m, err = r.RouteMessage([]byte(`{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","headers":"not an object"}`))
	if err != nil || m.BadHeaders == "" {
		t.Errorf("RouteMessage(headers a string) = %v, BadHeaders %q; want delivered without extra headers", err, m.BadHeaders)
	}
}

func TestRouteMessageCloudEvents(t *testing.T) {
	r := mustNew(t, router.Config{CloudEvents: router.CloudEvents{Mode: router.CloudEventsStructured, Source: "/s"}})
	for _, tt := range []struct{ payload, data string }{
		{`{"a":1}`, `"data":{"a":1}`},
		{`"plain text"`, `"data":"plain text"`},
	} {
		m, err := r.RouteMessage([]byte(fmt.Sprintf(`{"id":"a","aggregate_type":"T","aggregate_id":"k","event_type":"E","payload":%s}`, tt.payload)))
		if err != nil || !strings.Contains(string(m.Value), tt.data) {
			t.Errorf("structured CloudEvent of payload %s = %s, %v; want %s", tt.payload, m.Value, err, tt.data)
		}
	}
}
