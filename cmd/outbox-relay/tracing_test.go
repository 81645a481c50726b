package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// otlpReceiver is an OTLP/HTTP trace receiver, as a collector's: POST
// /v1/traces with a binary protobuf ExportTraceServiceRequest (the
// collector's own message type, so the test checks the wire format rather
// than the relay's encoding of it), on a loopback port, keeping what the
// relay's exporter sends.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []*tracepb.Span
	attrs map[string]string // of the last resource
	bad   []string          // requests that were not OTLP/HTTP protobuf exports
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	body, err := io.ReadAll(req.Body)
	var ex collectortrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(body, &ex)
	}
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
		r.bad = append(r.bad, fmt.Sprintf("%s %s Content-Type %q: %v", req.Method, req.URL.Path, req.Header.Get("Content-Type"), err))
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	for _, rs := range ex.ResourceSpans {
		r.attrs = map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			r.attrs[kv.Key] = kv.GetValue().GetStringValue()
		}
		for _, ss := range rs.ScopeSpans {
			r.spans = append(r.spans, ss.Spans...)
		}
	}
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

func startOTLPReceiver(t *testing.T) (*otlpReceiver, string) {
	t.Helper()
	r := &otlpReceiver{}
	srv := httptest.NewServer(r) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return r, srv.URL
}

// TestTraceSpansExported follows one trace through the relay: the outbox
// row's traceparent (a headers-column entry here; the tracing column is
// TestCloudEventsEndToEnd's), the relay's span exported over OTLP to a real
// OTLP/HTTP receiver as the row span's child, from the commit to the Kafka
// acknowledgement, and the Kafka message's traceparent naming that span. An
// event without a trace context gets neither a span nor a header.
func TestTraceSpansExported(t *testing.T) {
	dsn, _ := dbEnv(t)
	setUp(t)
	recv, endpoint := startOTLPReceiver(t)
	aggType, topic, k := relayTopic(t, "Tr")
	t.Setenv("RELAY_TRACING_OTLP_ENDPOINT", endpoint)
	t.Setenv("RELAY_TRACING_SERVICE_NAME", "relay-under-test")

	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		rowSpan = "00f067aa0ba902b7"
	)
	traced, plain := newID(t, dsn), newID(t, dsn)
	testenv.ExecAs(t, dsn,
		`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES ('`+traced+`', '`+aggType+`', 'a-1', 'Placed', '{}', '{"traceparent": "00-`+traceID+`-`+rowSpan+`-01"}')`,
		`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('`+plain+`', '`+aggType+`', 'a-1', 'Placed', '{}')`)
	inserted := time.Now()

	p := startSecRelay(t, os.Environ(), "run")
	msgs := k.WaitMessages(t, topic, 2)
	// SIGTERM: a clean stop flushes the exporter's queue.
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(t, time.Minute); err != nil {
		t.Fatalf("relay exit: %v\n%s", err, p.stderr.String())
	}

	hs := func(i int) map[string]string {
		m := map[string]string{}
		for _, h := range msgs[i].Headers {
			m[h.Key] = string(h.Value)
		}
		return m
	}
	tp := hs(0)["traceparent"]
	parts := strings.Split(tp, "-")
	if len(parts) != 4 || parts[0] != "00" || parts[1] != traceID || parts[3] != "01" || parts[2] == rowSpan {
		t.Fatalf("traced message's traceparent %q; want 00-%s-<the relay's span>-01", tp, traceID)
	}
	if _, has := hs(1)["traceparent"]; has {
		t.Errorf("an event without a trace context got traceparent %q", hs(1)["traceparent"])
	}

	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Errorf("the receiver refused %d requests: %q", len(recv.bad), recv.bad)
	}
	if len(recv.spans) != 1 {
		t.Fatalf("the receiver got %d spans; want 1, the traced event's (relay log:\n%s)", len(recv.spans), p.stderr.String())
	}
	s := recv.spans[0]
	attrs := map[string]string{}
	for _, kv := range s.Attributes {
		attrs[kv.Key] = kv.GetValue().GetStringValue()
	}
	start, end := time.Unix(0, int64(s.StartTimeUnixNano)), time.Unix(0, int64(s.EndTimeUnixNano))
	switch {
	case hex.EncodeToString(s.TraceId) != traceID:
		t.Errorf("span trace id %x; want the row's %s", s.TraceId, traceID)
	case hex.EncodeToString(s.SpanId) != parts[2]:
		t.Errorf("span id %x; want the one the message's traceparent names, %s", s.SpanId, parts[2])
	case hex.EncodeToString(s.ParentSpanId) != rowSpan:
		t.Errorf("span parent %x; want the row's span %s", s.ParentSpanId, rowSpan)
	case s.Name != "send "+topic || s.Kind != tracepb.Span_SPAN_KIND_PRODUCER:
		t.Errorf("span %q kind %v; want \"send %s\", producer", s.Name, s.Kind, topic)
	case attrs["messaging.system"] != "kafka" || attrs["messaging.destination.name"] != topic ||
		attrs["messaging.operation.type"] != "send" || attrs["messaging.message.id"] != traced:
		t.Errorf("span attributes %v; want the Kafka messaging conventions with this topic and event id", attrs)
	case attrs["outbox.aggregate_type"] != aggType || attrs["outbox.event_type"] != "Placed":
		t.Errorf("span attributes %v; want outbox.aggregate_type %s, outbox.event_type Placed", attrs, aggType)
	case s.Flags != 0x301:
		// Sampled (the row's flags), and the parent is known to be remote.
		t.Errorf("span flags %#x; want 0x301 (sampled, remote parent)", s.Flags)
	case end.Before(start) || start.Before(inserted.Add(-time.Minute)) || end.After(time.Now()):
		t.Errorf("span from %v to %v; want from the commit (about %v) to the acknowledgement", start, end, inserted)
	case recv.attrs["service.name"] != "relay-under-test":
		t.Errorf("resource %v; want service.name relay-under-test", recv.attrs)
	}
}

func newID(t *testing.T, dsn string) string {
	return testenv.QueryString(t, dsn, `SELECT gen_random_uuid()::text`)
}
