package tracing

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{in: "http://127.0.0.1:4318", want: "http://127.0.0.1:4318/v1/traces"},
		{in: "https://collector:4318/", want: "https://collector:4318/v1/traces"},
		{in: "https://gw.example/otlp", want: "https://gw.example/otlp/v1/traces"},
		{in: "http://collector:4318/v1/traces", want: "http://collector:4318/v1/traces"},
		{in: "grpc://collector:4317", err: "OTLP/HTTP, not gRPC"},
		{in: "collector:4318", err: "want the collector's OTLP/HTTP receiver"},
		{in: "http://", err: "want the collector's OTLP/HTTP receiver"},
	} {
		got, err := ParseEndpoint(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "4318")):
			t.Errorf("ParseEndpoint(%q) = %q, %v; want an error saying %q and naming port 4318", tc.in, got, err, tc.err)
		}
	}
	if !GRPCPort("http://collector:4317") || GRPCPort("http://collector:4318") {
		t.Errorf("GRPCPort: want true for port 4317 only")
	}
}

// TestExportAttributeTypes sends a span with one attribute of each type
// through the exporter to an OTLP/HTTP receiver that decodes the collector's
// own ExportTraceServiceRequest, and checks each value arrives typed.
func TestExportAttributeTypes(t *testing.T) {
	var (
		mu   sync.Mutex
		reqs []*collectortrace.ExportTraceServiceRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		reqs = append(reqs, &req)
		mu.Unlock()
	}))
	defer srv.Close()
	u, err := ParseEndpoint(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(newOTLPHTTP(u)))
	_, span := tp.Tracer("test").Start(context.Background(), "s")
	span.SetAttributes(
		attribute.String("s", "x"), attribute.Bool("b", true), attribute.Int64("i", -7), attribute.Float64("f", 1.5),
		attribute.StringSlice("ss", []string{"a", "b"}), attribute.Int64Slice("is", []int64{1, 2}),
	)
	span.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(reqs) != 1 || len(reqs[0].ResourceSpans) != 1 || len(reqs[0].ResourceSpans[0].ScopeSpans) != 1 || len(reqs[0].ResourceSpans[0].ScopeSpans[0].Spans) != 1 {
		t.Fatalf("receiver got %v; want one request with one span", reqs)
	}
	ss := reqs[0].ResourceSpans[0].ScopeSpans[0]
	if ss.Scope.GetName() != "test" || ss.Spans[0].Name != "s" {
		t.Errorf("scope %q span %q; want test, s", ss.Scope.GetName(), ss.Spans[0].Name)
	}
	got := map[string]*commonpb.AnyValue{}
	for _, kv := range ss.Spans[0].Attributes {
		got[kv.Key] = kv.Value
	}
	str := func(v string) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v}}
	}
	i64 := func(v int64) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v}}
	}
	arr := func(vs ...*commonpb.AnyValue) *commonpb.AnyValue {
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: vs}}}
	}
	want := map[string]*commonpb.AnyValue{
		"s": str("x"), "b": {Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}, "i": i64(-7),
		"f": {Value: &commonpb.AnyValue_DoubleValue{DoubleValue: 1.5}}, "ss": arr(str("a"), str("b")), "is": arr(i64(1), i64(2)),
	}
	for k, w := range want {
		if !proto.Equal(got[k], w) {
			t.Errorf("attribute %s = %v; want %v", k, got[k], w)
		}
	}
}
