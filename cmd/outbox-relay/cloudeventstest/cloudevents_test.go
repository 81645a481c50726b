package cloudeventstest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// ceSchema is the CloudEvents 1.0 JSON schema (the spec's
// cloudevents.json, as the CloudEvents JavaScript SDK 10.0.0 ships it in
// dist/schema/v1.js; Apache-2.0). The spec's repository is not a Go module,
// so it is kept here.
const ceSchema = "testdata/cloudevents-1.0.schema.json"

func compileCESchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open(ceSchema)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc, err := jsonschema.UnmarshalJSON(f)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("cloudevents.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("cloudevents.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validateCEJSON validates one event in the JSON format against the schema.
func validateCEJSON(t *testing.T, s *jsonschema.Schema, b []byte) error {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return err
	}
	return s.Validate(v)
}

// The schema check must refuse what is not a CloudEvent, or it proves nothing.
func TestCloudEventsSchemaRefuses(t *testing.T) {
	s := compileCESchema(t)
	for doc, ok := range map[string]bool{
		`{"specversion":"1.0","id":"1","source":"/s","type":"t"}`:                    true,
		`{"specversion":"1.0","id":"1","source":"/s"}`:                               false, // no type
		`{"specversion":"1.0","id":"","source":"/s","type":"t"}`:                     false, // empty id
		`{"specversion":"1.0","id":"1","source":"/s","type":"t","time":"yesterday"}`: false,
	} {
		if err := validateCEJSON(t, s, []byte(doc)); (err == nil) != ok {
			t.Errorf("schema on %s: %v; want valid %v", doc, err, ok)
		}
	}
}

// ceRow is one outbox row of the CloudEvents test and what its event must carry.
type ceRow struct {
	id, payload, spanContext, headers string
	traceparent, tracestate           string // expected; "" none
}

