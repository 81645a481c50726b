package router

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/outbox-relay/outbox-relay/replication"
)

func TestJavaProperties(t *testing.T) {
	for text, want := range map[string]map[string]string{
		"traceparent=a\ntracestate=b\n":                   {"traceparent": "a", "tracestate": "b"},
		"#Tue Nov 25\n! comment\n  traceparent : a  \r\n": {"traceparent": "a  "},
		"traceparent a":           {"traceparent": "a"},
		"k\\=ey=v\\=al\\u0041\\n": {"k=ey": "v=alA\n"},
		"tracestate=a,\\\n    b":  {"tracestate": "a,b"},
		"x=1\nx=2":                {"x": "2"},
		"":                        {},
	} {
		got := javaProperties(text)
		if len(got) != len(want) {
			t.Errorf("javaProperties(%q) = %q; want %q", text, got, want)
			continue
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("javaProperties(%q)[%q] = %q; want %q", text, k, got[k], v)
			}
		}
	}
}

func TestValidTraceparent(t *testing.T) {
	for s, ok := range map[string]bool{
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      true,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more": true, // a later version may add fields
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more": false,
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01":      false,
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01":      false,
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01":      false,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7":         false,
		"not-a-trace": false,
	} {
		if validTraceparent(s) != ok {
			t.Errorf("validTraceparent(%q) = %v; want %v", s, !ok, ok)
		}
	}
}

// ceRel is an outbox relation with a timestamp and a tracing column.
var ceRel = &replication.Relation{Namespace: "public", Name: "outbox", Columns: []replication.Column{
	{Name: "id", TypeOID: pgtype.TextOID}, {Name: "aggregate_type", TypeOID: pgtype.TextOID}, {Name: "aggregate_id", TypeOID: pgtype.TextOID},
	{Name: "event_type", TypeOID: pgtype.TextOID}, {Name: "payload", TypeOID: pgtype.JSONBOID}, {Name: "headers", TypeOID: pgtype.JSONBOID},
	{Name: "created_at", TypeOID: pgtype.TimestamptzOID}, {Name: "trace", TypeOID: pgtype.TextOID},
}}

func ceRow(payload, headers, trace string) replication.Row {
	v := func(s string) []byte {
		if s == "" {
			return nil
		}
		return []byte(s)
	}
	return replication.Row{Relation: ceRel, Values: [][]byte{[]byte("e-1"), []byte("Order"), []byte("o-1"), []byte("Placed"),
		v(payload), v(headers), []byte("2026-11-25 02:00:00.5+00"), v(trace)}}
}

func ceRouter(t *testing.T, mode CloudEventsMode) *Router {
	t.Helper()
	r, err := New(Config{Columns: Columns{Timestamp: "created_at", TracingSpanContext: "trace"},
		CloudEvents: CloudEvents{Mode: mode, Source: "/svc"}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func headerMap(hs []Header) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.Key] = string(h.Value)
	}
	return m
}

const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestCloudEventsBinary(t *testing.T) {
	r := ceRouter(t, CloudEventsBinary)
	// The headers column tries to set an attribute: the row's own wins.
	m, err := r.Route(ceRow(`{"a":1}`, `{"ce_id":"forged","ce_custom":"x"}`, "traceparent="+tp))
	if err != nil {
		t.Fatal(err)
	}
	h := headerMap(m.Headers)
	for k, v := range map[string]string{"ce_specversion": "1.0", "ce_id": "e-1", "ce_source": "/svc", "ce_type": "Placed",
		"ce_subject": "o-1", "ce_time": "2026-11-25T02:00:00.5Z", "ce_partitionkey": "o-1", "ce_traceparent": tp,
		"traceparent": tp, "content-type": "application/json", "ce_custom": "x"} {
		if h[k] != v {
			t.Errorf("header %s = %q; want %q (all: %v)", k, h[k], v, h)
		}
	}
	if m.DroppedHeaders != 1 || string(m.Value) != `{"a":1}` {
		t.Errorf("dropped %d, value %s; want 1 (the forged ce_id) and the payload as stored", m.DroppedHeaders, m.Value)
	}
}

