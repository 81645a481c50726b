package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// aggregateTypes are the five aggregate types the tests spread events over.
var aggregateTypes = []string{"Order", "Payment", "Customer", "Invoice", "Shipment"}

// fixture is one test's database (outbox table, publication, slot, checkpoint
// table), its topics, and a test_decoding probe slot that tells the exact end
// LSN of every transaction, so assertions on confirmed LSNs are exact.
type fixture struct {
	pg     *testenv.PG
	kafka  *testenv.KafkaCluster
	pool   *pgxpool.Pool
	prefix string // topic prefix: topics are <prefix>.<aggregate_type>
	slot   string
	pub    string
	probe  string
	seq    map[string]int // next sequence number per aggregate id
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{
		pg:     testenv.Postgres(t),
		kafka:  testenv.Kafka(t),
		prefix: testenv.UniqueName(t, "t"),
		// Slot names are server-wide: unique per test.
		slot:  testenv.UniqueName(t, "slot"),
		pub:   "outbox_relay",
		probe: testenv.UniqueName(t, "probe"),
		seq:   map[string]int{},
	}
	f.pool = f.pg.Pool(t)
	// The DDL that `outbox-relay setup` runs.
	outbox := outboxsql.Table{Schema: "public", Name: "outbox"}
	for _, stmt := range outboxsql.OutboxTable(outbox, outboxsql.Columns{}, outboxsql.LayoutRelay) {
		f.pg.Exec(t, stmt)
	}
	f.pg.Exec(t, outboxsql.CheckpointTable(outboxsql.Table{Schema: "public", Name: "outbox_relay_checkpoint"}))
	for _, stmt := range outboxsql.RetryTable(outboxsql.Table{Schema: "public", Name: "outbox_relay_retry"}) {
		f.pg.Exec(t, stmt)
	}
	f.pg.Exec(t, outboxsql.CreatePublication("outbox_relay", outbox))
	f.pg.Exec(t, `CREATE TABLE orders (id bigserial PRIMARY KEY, note text NOT NULL)`)
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, f.probe)
	for _, at := range aggregateTypes {
		f.kafka.CreateTopic(t, f.prefix+"."+at, 4)
	}
	return f
}

func (f *fixture) config(t testing.TB) relay.Config {
	return relay.Config{
		Replication: replication.Config{
			DSN: f.pg.DSN, Slot: f.slot, Publication: f.pub,
			StatusInterval: time.Second,
		},
		Router: router.Config{Topic: f.prefix + ".{aggregate_type}"},
		Sink: kafkaclient.Config{
			Brokers:  f.kafka.Brokers,
			RetryMax: 500 * time.Millisecond,
		},
		CheckpointInterval: 50 * time.Millisecond,
		ShutdownTimeout:    30 * time.Second,
		Logger:             testLogger(t),
	}
}

func testLogger(t testing.TB) *slog.Logger {
	level := slog.LevelInfo
	if os.Getenv("RELAY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newRelay builds a relay with the two sinks of newSinks.
func newRelay(t testing.TB, cfg relay.Config) (*relay.Relay, error) {
	t.Helper()
	sinks, err := newSinks(t, cfg)
	if err != nil {
		return nil, err
	}
	return relay.New(cfg, sinks)
}

// newSinks builds a relay's two sinks of cfg.Sink, as the CLI does
// (cmd/outbox-relay's newRelay: with exactly-once the stream's is
// transactional), logging to cfg.Logger unless cfg.Sink has a logger,
// closed once the test and its cleanups that stop the relay are done.
func newSinks(t testing.TB, cfg relay.Config) (relay.Sinks, error) {
	t.Helper()
	if cfg.Sink.Logger == nil {
		cfg.Sink.Logger = cfg.Logger
	}
	var sinks relay.Sinks
	for i, s := range []*relay.Sink{&sinks.Stream, &sinks.Retry} {
		scfg := cfg.Sink
		if i == 0 && cfg.Delivery == relay.DeliveryExactlyOnce {
			scfg.TransactionalID = relay.TransactionalID(cfg.Replication.Slot)
		}
		k, err := sink.New(scfg)
		if err != nil {
			return relay.Sinks{}, err
		}
		t.Cleanup(func() { k.Close() })
		*s = k
	}
	return sinks, nil
}

// running is a relay started in this process.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func (f *fixture) start(t testing.TB, cfg relay.Config) *running {
	t.Helper()
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	return runRelay(t, r)
}

// runRelay runs r until the test ends (or stop).
func runRelay(t testing.TB, r *relay.Relay) *running {
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-run.done:
		case <-time.After(60 * time.Second):
			t.Errorf("relay did not stop within 60s of cancel")
		}
	})
	return run
}