// TestCloudEventsEndToEnd runs the relay with message.format cloudevents in
// both modes of the Kafka protocol binding against the dev servers, reads
// every message back with the CloudEvents Go SDK (its Kafka binding), checks
// each event with the SDK's validation and the CloudEvents JSON schema, and
// follows each row's trace context — from the tracing span context column (as
// Debezium reads it) or from the headers column — to the Kafka traceparent
// and tracestate headers and the event's Distributed Tracing extension.
func TestCloudEventsEndToEnd(t *testing.T) {
	schema := compileCESchema(t)
	for _, mode := range []string{"binary", "structured"} {
		t.Run(mode, func(t *testing.T) {
			rl := newRelay(t)
			dsn := rl.dsn
			rl.mustRun(t, "setup", "--create-outbox-table")
			testenv.ExecAs(t, dsn, `ALTER TABLE outbox ADD COLUMN tracingspancontext text`)
			aggType, topic, k := rl.topic(t, "Ce")
			rl.env = append(rl.env,
				"RELAY_MESSAGE_FORMAT=cloudevents",
				"RELAY_MESSAGE_CLOUDEVENTS_MODE="+mode,
				"RELAY_MESSAGE_CLOUDEVENTS_SOURCE=/orders-service/outbox",
				"RELAY_OUTBOX_COLUMNS_TIMESTAMP=created_at",
				"RELAY_OUTBOX_COLUMNS_TRACING_SPAN_CONTEXT=tracingspancontext")
			rl.mustRun(t, "check")

			const (
				trace1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
				trace2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"
			)
			rows := []ceRow{
				// Debezium's column: Java properties text, a comment first.
				{id: newID(t, dsn), payload: `{"order": 1, "note": "ünïcode ✓"}`,
					spanContext: "#Tue Nov 25 02:00:00 UTC 2026\ntraceparent=" + trace1 + "\ntracestate=vendor\\=a,other\\=b\n",
					traceparent: trace1, tracestate: "vendor=a,other=b"},
				// The headers column's entry, when the column is empty.
				{id: newID(t, dsn), payload: `{"order": 2}`, headers: `{"traceparent": "` + trace2 + `", "tenant": "t1"}`,
					traceparent: trace2},
				// A column that holds no valid trace context: delivered without one.
				{id: newID(t, dsn), payload: `{"order": 3}`, spanContext: "traceparent=not-a-trace"},
				// No trace context, and a NULL payload: an event without data.
				{id: newID(t, dsn)},
			}
			for _, r := range rows {
				testenv.ExecAs(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, tracingspancontext, created_at)
VALUES ('%s', '%s', 'order-7', 'OrderPlaced', %s, %s, %s, '2026-11-25 02:00:00.123456+00')`,
					r.id, aggType, sqlOrNull(r.payload, "::jsonb"), sqlOrNull(r.headers, "::jsonb"), sqlOrNull(r.spanContext, "")))
			}
			stop := rl.start(t)
			msgs := k.WaitMessages(t, topic, len(rows))
			stop(t)

			for i, r := range rows {
				m := msgs[i]
				hs := map[string]string{}
				for _, h := range m.Headers {
					hs[h.Key] = string(h.Value)
				}
				// The SDK's own reading of the record, through its Kafka binding.
				cm := &sarama.ConsumerMessage{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset, Key: m.Key, Value: m.Value}
				for _, h := range m.Headers {
					cm.Headers = append(cm.Headers, &sarama.RecordHeader{Key: []byte(h.Key), Value: h.Value})
				}
				msg := kafka_sarama.NewMessageFromConsumerMessage(cm)
				wantEncoding := binding.EncodingBinary
				if mode == "structured" {
					wantEncoding = binding.EncodingStructured
				}
				if enc := msg.ReadEncoding(); enc != wantEncoding {
					t.Fatalf("row %d: the SDK reads the record as %v; want %v (headers %v)", i, enc, wantEncoding, hs)
				}
				ev, err := binding.ToEvent(context.Background(), msg)
				if err != nil {
					t.Fatalf("row %d: the SDK cannot read the record as a CloudEvent: %v (headers %v, value %s)", i, err, hs, m.Value)
				}
				if err := ev.Validate(); err != nil {
					t.Errorf("row %d: the SDK's validation: %v", i, err)
				}
				checkCE(t, i, ev, r, string(m.Key))
				// The event in the JSON format, against the spec's schema: the
				// record's value itself in structured mode, the SDK's rendering
				// of the binary one.
				doc := m.Value
				if mode == "binary" {
					if doc, err = json.Marshal(ev); err != nil {
						t.Fatal(err)
					}
				} else if ct := hs["content-type"]; ct != "application/cloudevents+json; charset=UTF-8" {
					t.Errorf("row %d: content-type %q; want application/cloudevents+json; charset=UTF-8", i, ct)
				}
				if err := validateCEJSON(t, schema, doc); err != nil {
					t.Errorf("row %d: the CloudEvents JSON schema refuses %s: %v", i, doc, err)
				}
				// The trace context rides as plain W3C headers as well, for
				// consumers that read traceparent from any Kafka record.
				if hs["traceparent"] != r.traceparent || hs["tracestate"] != r.tracestate {
					t.Errorf("row %d: headers traceparent %q tracestate %q; want %q %q", i, hs["traceparent"], hs["tracestate"], r.traceparent, r.tracestate)
				}
				if r.headers != "" && hs["tenant"] != "t1" {
					t.Errorf("row %d: the headers column's other entries are lost: %v", i, hs)
				}
			}
		})
	}
}

func checkCE(t *testing.T, i int, ev *cloudevents.Event, r ceRow, key string) {
	t.Helper()
	want := map[string]string{"id": r.id, "source": "/orders-service/outbox", "type": "OrderPlaced", "subject": "order-7", "specversion": "1.0"}
	got := map[string]string{"id": ev.ID(), "source": ev.Source(), "type": ev.Type(), "subject": ev.Subject(), "specversion": ev.SpecVersion()}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("row %d: attribute %s = %q; want %q", i, k, got[k], v)
		}
	}
	if tm := ev.Time(); !tm.Equal(time.Date(2026, 11, 25, 2, 0, 0, 123456000, time.UTC)) {
		t.Errorf("row %d: time = %v; want the created_at column, 2026-11-25T02:00:00.123456Z", i, tm)
	}
	if pk, _ := ev.Extensions()["partitionkey"].(string); pk != "order-7" || key != "order-7" {
		t.Errorf("row %d: partitionkey %q, Kafka key %q; want both the aggregate id", i, pk, key)
	}
	tp, _ := ev.Extensions()["traceparent"].(string)
	ts, _ := ev.Extensions()["tracestate"].(string)
	if tp != r.traceparent || ts != r.tracestate {
		t.Errorf("row %d: extensions traceparent %q tracestate %q; want %q %q", i, tp, ts, r.traceparent, r.tracestate)
	}
	if r.payload == "" {
		if len(ev.Data()) != 0 {
			t.Errorf("row %d: a NULL payload gave data %q; want none", i, ev.Data())
		}
		return
	}
	if ct := ev.DataContentType(); ct != "application/json" {
		t.Errorf("row %d: datacontenttype %q; want application/json (a jsonb payload)", i, ct)
	}
	var gotData, wantData any
	if err := json.Unmarshal(ev.Data(), &gotData); err != nil {
		t.Fatalf("row %d: data %q is not JSON: %v", i, ev.Data(), err)
	}
	json.Unmarshal([]byte(r.payload), &wantData)
	if g, w := fmt.Sprint(gotData), fmt.Sprint(wantData); g != w {
		t.Errorf("row %d: data %s; want the payload %s", i, g, w)
	}
}

func newID(t *testing.T, dsn string) string {
	return testenv.QueryString(t, dsn, `SELECT gen_random_uuid()::text`)
}

func sqlOrNull(v, cast string) string {
	if v == "" {
		return "NULL"
	}
	return "'" + strings.ReplaceAll(v, "'", "''") + "'" + cast
}