func TestCloudEventsStructured(t *testing.T) {
	r := ceRouter(t, CloudEventsStructured)
	m, err := r.Route(ceRow(`{"a": 1}`, "", "traceparent="+tp+"\ntracestate=k=v"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"specversion":"1.0","id":"e-1","source":"/svc","type":"Placed","subject":"o-1","time":"2026-11-25T02:00:00.5Z",` +
		`"datacontenttype":"application/json","partitionkey":"o-1","traceparent":"` + tp + `","tracestate":"k=v","data":{"a": 1}}`
	if string(m.Value) != want {
		t.Errorf("value\n%s\nwant\n%s", m.Value, want)
	}
	if ct := headerMap(m.Headers)["content-type"]; ct != "application/cloudevents+json; charset=UTF-8" {
		t.Errorf("content-type %q", ct)
	}
	// A failed event keeps its envelope: the retry table sends its stored value.
	row := ceRow(`{"a": 1}`, "", "traceparent=garbage")
	row.Values[1] = nil // no aggregate type: no topic
	m, err = r.Route(row)
	if err == nil || !strings.HasPrefix(string(m.Value), `{"specversion":"1.0","id":"e-1"`) || m.BadTrace == "" {
		t.Errorf("unroutable event: err %v, value %s, BadTrace %q; want a RouteError, the envelope, and the bad trace noted", err, m.Value, m.BadTrace)
	}
}

func TestCloudEventsConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{CloudEvents: CloudEvents{Mode: "binary"}}, "CloudEvents.Source: empty"},
		{Config{CloudEvents: CloudEvents{Mode: "json", Source: "/s"}}, `CloudEvents.Mode: "json"`},
		{Config{CloudEvents: CloudEvents{Source: "/s"}}, "is set but CloudEvents.Mode is not"},
		{Config{Converter: ConverterJSON, CloudEvents: CloudEvents{Mode: "binary", Source: "/s"}}, "Converter: json and CloudEvents do not go together"},
		{Config{Fields: []Field{{Column: "c", Placement: PlaceEnvelope, Alias: "c"}}, CloudEvents: CloudEvents{Mode: "binary", Source: "/s"}}, "place it as a header instead"},
		{Config{TombstoneOnEmptyPayload: true, CloudEvents: CloudEvents{Mode: "structured", Source: "/s"}}, "a tombstone removes"},
		{Config{Columns: Columns{EventType: NoHeaders}, Headers: []string{"id"}, CloudEvents: CloudEvents{Mode: "binary", Source: "/s"}}, "needs the event type column"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v; want an error containing %q", c.cfg, err, c.want)
		}
	}
}

// With spans on, a traced event gets a span of its own: same trace, the row's
// span as parent, and its traceparent header names the new span.
func TestSpanMinted(t *testing.T) {
	r, err := New(Config{Columns: Columns{TracingSpanContext: "trace", Timestamp: "created_at"}, Spans: true})
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Route(ceRow(`{}`, "", "traceparent="+tp+"\ntracestate=k=v"))
	if err != nil {
		t.Fatal(err)
	}
	got := headerMap(m.Headers)["traceparent"]
	if m.Span == nil || !strings.HasPrefix(got, tp[:36]) || got == tp || !strings.HasSuffix(got, "-01") || !validTraceparent(got) {
		t.Fatalf("traceparent %q, span %+v; want the row's trace with a new span id", got, m.Span)
	}
	if hexOf(m.Span.Parent[:]) != tp[36:52] || hexOf(m.Span.SpanID[:]) != got[36:52] || m.Span.State != "k=v" || m.Span.Flags != 1 {
		t.Errorf("span %+v; want parent %s, id %s, state k=v, flags 1", m.Span, tp[36:52], got[36:52])
	}
	// No trace context: no span.
	if m, _ := r.Route(ceRow(`{}`, "", "")); m.Span != nil {
		t.Errorf("an event without a trace context got span %+v", m.Span)
	}
}

func hexOf(b []byte) string { return fmt.Sprintf("%x", b) }