// noiseWAL writes about n MB of WAL that compresses badly into a table the
// relay does not read, for the WAL bound.
func (f *fixture) noiseWAL(t testing.TB, n int) {
	t.Helper()
	f.pg.Exec(t, `CREATE TABLE IF NOT EXISTS walbuf_noise (b bytea)`)
	for range n {
		f.pg.Exec(t, `INSERT INTO walbuf_noise SELECT decode(string_agg(md5(random()::text), ''), 'hex') FROM generate_series(1, 2000) g, generate_series(1, 30) h GROUP BY g`)
	}
}

// stop cancels the relay and requires a clean shutdown.
func (r *running) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run after cancel = %v; want an error wrapping context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("relay did not stop within 60s of cancel")
	}
	r.done <- context.Canceled // for the cleanup
}

// runsFor fails the test with stopped, given Run's error, if the relay
// stops within d.
func (r *running) runsFor(t testing.TB, d time.Duration, stopped string) {
	t.Helper()
	select {
	case err := <-r.done:
		t.Fatalf(stopped, err)
	case <-time.After(d):
	}
}

// exited waits up to timeout for the relay to stop by itself and returns
// Run's error, put back for the cleanup; else it fails the test with
// notStopped.
func (r *running) exited(t testing.TB, timeout time.Duration, notStopped string) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		t.Fatal(notStopped)
		return nil
	}
}

// event is one outbox row as the test inserts it.
type event struct {
	ID, AggregateType, AggregateID, EventType string
	Payload                                   string // JSON text
	Headers                                   string // JSON object text or ""
}

// makeEvents returns n events spread over aggregate types and ids, each with the
// next per-aggregate sequence number in its payload.
func (f *fixture) makeEvents(n int) []event {
	evs := make([]event, n)
	for i := range evs {
		at := aggregateTypes[i%len(aggregateTypes)]
		agg := fmt.Sprintf("%s-%d", strings.ToLower(at), (i/len(aggregateTypes))%7)
		f.seq[agg]++
		evs[i] = event{
			ID:            newUUID(),
			AggregateType: at,
			AggregateID:   agg,
			EventType:     at + "Changed",
			Payload:       fmt.Sprintf(`{"agg": %q, "seq": %d, "note": "événement ✓ %d"}`, agg, f.seq[agg], i),
		}
		if i%3 == 0 {
			evs[i].Headers = fmt.Sprintf(`{"trace_id": "tr-%d", "tenant": 7}`, i)
		}
	}
	return evs
}

// newUUID is testenv.NewUUID, under the name the relay tests use.
func newUUID() string { return testenv.NewUUID() }

// insertTx inserts evs in one transaction, row by row, together with a row of
// another table, and returns nothing: end LSNs come from the probe slot.
func (f *fixture) insertTx(t testing.TB, evs []event) {
	t.Helper()
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO orders (note) VALUES ('business row')`)
	for _, e := range evs {
		b.Queue(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
			VALUES ($1, $2, $3, $4, $5::jsonb, nullif($6, '')::jsonb)`,
			e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers)
	}
	f.commitBatch(t, b)
}

