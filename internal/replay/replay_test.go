package replay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/replay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// fixture is an outbox table (the relay's layout plus a bigserial seq
// column), a topic prefix, and a Kafka sink.
type fixture struct {
	pg     *testenv.PG
	kafka  *testenv.KafkaCluster
	prefix string
	sink   *sink.Kafka
	outbox sql.Table
	cp     sql.Table
	slot   string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{pg: testenv.Postgres(t), kafka: testenv.Kafka(t), prefix: testenv.UniqueName(t, "rp") + ".",
		outbox: sql.Table{Schema: "public", Name: "outbox"}, cp: sql.Table{Name: sql.DefaultCheckpointTable}, slot: testenv.UniqueName(t, "rps")}
	for _, stmt := range sql.OutboxTable(f.outbox, sql.Columns{}, sql.LayoutRelay) {
		f.pg.Exec(t, stmt)
	}
	f.pg.Exec(t, `ALTER TABLE public.outbox ADD COLUMN seq bigserial UNIQUE NOT NULL`)
	s, err := sink.New(kafkaclient.Config{Brokers: f.kafka.Brokers, AllowAutoTopicCreation: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f.sink = s
	return f
}

func (f *fixture) config(id string, sel replay.Selection) replay.Config {
	return replay.Config{ID: id, Selection: sel, Outbox: f.outbox, Columns: sql.DefaultColumns(),
		Router: router.Config{Topic: f.prefix + "{aggregate_type}"}, CheckpointTable: f.cp, Slot: f.slot, BatchSize: 7}
}

// insert adds rows for aggregate type at, ids i from..to, with created_at.
func (f *fixture) insert(t *testing.T, at string, from, to int, created time.Time) {
	t.Helper()
	f.pg.Exec(t, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT gen_random_uuid(), $1, 'A-' || (i % 3), 'E', jsonb_build_object('n', i), '{"h": "1"}', $4
FROM generate_series($2::int, $3::int) i`, at, from, to, created)
}

func (f *fixture) run(t *testing.T, cfg replay.Config) {
	t.Helper()
	r, err := replay.New(context.Background(), f.pg.Pool(t), f.sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// read returns the payload numbers per key of the messages in a topic
// marked with the run's replay_id (runs, and the live relay, share topics).
func (f *fixture) read(t *testing.T, topic, id string) map[string][]int {
	t.Helper()
	out := map[string][]int{}
	for _, m := range f.kafka.ReadAll(t, topic) {
		var got string
		for _, h := range m.Headers {
			if h.Key == replay.HeaderReplayID {
				got = string(h.Value)
			}
		}
		if got != id {
			continue
		}
		var n int
		fmt.Sscanf(string(m.Value), `{"n": %d}`, &n)
		out[string(m.Key)] = append(out[string(m.Key)], n)
	}
	return out
}

// resumed checks that events 1..n all arrived, after a resume, and returns
// how many were sent more than once.
func resumed(t *testing.T, got map[string][]int, n int) (dups int) {
	t.Helper()
	seen := map[int]int{}
	for _, v := range got {
		for _, i := range v {
			seen[i]++
		}
	}
	for i := 1; i <= n; i++ {
		switch c := seen[i]; {
		case c == 0:
			t.Errorf("event %d missing after the resume", i)
		case c > 1:
			dups += c - 1
		}
	}
	return dups
}

func count(m map[string][]int) int {
	n := 0
	for _, v := range m {
		n += len(v)
	}
	return n
}

// increasing: per key the numbers come in insert order.
func increasing(t *testing.T, m map[string][]int) {
	t.Helper()
	for k, v := range m {
		if !slices.IsSorted(v) {
			t.Errorf("key %s: %v not in insert order", k, v)
		}
	}
}

func TestReplayByTimeAggregateAndTopic(t *testing.T) {
	f := newFixture(t)
	day := time.Now().Add(-48 * time.Hour).UTC().Truncate(time.Second)
	f.insert(t, "Order", 1, 30, day)                    // before --from
	f.insert(t, "Order", 31, 80, day.Add(24*time.Hour)) // selected
	f.insert(t, "Payment", 81, 90, day.Add(24*time.Hour))

	// By time and aggregate type, routed as live.
	f.run(t, f.config("r1", replay.Selection{From: day.Add(time.Hour), AggregateTypes: []string{"Order"}}))
	got := f.read(t, f.prefix+"Order", "r1")
	if count(got) != 50 {
		t.Errorf("replayed %d Order events; want 50 (31..80)", count(got))
	}
	increasing(t, got)
	for _, v := range got {
		if slices.ContainsFunc(v, func(n int) bool { return n < 31 }) {
			t.Errorf("replayed an event before --from: %v", v)
		}
	}

	// By aggregate id, to another topic, in seq order.
	cfg := f.config("r2", replay.Selection{AggregateIDs: []string{"A-1"}})
	cfg.Topic, cfg.OrderBy = f.prefix+"elsewhere", "seq"
	f.run(t, cfg)
	got = f.read(t, f.prefix+"elsewhere", "r2")
	if keys := len(got); keys != 1 || count(got) != 30 {
		t.Errorf("replayed %v to the topic; want the 30 events of A-1 only", got)
	}
	increasing(t, got)

	// A finished run does nothing more; a dry run counts.
	r, err := replay.New(context.Background(), f.pg.Pool(t), f.sink, f.config("r1", replay.Selection{}))
	if err != nil || !r.Finished() {
		t.Errorf("New(r1) = %v, finished %v; want the finished run", err, r != nil && r.Finished())
	}
	r, err = replay.New(context.Background(), f.pg.Pool(t), f.sink, f.config("r3", replay.Selection{From: day.Add(time.Hour)}))
	if err != nil {
		t.Fatal(err)
	}
	if p, err := r.Plan(context.Background()); err != nil || p.Events != 60 || p.Bytes == 0 {
		t.Errorf("Plan = %+v, %v; want 60 events and their bytes", p, err)
	}
	// Another selection under a known id is refused.
	_, err = replay.New(context.Background(), f.pg.Pool(t), f.sink, f.config("r1", replay.Selection{AggregateTypes: []string{"Payment"}}))
	if err == nil || !strings.Contains(err.Error(), "exists with another selection") {
		t.Errorf("New(r1, other selection) = %v; want a refusal", err)
	}
}

// --from-lsn maps a checkpoint through the history: the transactions that
// committed after it are all replayed; those finished before the history's
// snapshot are not.
func TestReplayFromLSN(t *testing.T) {
	f := newFixture(t)
	created := time.Now().Add(-time.Hour)
	f.insert(t, "Order", 1, 20, created)
	hist := replay.HistoryTable(f.cp)
	for _, stmt := range sql.CheckpointHistoryTable(f.cp) {
		f.pg.Exec(t, stmt)
	}
	// Whether another transaction ran (anywhere in the cluster: the
	// snapshot's xmin is cluster-wide) when the history row was written:
	// then the rows before the checkpoint may be selected too.
	var busy bool
	if err := f.pg.Pool(t).QueryRow(context.Background(), fmt.Sprintf(`INSERT INTO %s VALUES ($1, pg_current_wal_lsn(), now(), now(),
    pg_snapshot_xmin(pg_current_snapshot()), pg_current_wal_insert_lsn())
RETURNING pg_snapshot_xmin(pg_current_snapshot()) <> pg_snapshot_xmax(pg_current_snapshot())`, hist.Quoted()), f.slot).Scan(&busy); err != nil {
		t.Fatal(err)
	}
	var checkpoint string
	if err := f.pg.Pool(t).QueryRow(context.Background(), `SELECT pg_current_wal_lsn()::text`).Scan(&checkpoint); err != nil {
		t.Fatal(err)
	}
	f.insert(t, "Order", 21, 45, created) // committed after the checkpoint

	lsn, err := pglogrepl.ParseLSN(checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	f.run(t, f.config("l1", replay.Selection{FromLSN: lsn}))
	got := f.read(t, f.prefix+"Order", "l1")
	seen := map[int]bool{}
	for _, v := range got {
		for _, n := range v {
			seen[n] = true
		}
	}
	for n := 21; n <= 45; n++ {
		if !seen[n] {
			t.Errorf("event %d, committed after %s, was not replayed", n, checkpoint)
		}
	}
	if !busy && count(got) != 25 {
		t.Errorf("replayed %d events from %s; want exactly the 25 committed after it (no other transaction ran)", count(got), checkpoint)
	}
	t.Logf("replayed %d from %s (25 committed after it; other transactions running at the history entry: %v)", count(got), checkpoint, busy)
	increasing(t, got)

	// Before any history entry: refused, naming --from.
	_, err = replay.New(context.Background(), f.pg.Pool(t), f.sink, f.config("l2", replay.Selection{FromLSN: 1}))
	if err == nil || !strings.Contains(err.Error(), "replay by time with --from") {
		t.Errorf("New(--from-lsn 0/1) = %v; want a refusal naming --from", err)
	}
}

// A run stopped half-way (here after three pages) continues from where it
// stopped when run again with its id: nothing missing, repeats at most the
// page in flight, and --from-event starts at that event.
func TestReplayResume(t *testing.T) {
	f := newFixture(t)
	f.insert(t, "Order", 1, 100, time.Now().Add(-time.Hour))
	ctx, cancel := context.WithCancel(context.Background())
	cfg := f.config("k1", replay.Selection{})
	pages := 0
	cfg.Progress = func(replay.Progress) {
		if pages++; pages == 3 {
			cancel() // as a ^C would
		}
	}
	r, err := replay.New(ctx, f.pg.Pool(t), f.sink, cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = r.Run(ctx)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "--id k1") {
		t.Fatalf("Run after cancel = %v; want it interrupted, naming --id k1", err)
	}
	first := count(f.read(t, f.prefix+"Order", "k1"))
	if first >= 100 || first < 21 {
		t.Fatalf("sent %d events before the interruption; want 21 to 99", first)
	}
	f.run(t, f.config("k1", replay.Selection{}))
	got := f.read(t, f.prefix+"Order", "k1")
	dups := resumed(t, got, 100)
	if dups > cfg.BatchSize {
		t.Errorf("%d events sent twice; want at most one page (%d)", dups, cfg.BatchSize)
	}
	t.Logf("interrupted after %d events, resumed: 100 delivered, %d twice", first, dups)

	// --from-event: that event and every one after it.
	var id string
	if err := f.pg.Pool(t).QueryRow(context.Background(), `SELECT id::text FROM public.outbox WHERE payload->>'n' = '90'`).Scan(&id); err != nil {
		t.Fatal(err)
	}
	ecfg := f.config("e1", replay.Selection{FromEvent: id})
	ecfg.OrderBy = "seq"
	f.run(t, ecfg)
	if got := count(f.read(t, f.prefix+"Order", "e1")); got != 11 {
		t.Errorf("--from-event (the 90th) replayed %d; want 11", got)
	}
}

// Concurrent writers that serialise each aggregate's transactions (as
// applications do with a lock on the aggregate): replayed by the seq column,
// each aggregate's events come in commit order, which is the live order.
func TestReplayOrderWithConcurrentWriters(t *testing.T) {
	f := newFixture(t)
	pool := f.pg.Pool(t)
	const writers, perWriter = 4, 60
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				agg := fmt.Sprintf("A-%d", (w+i)%3)
				err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
					// The aggregate's lock; its sequence number under it.
					if _, err := tx.Exec(context.Background(), `SELECT pg_advisory_xact_lock(hashtext($1))`, agg); err != nil {
						return err
					}
					_, err := tx.Exec(context.Background(), `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES (gen_random_uuid(), 'Order', $1, 'E', jsonb_build_object('n', (SELECT count(*) FROM public.outbox WHERE aggregate_id = $1) + 1),
        now() - interval '1 minute')`, agg)
					time.Sleep(time.Millisecond) // hold the lock a little, so writers overlap
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	cfg := f.config("o1", replay.Selection{})
	cfg.OrderBy = "seq"
	f.run(t, cfg)
	got := f.read(t, f.prefix+"Order", "o1")
	if count(got) != writers*perWriter {
		t.Fatalf("replayed %d; want %d", count(got), writers*perWriter)
	}
	for k, v := range got {
		for i, n := range v {
			if n != i+1 {
				t.Fatalf("aggregate %s: replayed %v; want 1, 2, 3, ... (commit order)", k, v)
			}
		}
	}
}

// TestReplayRunsBelongToASlot: a replay table of an earlier version (no
// slot_name) is upgraded by the first replay; its run is resumed, and then
// belongs to that replay's slot. A replay of another slot (another relay
// sharing the checkpoint table's schema) neither resumes nor overwrites it.
func TestReplayRunsBelongToASlot(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.insert(t, "Order", 1, 10, time.Now().Add(-time.Hour))
	f.pg.Exec(t, `CREATE TABLE outbox_relay_replay (run_id text PRIMARY KEY, state jsonb NOT NULL, updated_at timestamptz NOT NULL DEFAULT now())`)
	f.pg.Exec(t, `INSERT INTO outbox_relay_replay (run_id, state) SELECT 'old', jsonb_build_object('selection', '{}'::jsonb, 'started_at', now(), 'sent', 0)`)
	f.run(t, f.config("old", replay.Selection{}))
	if got := count(f.read(t, f.prefix+"Order", "old")); got != 10 {
		t.Errorf("the run of an earlier version, resumed, sent %d; want 10", got)
	}
	var owner *string
	if err := f.pg.Pool(t).QueryRow(ctx, `SELECT slot_name FROM outbox_relay_replay WHERE run_id = 'old'`).Scan(&owner); err != nil || owner == nil || *owner != f.slot {
		t.Errorf("slot of the resumed run = %v, %v; want %s", owner, err, f.slot)
	}

	other := f.config("old", replay.Selection{})
	other.Slot = "billing_relay"
	_, err := replay.New(ctx, f.pg.Pool(t), f.sink, other)
	if err == nil || !strings.Contains(err.Error(), "belongs to slot") || !strings.Contains(err.Error(), "another --id") {
		t.Errorf("replay.New of another slot with the same --id = %v; want an error saying the run is another slot's", err)
	}
	if err := f.pg.Pool(t).QueryRow(ctx, `SELECT slot_name FROM outbox_relay_replay WHERE run_id = 'old'`).Scan(&owner); err != nil || owner == nil || *owner != f.slot {
		t.Errorf("slot of the run after another slot's attempt = %v, %v; want still %s", owner, err, f.slot)
	}
}

// The history is searched by LSN, not by its text: across a change in the
// number of hex digits (0/FFFFFFF -> 0/10000000) the newest row at or
// before the checkpoint is the one with more digits, whose text sorts
// lower. Both a replay (--from-lsn) and a refill's selection (Select) must
// take it, and so select only the transactions after it.
func TestReplayFromLSNAcrossDigitBoundary(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	created := time.Now().Add(-time.Hour)
	for _, stmt := range sql.CheckpointHistoryTable(f.cp) {
		f.pg.Exec(t, stmt)
	}
	xid := func() string {
		var x string
		if err := f.pg.Pool(t).QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&x); err != nil {
			t.Fatal(err)
		}
		return x
	}
	older := xid() // before rows 1-20
	f.insert(t, "Order", 1, 20, created)
	newer := xid() // after rows 1-20, before rows 21-45
	f.insert(t, "Order", 21, 45, created)
	hist := replay.HistoryTable(f.cp).Quoted()
	f.pg.Exec(t, `INSERT INTO `+hist+` (slot_name, lsn, last_commit_time, saved_at, snapshot_xmin, snapshot_lsn)
VALUES ($1, '0/FFFFFFF', now(), now(), $2::text::xid8, '0/FFFFFF0'),
       ($1, '0/10000010', now(), now(), $3::text::xid8, '0/10000000')`, f.slot, older, newer)
	from, err := pglogrepl.ParseLSN("0/10000010")
	if err != nil {
		t.Fatal(err)
	}

	r, err := replay.New(ctx, f.pg.Pool(t), f.sink, f.config("digits", replay.Selection{FromLSN: from}))
	if err != nil {
		t.Fatal(err)
	}
	plan, err := r.Plan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Events != 25 || !strings.Contains(plan.Note, "checkpoint 0/10000010") {
		t.Errorf("replay --from-lsn %s: Plan = %d events (%s); want the 25 after the history row at 0/10000010", from, plan.Events, plan.Note)
	}

	sel, err := replay.Select(ctx, f.pg.Pool(t), replay.Config{Selection: replay.Selection{FromLSN: from}, Outbox: f.outbox,
		Columns: sql.DefaultColumns(), Router: router.Config{Topic: f.prefix + "{aggregate_type}"}, CheckpointTable: f.cp, Slot: f.slot})
	if err != nil {
		t.Fatal(err)
	}
	text, args := sel.SQL()
	var n int64
	if err := f.pg.Pool(t).QueryRow(ctx, `SELECT count(*) FROM (`+text+`) q`, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 25 {
		t.Errorf("refill selection from %s = %d rows (%s); want the 25 after the history row at 0/10000010", from, n, sel.Note())
	}
}

// --from-lsn says when retention (of any slot) recorded deleting rows of
// transactions its range needs: Plan.Pruned names that slot, with exit code
// 5; a record older than the range changes nothing.
func TestReplayFromLSNSaysPruned(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.pg.Exec(t, sql.CheckpointTable(f.cp))
	for _, stmt := range sql.CheckpointHistoryTable(f.cp) {
		f.pg.Exec(t, stmt)
	}
	f.insert(t, "Order", 1, 5, time.Now().Add(-time.Hour))
	f.pg.Exec(t, `INSERT INTO `+replay.HistoryTable(f.cp).Quoted()+` (slot_name, lsn, last_commit_time, saved_at, snapshot_xmin, snapshot_lsn)
VALUES ($1, '0/2000010', now(), now(), '1000', '0/2000000')`, f.slot)
	from, _ := pglogrepl.ParseLSN("0/2000010")
	plan := func(pruned string) replay.Plan {
		t.Helper()
		f.pg.Exec(t, `INSERT INTO `+f.cp.Quoted()+` (slot_name, lsn, pruned) VALUES ('other', '0/3000000', jsonb_build_object('public.outbox', $1::text))
ON CONFLICT (slot_name) DO UPDATE SET pruned = EXCLUDED.pruned`, pruned)
		r, err := replay.New(ctx, f.pg.Pool(t), f.sink, f.config("p"+pruned, replay.Selection{FromLSN: from}))
		if err != nil {
			t.Fatal(err)
		}
		p, err := r.Plan(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if p := plan("999"); p.Pruned != nil {
		t.Errorf("Plan with retention of slot other up to xid 999, range from xid 1000 = pruned %v; want nil", p.Pruned)
	}
	p := plan("1500")
	if p.Pruned == nil || p.Pruned.By.Slot != "other" || exitcode.Of(p.Pruned) != exitcode.Incomplete || !strings.Contains(p.Pruned.Error(), `slot "other"`) {
		t.Errorf("Plan with retention of slot other up to xid 1500, range from xid 1000 = pruned %v; want it named, exit %d", p.Pruned, exitcode.Incomplete)
	}
}
