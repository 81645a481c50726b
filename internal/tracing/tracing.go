// Package tracing exports, over OTLP/HTTP (protobuf), one OpenTelemetry span
// per delivered event that carries a trace context: the relay's part of the event's trace, from its
// transaction's commit in Postgres to Kafka's acknowledgement, as a child of
// the context the outbox row carried.
//
// Invariants:
//
//   - The span's identity is chosen when the event is routed (event.Span):
//     the message's traceparent header names that span, so a consumer's span
//     is its child, and the span is exported under exactly those ids once
//     Kafka acknowledged the event. An event Kafka refused (it went to the
//     retry table) gets no span from the live path.
//   - Tracing never holds up delivery: spans are batched and exported by the
//     OpenTelemetry SDK's own goroutine, dropped when its queue is full, and
//     an exporter that cannot reach its collector only logs (a batch is sent
//     once, within 10 s, and dropped if refused).
//   - The package links no gRPC: an unused exporter must not cost the relay
//     memory (see otlpHTTP).
//   - The span follows OpenTelemetry's messaging conventions for Kafka
//     (semconv 1.37): name "send <topic>", kind producer, messaging.system
//     kafka, messaging.operation.type send, the destination, the message id
//     and key.
package tracing

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/outbox-relay/outbox-relay/event"
)

// Config configures the exporter.
type Config struct {
	// Endpoint is the OTLP/HTTP collector: http://host:port (plaintext) or
	// https://host:port (TLS with the system's roots), where spans are
	// POSTed to /v1/traces (a URL that ends in /v1/traces is used as is).
	// OTLP/HTTP's port is 4318; 4317 is OTLP/gRPC's, which the relay does
	// not speak.
	Endpoint    string
	ServiceName string // resource service.name; default outbox-relay
	Version     string // resource service.version
}

// A Tracer exports the spans of delivered events. A nil *Tracer does nothing.
type Tracer struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

// New starts an exporter to cfg.Endpoint. It does not contact the
// collector: spans wait in the SDK's queue until it answers.
func New(ctx context.Context, cfg Config) (*Tracer, error) {
	u, err := ParseEndpoint(cfg.Endpoint)
	if err != nil {
		return nil, fmt.Errorf("tracing.otlp_endpoint: %w", err)
	}
	exp := newOTLPHTTP(u)
	if cfg.ServiceName == "" {
		cfg.ServiceName = "outbox-relay"
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(cfg.ServiceName), semconv.ServiceVersion(cfg.Version))
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		// The row's sampling decision (its traceparent's flags) decides.
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())),
		sdktrace.WithIDGenerator(chosenIDs{}),
	)
	return &Tracer{tp: tp, tracer: tp.Tracer("github.com/outbox-relay/outbox-relay")}, nil
}

// Shutdown exports the spans still queued, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil {
		return nil
	}
	return t.tp.Shutdown(ctx)
}

// Delivered exports the spans of the acknowledged events that carry one,
// ending at ack.
func (t *Tracer) Delivered(evs []event.Event, ack time.Time) {
	if t == nil {
		return
	}
	for i := range evs {
		e := &evs[i]
		if e.Span == nil {
			continue
		}
		s := e.Span
		parent := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID(s.TraceID), SpanID: trace.SpanID(s.Parent), TraceFlags: trace.TraceFlags(s.Flags), TraceState: parseState(s.State), Remote: true,
		})
		ctx := trace.ContextWithRemoteSpanContext(context.WithValue(context.Background(), spanIDKey{}, trace.SpanID(s.SpanID)), parent)
		start := e.CommitTime
		if start.IsZero() || start.After(ack) {
			start = ack
		}
		_, span := t.tracer.Start(ctx, "send "+e.Topic,
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithTimestamp(start),
			trace.WithAttributes(
				semconv.MessagingSystemKafka,
				semconv.MessagingOperationTypeSend,
				semconv.MessagingOperationName("send"),
				semconv.MessagingDestinationName(e.Topic),
				semconv.MessagingMessageID(e.ID),
				semconv.MessagingKafkaMessageKey(string(e.Key)),
				attribute.String("outbox.aggregate_type", e.AggregateType),
				attribute.String("outbox.event_type", e.Type),
			))
		span.End(trace.WithTimestamp(ack))
	}
}

func parseState(s string) trace.TraceState {
	ts, err := trace.ParseTraceState(s)
	if err != nil {
		return trace.TraceState{}
	}
	return ts
}

// spanIDKey carries the span id chosen at routing into the SDK's IDGenerator.
type spanIDKey struct{}

// chosenIDs gives a span the id its event's traceparent header already
// names. The SDK asks only for a span id here: the trace id is the parent's.
type chosenIDs struct{}

func (chosenIDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	// A root span never happens (every span has the row's parent); an
	// all-zero id would make the SDK drop it rather than invent one.
	return trace.TraceID{}, chosenSpanID(ctx)
}

func (chosenIDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	return chosenSpanID(ctx)
}

func chosenSpanID(ctx context.Context) trace.SpanID {
	id, _ := ctx.Value(spanIDKey{}).(trace.SpanID)
	return id
}

// ParseEndpoint checks an OTLP/HTTP collector endpoint and returns the URL
// spans are POSTed to: http(s)://host:port[/path]/v1/traces.
func ParseEndpoint(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err == nil && (u.Scheme == "grpc" || u.Scheme == "grpcs") {
		return "", fmt.Errorf("%q: the relay exports over OTLP/HTTP, not gRPC: give the collector's OTLP/HTTP receiver as http://host:4318 (plaintext) or https://host:4318 (TLS)", endpoint)
	}
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q: want the collector's OTLP/HTTP receiver as http://host:port (plaintext) or https://host:port (TLS), e.g. http://127.0.0.1:4318", endpoint)
	}
	p := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(p, "/v1/traces") {
		p += "/v1/traces"
	}
	u.Path, u.RawPath = p, ""
	return u.String(), nil
}

// GRPCPort reports whether endpoint names port 4317, OTLP/gRPC's: most
// likely a collector that will not understand the relay's OTLP/HTTP.
func GRPCPort(endpoint string) bool {
	u, err := url.Parse(endpoint)
	return err == nil && u.Port() == "4317"
}