// commitBatch sends b in one transaction and commits it.
func (f *fixture) commitBatch(t testing.TB, b *pgx.Batch) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		t.Fatalf("send batch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

// insertMultiRow inserts evs with one multi-row INSERT statement.
func (f *fixture) insertMultiRow(t testing.TB, evs []event) {
	t.Helper()
	var sb strings.Builder
	args := []any{}
	sb.WriteString(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES `)
	for i, e := range evs {
		if i > 0 {
			sb.WriteString(",")
		}
		n := len(args)
		fmt.Fprintf(&sb, "($%d, $%d, $%d, $%d, $%d::jsonb, nullif($%d, '')::jsonb)", n+1, n+2, n+3, n+4, n+5, n+6)
		args = append(args, e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers)
	}
	if _, err := f.pool.Exec(context.Background(), sb.String(), args...); err != nil {
		t.Fatalf("multi-row insert: %v", err)
	}
}

// insertCopy inserts evs with COPY, which Postgres logs as multi-insert records
// whose changes share LSNs.
func (f *fixture) insertCopy(t testing.TB, evs []event) {
	t.Helper()
	rows := make([][]any, len(evs))
	for i, e := range evs {
		var headers any
		if e.Headers != "" {
			headers = e.Headers
		}
		rows[i] = []any{e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, headers}
	}
	_, err := f.pool.CopyFrom(context.Background(), pgx.Identifier{"outbox"},
		[]string{"id", "aggregate_type", "aggregate_id", "event_type", "payload", "headers"}, pgx.CopyFromRows(rows))
	if err != nil {
		t.Fatalf("copy: %v", err)
	}
}

// deliveredTx inserts n events in one transaction, the test's first, and
// waits a minute for them in Kafka and for the slot and the checkpoint to
// reach its end.
func (f *fixture) deliveredTx(t testing.TB, n int) {
	t.Helper()
	f.insertTx(t, f.makeEvents(n))
	f.waitCount(t, n, time.Minute)
	f.waitConfirmed(t, f.commitEnds(t)[0], time.Minute)
}

// commitEnds returns the end LSN of every transaction the probe slot has seen
// that touched the outbox, in commit order.
func (f *fixture) commitEnds(t testing.TB) []pglogrepl.LSN {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), `SELECT lsn::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)`, f.probe)
	if err != nil {
		t.Fatalf("peek probe slot: %v", err)
	}
	defer rows.Close()
	var ends []pglogrepl.LSN
	touched := false
	for rows.Next() {
		var lsn, data string
		if err := rows.Scan(&lsn, &data); err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(data, "table public.outbox:"):
			touched = true
		case strings.HasPrefix(data, "COMMIT"):
			if touched {
				ends = append(ends, mustLSN(t, lsn))
			}
			touched = false
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ends
}

// slotConfirmed returns the relay slot's confirmed_flush_lsn.
func (f *fixture) slotConfirmed(t testing.TB) pglogrepl.LSN {
	t.Helper()
	var s string
	err := f.pool.QueryRow(context.Background(),
		`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&s)
	if err != nil {
		t.Fatalf("read slot: %v", err)
	}
	return mustLSN(t, s)
}

