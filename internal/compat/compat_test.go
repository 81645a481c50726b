// Package compat_test runs the relay and the real Debezium (3.1 PostgreSQL
// connector + Outbox Event Router in Kafka Connect standalone) side by side on
// the same outbox rows, and compares what each wrote to Kafka byte for byte:
// the Debezium compatibility claims of docs/debezium.md are each backed by a test here.
//
// Each side reads through its own slot and writes to its own topics (same
// partition counts); events are matched by their id header.
package compat_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// outboxDDL is Debezium's documented outbox table, plus what the option
// tests use: a headers column (Debezium ignores it unless placed), an int
// column for envelope and header placement, and a timestamp column.
const outboxDDL = `CREATE TABLE public.outbox (
    id uuid PRIMARY KEY,
    aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL,
    type varchar(255) NOT NULL,
    payload jsonb,
    headers jsonb,
    tenant integer,
    occurred timestamp
)`

// partitions of every topic, on both sides, so that the partition a key
// goes to is compared, not always 0.
const partitions = 3

// A row is one outbox insert.
type row struct {
	id, aggType, aggID, typ string
	payload, headers        *string // nil: NULL
	tenant                  *int
	occurred                string // "" : NULL
}

func str(s string) *string { return &s }
func num(n int) *int       { return &n }

// txn is a transaction of rows; rollback ones must appear on neither side.
type txn struct {
	rows     []row
	rollback bool
}

// corpus is the varied events both sides get: interleaved aggregates,
// unicode, nested JSON, scalar, JSON-null and NULL payloads, characters JSON
// must escape, a 200 KB payload, multi-event and rolled-back transactions,
// headers column values of every shape.
func corpus(aggTypes [3]string) []txn {
	order, payment, customer := aggTypes[0], aggTypes[1], aggTypes[2]
	big := `{"blob": "` + strings.Repeat("x", 200*1024) + `"}`
	n := 0
	id := func() string { n++; return fmt.Sprintf("00000000-0000-4000-8000-%012d", n) }
	r := func(aggType, aggID, typ string, payload *string) row {
		return row{id: id(), aggType: aggType, aggID: aggID, typ: typ, payload: payload,
			tenant: num(n % 4), occurred: fmt.Sprintf("2026-11-22 10:%02d:%02d.%06d", n/60%60, n%60, n*1013%1000000)}
	}
	var txns []txn
	// Interleaved aggregates, one event per transaction and several.
	for i := range 12 {
		txns = append(txns, txn{rows: []row{
			r(order, fmt.Sprintf("O-%d", i%4), "OrderCreated", str(fmt.Sprintf(`{"order": %d, "lines": [{"sku": "A", "qty": %d}]}`, i, i+1))),
		}})
		txns = append(txns, txn{rows: []row{
			r(payment, fmt.Sprintf("P-%d", i%3), "PaymentTaken", str(fmt.Sprintf(`{"amount": %d.50, "currency": "EUR"}`, i))),
			r(order, fmt.Sprintf("O-%d", (i+1)%4), "OrderPaid", str(`{"paid": true}`)),
			r(customer, fmt.Sprintf("C-%d", i%2), "CustomerSeen", str(`{"nested": {"a": {"b": {"c": [1, 2, {"d": null}]}}}}`)),
		}})
	}
	special := []row{
		r(customer, "Zoë-🙂", "Unicode", str(`{"name": "日本語 🙂 Zoë", "sep": "\u2028\u2029", "html": "<a href='x'>&</a>"}`)),
		r(customer, `q"uote\back`+"\ttab", "Escapes", str(`{"s": "quote \" backslash \\ newline \n tab \t ctl \u0001 del `+"\x7f"+`"}`)),
		r(order, "O-1", "Scalar", str(`42`)),
		r(order, "O-1", "ScalarString", str(`"just a string"`)),
		r(order, "O-2", "ScalarBool", str(`true`)),
		r(order, "O-2", "JSONNull", str(`null`)),
		r(order, "O-3", "EmptyArray", str(`[]`)),
		r(order, "O-3", "SQLNull", nil),
		r(payment, "P-0", "Big", str(big)),
		r(payment, "P-1", "Float", str(`{"f": 1.0e10, "g": -0.000001, "h": 12345678901234567890}`)),
	}
	for _, s := range special {
		txns = append(txns, txn{rows: []row{s}})
	}
	// Headers column values: object, array, string, numbers, nested, NULL.
	hdrs := []*string{str(`{"trace": "t-1", "n": 7}`), str(`["not", "an", "object"]`), str(`"str"`),
		str(`{"nested": {"a": 1}, "nul": null}`), nil, str(`{"id": "spoofed"}`)}
	for i, h := range hdrs {
		x := r(customer, "C-9", "WithHeaders", str(fmt.Sprintf(`{"h": %d}`, i)))
		x.headers = h
		txns = append(txns, txn{rows: []row{x}})
	}
	// Rolled back: on neither side.
	txns = append(txns, txn{rollback: true, rows: []row{
		r(order, "O-0", "RolledBack", str(`{"never": true}`)),
		r(payment, "P-0", "RolledBack", str(`{"never": true}`)),
	}})
	// A NULL tenant and occurred, for the placement and timestamp tests.
	x := r(order, "O-0", "NullFields", str(`{"last": true}`))
	x.tenant, x.occurred = nil, ""
	txns = append(txns, txn{rows: []row{x}})
	return txns
}