// checkpointLSN returns the saved checkpoint, 0 if none.
func (f *fixture) checkpointLSN(t testing.TB) pglogrepl.LSN {
	t.Helper()
	var s string
	err := f.pool.QueryRow(context.Background(),
		`SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, f.slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatalf("read checkpoint: %v", err)
	}
	return mustLSN(t, s)
}

// waitConfirmed waits until the slot's confirmed_flush_lsn and the checkpoint
// reach lsn.
func (f *fixture) waitConfirmed(t testing.TB, lsn pglogrepl.LSN, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		slot, cp := f.slotConfirmed(t), f.checkpointLSN(t)
		if slot >= lsn && cp >= lsn {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: slot confirmed_flush_lsn = %s, checkpoint = %s; want both >= %s", timeout, slot, cp, lsn)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// delivered is one event as read back from Kafka.
type delivered struct {
	Topic     string
	Partition int
	Offset    int64
	Key       string
	Value     string
	Headers   map[string]string
}

func (f *fixture) readAll(t testing.TB) []delivered {
	t.Helper()
	var out []delivered
	for _, at := range aggregateTypes {
		for _, m := range f.kafka.ReadAll(t, f.prefix+"."+at) {
			out = append(out, fromKafka(m))
		}
	}
	return out
}

func fromKafka(m testenv.Message) delivered {
	d := delivered{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key),
		Value: string(m.Value), Headers: map[string]string{}}
	for _, h := range m.Headers {
		d.Headers[h.Key] = string(h.Value)
	}
	return d
}

// waitCount reads the topics until at least n events are there.
func (f *fixture) waitCount(t testing.TB, n int, timeout time.Duration) []delivered {
	t.Helper()
	return waitRead(t, f.readAll, n, timeout)
}

// waitRead calls read until it returns at least n events.
func waitRead(t testing.TB, read func(testing.TB) []delivered, n int, timeout time.Duration) []delivered {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got := read(t)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d events in Kafka; want %d", timeout, len(got), n)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// report is what a check of Kafka against the outbox table found.
type report struct {
	lost, duplicates, orderViolations, mismatches int
	firstProblem                                  string
}

func (r *report) problem(format string, args ...any) {
	if r.firstProblem == "" {
		r.firstProblem = fmt.Sprintf(format, args...)
	}
}

// check compares what Kafka holds with every row of the outbox table: each row
// must be on its topic with exact key, value and headers; per aggregate, the
// sequence numbers must appear in commit order.
func (f *fixture) check(t testing.TB, got []delivered) report {
	t.Helper()
	type row struct{ aggType, aggID, eventType, payload, headers string }
	want := map[string]row{}
	rows, err := f.pool.Query(context.Background(),
		`SELECT id::text, coalesce(aggregate_type, ''), coalesce(aggregate_id, ''), event_type, payload::text, coalesce(headers::text, '') FROM outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		var r row
		if err := rows.Scan(&id, &r.aggType, &r.aggID, &r.eventType, &r.payload, &r.headers); err != nil {
			t.Fatal(err)
		}
		want[id] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	var rep report
	seen := map[string]int{}
	// Kafka order per partition, then per key.
	sort.Slice(got, func(i, j int) bool {
		if got[i].Topic != got[j].Topic {
			return got[i].Topic < got[j].Topic
		}
		if got[i].Partition != got[j].Partition {
			return got[i].Partition < got[j].Partition
		}
		return got[i].Offset < got[j].Offset
	})
	lastSeq := map[string]int{}
	for _, d := range got {
		id := d.Headers["id"]
		seen[id]++
		if seen[id] > 1 {
			rep.duplicates++
			continue // a duplicate may repeat an old sequence number: that is not an order violation
		}
		w, ok := want[id]
		if !ok {
			rep.mismatches++
			rep.problem("event %q on %s is not in the outbox table", id, d.Topic)
			continue
		}
		if d.Topic != f.prefix+"."+w.aggType || d.Key != w.aggID || d.Value != w.payload ||
			d.Headers["event_type"] != w.eventType || d.Headers["aggregate_type"] != w.aggType {
			rep.mismatches++
			rep.problem("event %s: got topic %q key %q value %q headers %v; want topic %q key %q value %q",
				id, d.Topic, d.Key, d.Value, d.Headers, f.prefix+"."+w.aggType, w.aggID, w.payload)
		}
		if w.headers != "" {
			var hs map[string]any
			if err := json.Unmarshal([]byte(w.headers), &hs); err != nil {
				t.Fatal(err)
			}
			for k, v := range hs {
				wantV := fmt.Sprint(v)
				if s, ok := v.(string); ok {
					wantV = s
				}
				if d.Headers[k] != wantV {
					rep.mismatches++
					rep.problem("event %s: header %q = %q; want %q", id, k, d.Headers[k], wantV)
				}
			}
		}
		var p struct {
			Seq int `json:"seq"`
		}
		if err := json.Unmarshal([]byte(d.Value), &p); err != nil {
			rep.mismatches++
			continue
		}
		if p.Seq != lastSeq[d.Key]+1 {
			rep.orderViolations++
			rep.problem("aggregate %s: seq %d after %d", d.Key, p.Seq, lastSeq[d.Key])
		}
		lastSeq[d.Key] = max(lastSeq[d.Key], p.Seq)
	}
	for id := range want {
		if seen[id] == 0 {
			rep.lost++
			rep.problem("event %s (%s) is not in Kafka", id, want[id].aggID)
		}
	}
	return rep
}

func mustLSN(t testing.TB, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatalf("ParseLSN(%q): %v", s, err)
	}
	return l
}