func insertAll(t *testing.T, pg *testenv.PG, txns []txn) (committed []row) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, tx := range txns {
		dbtx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range tx.rows {
			var occurred *string
			if r.occurred != "" {
				occurred = &r.occurred
			}
			if _, err := dbtx.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload, headers, tenant, occurred)
				VALUES ($1, $2, $3, $4, $5::jsonb, $6::jsonb, $7, $8::timestamp)`,
				r.id, r.aggType, r.aggID, r.typ, r.payload, r.headers, r.tenant, occurred); err != nil {
				t.Fatalf("insert %s: %v", r.id, err)
			}
		}
		if tx.rollback {
			err = dbtx.Rollback(ctx)
		} else {
			err = dbtx.Commit(ctx)
			committed = append(committed, tx.rows...)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return committed
}

// A setup is one side-by-side configuration: Debezium's connector properties
// and the relay's equivalent settings (RELAY_* variables).
type setup struct {
	converter string            // "string" or "json", both sides
	dbz       map[string]string // transforms.outbox.* and converter overrides
	relay     map[string]string // RELAY_* settings
	// fullHeaders: compare every header, not only id and the placed ones
	// (false when the relay maps the headers column, which Debezium ignores).
	fullHeaders bool
	timestamps  bool // compare record timestamps (the timestamp column is used)
	// topic names an aggregate type's topic under a side's prefix; default
	// prefix + aggregate type.
	topic func(prefix, aggType string) string
}

// message is what one side wrote for one event.
type message struct {
	topic     string
	partition int
	offset    int64
	key       []byte
	value     []byte
	headers   []testenv.Header
	time      time.Time
}

// runSide starts both sides on a fresh database, inserts the corpus and
// returns each side's messages by event id, and the committed rows.
func runSide(t *testing.T, s setup) (dbz, rly map[string]message, rows []row) {
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	pg.Exec(t, outboxDDL)

	name := testenv.UniqueName(t, "c")
	aggTypes := [3]string{name + "_Order", name + "_Payment", name + "_Customer"}
	dbzPrefix, rlyPrefix := "dbz."+name+".", "rly."+name+"."
	var dbzTopics, rlyTopics []string
	topic := s.topic
	if topic == nil {
		topic = func(prefix, aggType string) string { return prefix + aggType }
	}
	for _, a := range aggTypes {
		dbzTopics = append(dbzTopics, topic(dbzPrefix, a))
		rlyTopics = append(rlyTopics, topic(rlyPrefix, a))
	}
	for _, topic := range append(slices.Clone(dbzTopics), rlyTopics...) {
		k.CreateTopic(t, topic, partitions)
	}

	props := map[string]string{"transforms.outbox.route.topic.replacement": dbzPrefix + "${routedByValue}"}
	for key, v := range s.dbz {
		props[key] = strings.ReplaceAll(v, "{prefix}", dbzPrefix)
	}
	conn := debezium.Start(t, debezium.Options{DSN: pg.DSN, Converter: s.converter, Props: props})

	slot, pub := testenv.UniqueName(t, "rs"), testenv.UniqueName(t, "rp")
	env := append(os.Environ(),
		"RELAY_POSTGRES_DSN="+pg.DSN,
		"RELAY_POSTGRES_SLOT="+slot,
		"RELAY_POSTGRES_PUBLICATION="+pub,
		"RELAY_KAFKA_BROKERS="+strings.Join(k.Brokers, ","),
		"RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION=false",
		"RELAY_OUTBOX_LAYOUT=debezium",
		"RELAY_TOPICS_TEMPLATE="+rlyPrefix+"{aggregate_type}",
		"RELAY_MESSAGE_CONVERTER="+s.converter,
		"RELAY_METRICS_LISTEN=",
	)
	for key, v := range s.relay {
		env = append(env, key+"="+strings.ReplaceAll(v, "{prefix}", rlyPrefix))
	}
	runRelay(t, env, "setup")
	proc := startRelay(t, env)

	rows = insertAll(t, pg, corpus(aggTypes))
	dbz = collect(t, k, dbzTopics, len(rows), "Debezium")
	rly = collect(t, k, rlyTopics, len(rows), "relay")
	proc.stop(t)
	conn.Stop(t)
	return dbz, rly, rows
}

func runRelay(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(testenv.RelayBinary(t), args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("outbox-relay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

type relayProc struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
}

func startRelay(t *testing.T, env []string, args ...string) *relayProc {
	t.Helper()
	cmd := exec.Command(testenv.RelayBinary(t), append([]string{"run"}, args...)...)
	cmd.Env = env
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start outbox-relay: %v", err)
	}
	p := &relayProc{cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		if t.Failed() {
			t.Logf("outbox-relay output:\n%s", out.String())
		}
	})
	return p
}

func (p *relayProc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("outbox-relay run exited with %v\n%s", err, p.out.String())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("outbox-relay did not stop within 30s of SIGINT")
	}
}

// collect reads topics until they hold want messages (and a little longer,
// to see duplicates), keyed by id header; a message without one, or an id
// seen twice, fails the test.
func collect(t *testing.T, k *testenv.KafkaCluster, topics []string, want int, side string) map[string]message {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var msgs []message
	for {
		msgs = msgs[:0]
		for _, topic := range topics {
			for _, m := range k.ReadAll(t, topic) {
				msgs = append(msgs, message{topic: m.Topic, partition: m.Partition, offset: m.Offset,
					key: m.Key, value: m.Value, headers: m.Headers, time: m.Time})
			}
		}
		if len(msgs) >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(300 * time.Millisecond)
	}
	byID := make(map[string]message, len(msgs))
	for _, m := range msgs {
		id, ok := headerValue(m.headers, "id")
		if !ok {
			t.Fatalf("%s: message at %s/%d@%d has no id header", side, m.topic, m.partition, m.offset)
		}
		if _, dup := byID[string(id)]; dup {
			t.Errorf("%s: event %s written twice", side, id)
		}
		byID[string(id)] = m
	}
	if len(byID) != want {
		t.Fatalf("%s wrote %d distinct events; want %d", side, len(byID), want)
	}
	return byID
}

func headerValue(hs []testenv.Header, key string) ([]byte, bool) {
	for _, h := range hs {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

func headersText(hs []testenv.Header) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		v := strconv.Quote(string(h.Value))
		if h.Value == nil {
			v = "null"
		}
		parts[i] = h.Key + "=" + v
	}
	return strings.Join(parts, " ")
}

func bytesText(b []byte) string {
	if b == nil {
		return "null(Kafka)"
	}
	if len(b) > 80 {
		return strconv.Quote(string(b[:80])) + fmt.Sprintf("…(%d bytes)", len(b))
	}
	return strconv.Quote(string(b))
}

// compare asserts, per event, identical key bytes, value bytes (a Kafka null
// and an empty value are different), partition, id header (all headers with
// fullHeaders, else the relay's extra ones must come after Debezium's), and
// per-key order; it logs the per-event table.
func compare(t *testing.T, s setup, dbz, rly map[string]message, rows []row) {
	t.Helper()
	same := 0
	for _, r := range rows {
		d, rl := dbz[r.id], rly[r.id]
		var diffs []string
		if !bytes.Equal(d.key, rl.key) {
			diffs = append(diffs, fmt.Sprintf("key %s vs %s", bytesText(d.key), bytesText(rl.key)))
		}
		if !bytes.Equal(d.value, rl.value) || (d.value == nil) != (rl.value == nil) {
			diffs = append(diffs, fmt.Sprintf("value %s vs %s", bytesText(d.value), bytesText(rl.value)))
		}
		if d.partition != rl.partition {
			diffs = append(diffs, fmt.Sprintf("partition %d vs %d", d.partition, rl.partition))
		}
		dh, rh := headersText(d.headers), headersText(rl.headers)
		switch {
		case s.fullHeaders && dh != rh:
			diffs = append(diffs, fmt.Sprintf("headers %s vs %s", dh, rh))
		case !s.fullHeaders && !strings.HasPrefix(rh, dh):
			diffs = append(diffs, fmt.Sprintf("headers %s not a prefix of %s", dh, rh))
		}
		if s.timestamps && r.occurred == "" {
			// A NULL column: both fall back to the time they send it.
			if gap := d.time.Sub(rl.time).Abs(); gap > time.Minute {
				diffs = append(diffs, fmt.Sprintf("send-time timestamps %s apart", gap))
			}
		} else if s.timestamps && !d.time.Equal(rl.time) {
			diffs = append(diffs, fmt.Sprintf("timestamp %s vs %s", d.time.Format(time.RFC3339Nano), rl.time.Format(time.RFC3339Nano)))
		}
		if len(diffs) == 0 {
			same++
			t.Logf("same  %s %-12s key %s value %s partition %d headers %s", r.id[24:], r.typ, bytesText(d.key), bytesText(d.value), d.partition, dh)
			continue
		}
		t.Errorf("event %s (%s, aggregate %q): Debezium vs relay: %s", r.id, r.typ, r.aggID, strings.Join(diffs, "; "))
	}
	t.Logf("%d of %d events identical", same, len(rows))

	// Per-key order: the ids of each key in offset order are the same on
	// both sides, and are commit order.
	commitOrder := make(map[string][]string)
	for _, r := range rows {
		commitOrder[r.aggType+"/"+r.aggID] = append(commitOrder[r.aggType+"/"+r.aggID], r.id)
	}
	for side, msgs := range map[string]map[string]message{"Debezium": dbz, "relay": rly} {
		got := make(map[string][]message)
		for _, r := range rows {
			k := r.aggType + "/" + r.aggID
			got[k] = append(got[k], msgs[r.id])
		}
		for k, ms := range got {
			slices.SortFunc(ms, func(a, b message) int { return int(a.offset - b.offset) })
			var ids []string
			for _, m := range ms {
				id, _ := headerValue(m.headers, "id")
				ids = append(ids, string(id))
			}
			if !slices.Equal(ids, commitOrder[k]) {
				t.Errorf("%s: aggregate %s in order %v; want commit order %v", side, k, ids, commitOrder[k])
			}
		}
	}
}

// StringConverter users with Debezium's defaults plus an event-type header:
// the relay's messages are the same bytes. The relay also reads the headers
// column, whose entries Debezium does not send: they come after the shared
// headers.
func TestSameAsDebeziumStringConverter(t *testing.T) {
	s := setup{
		converter: "string",
		dbz:       map[string]string{"transforms.outbox.table.fields.additional.placement": "type:header:eventType"},
		relay: map[string]string{
			"RELAY_MESSAGE_FIELDS":         "type:header:eventType",
			"RELAY_OUTBOX_COLUMNS_HEADERS": "headers",
		},
	}
	dbz, rly, rows := runSide(t, s)
	compare(t, s, dbz, rly, rows)
	// The relay's extra headers are the headers column's, as documented.
	for _, r := range rows {
		if r.typ != "WithHeaders" {
			continue
		}
		extra := headersText(rly[r.id].headers[2:])
		want := map[string]string{
			`{"trace": "t-1", "n": 7}`:          `n="7" trace="t-1"`, // jsonb sorts keys, shorter first
			`{"nested": {"a": 1}, "nul": null}`: `nested="{\"a\": 1}"`,
		}[deref(r.headers)]
		if extra != want {
			t.Errorf("event %s with headers column %s: relay's extra headers %q; want %q", r.id, deref(r.headers), extra, want)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}

// JsonConverter users (schemas.enable=false): quoted keys, payloads as JSON
// strings, NULL as null; every header the same.
func TestSameAsDebeziumJSONConverter(t *testing.T) {
	s := setup{converter: "json", fullHeaders: true}
	dbz, rly, rows := runSide(t, s)
	compare(t, s, dbz, rly, rows)
}

// The options users set, together: regex routing, header and envelope
// placement, the timestamp column, tombstones for empty payloads.
func TestSameAsDebeziumOptions(t *testing.T) {
	s := setup{
		converter: "json",
		dbz: map[string]string{
			"transforms.outbox.route.topic.regex":                 `(?<agg>.*)_(?<kind>Order|Payment|Customer)`,
			"transforms.outbox.route.topic.replacement":           "{prefix}${kind}.${agg}",
			"transforms.outbox.table.fields.additional.placement": "type:header:eventType,tenant:envelope:tenantId,tenant:header",
			"transforms.outbox.table.field.event.timestamp":       "occurred",
			"transforms.outbox.route.tombstone.on.empty.payload":  "true",
		},
		relay: map[string]string{
			"RELAY_TOPICS_TEMPLATE":                    "outbox.event.{aggregate_type}", // the default: regex instead
			"RELAY_TOPICS_REGEX":                       `(?<agg>.*)_(?<kind>Order|Payment|Customer)`,
			"RELAY_TOPICS_REPLACEMENT":                 "{prefix}${kind}.${agg}",
			"RELAY_MESSAGE_FIELDS":                     "type:header:eventType,tenant:envelope:tenantId,tenant:header",
			"RELAY_OUTBOX_COLUMNS_TIMESTAMP":           "occurred",
			"RELAY_MESSAGE_TOMBSTONE_ON_EMPTY_PAYLOAD": "true",
		},
		fullHeaders: true,
		timestamps:  true,
		topic: func(prefix, aggType string) string {
			i := strings.LastIndexByte(aggType, '_')
			return prefix + aggType[i+1:] + "." + aggType[:i]
		},
	}
	dbz, rly, rows := runSide(t, s)
	compare(t, s, dbz, rly, rows)
}

// StringConverter with envelope fields: Debezium's value is then a Kafka
// Connect Struct, which StringConverter writes with its toString, NULL
// fields left out; the relay writes the same text.
func TestSameAsDebeziumStringEnvelope(t *testing.T) {
	s := setup{
		converter:   "string",
		dbz:         map[string]string{"transforms.outbox.table.fields.additional.placement": "type:envelope,tenant:envelope:tenantId"},
		relay:       map[string]string{"RELAY_MESSAGE_FIELDS": "type:envelope,tenant:envelope:tenantId"},
		fullHeaders: true,
	}
	dbz, rly, rows := runSide(t, s)
	compare(t, s, dbz, rly, rows)
}
