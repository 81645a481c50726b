package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/router"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// partitionedOutbox replaces the fixture's outbox with one partitioned by
// created_at by month (2026-01, 2026-02) plus a default partition, and its
// publication with one made as setup makes it (viaRoot) or as an older setup
// did (partitions published under their own names).
func (f *fixture) partitionedOutbox(t *testing.T, viaRoot bool) {
	t.Helper()
	f.pg.Exec(t, `DROP PUBLICATION outbox_relay`)
	f.pg.Exec(t, `DROP TABLE outbox`)
	f.pg.Exec(t, `CREATE TABLE outbox (
    id uuid NOT NULL,
    aggregate_type text NOT NULL,
    aggregate_id text NOT NULL,
    event_type text NOT NULL,
    payload jsonb,
    headers jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)
) PARTITION BY RANGE (created_at)`)
	f.pg.Exec(t, `CREATE TABLE outbox_2026_01 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2026-02-01')`)
	// Columns in another order than the parent's: a partition attached
	// from a table made on its own may have them so.
	f.pg.Exec(t, `CREATE TABLE outbox_2026_02 (payload jsonb, created_at timestamptz NOT NULL DEFAULT now(), id uuid NOT NULL,
    headers jsonb, event_type text NOT NULL, aggregate_id text NOT NULL, aggregate_type text NOT NULL)`)
	f.pg.Exec(t, `ALTER TABLE outbox ATTACH PARTITION outbox_2026_02 FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')`)
	f.pg.Exec(t, `CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
	if viaRoot {
		f.pg.Exec(t, outboxsql.CreatePublication("outbox_relay", outboxsql.Table{Schema: "public", Name: "outbox"}))
	} else {
		f.pg.Exec(t, `CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert')`)
	}
	// The slot must decode with the new publication: recreate it after.
	f.pg.DropSlot(t, f.slot)
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
}

// stoppedBefore returns the stop record's commit LSN, failing without one.
func (f *fixture) stoppedBefore(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s *string
	if err := f.pool.QueryRow(context.Background(), `SELECT stopped_before::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, f.slot).Scan(&s); err != nil {
		t.Fatal(err)
	}
	if s == nil {
		t.Fatal("no stop recorded in the checkpoint row")
	}
	return mustLSN(t, *s)
}

// runToStop runs a relay with cfg until it stops by itself, and returns the
// *placement.Error it stopped with (failing the test on any other outcome).
func runToStop(t *testing.T, cfg relay.Config) (*placement.Error, error) {
	t.Helper()
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	var pe *placement.Error
	if !errors.As(err, &pe) {
		t.Fatalf("Run = %v; want it to stop with a *placement.Error", err)
	}
	return pe, err
}

// ledger is what a test inserted, in commit order, to compare with Kafka:
// the outbox table cannot say, since partitions are detached and dropped.
type ledger struct {
	evs []event
}

// insertAt inserts evs in one transaction into table with created_at at,
// and records them.
func (l *ledger) insertAt(t *testing.T, f *fixture, table string, at string, evs []event) {
	t.Helper()
	b := &pgx.Batch{}
	for _, e := range evs {
		b.Queue(`INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
VALUES ($1, $2, $3, $4, $5::jsonb, nullif($6, '')::jsonb, $7::timestamptz)`,
			e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers, at)
	}
	f.commitBatch(t, b)
	l.evs = append(l.evs, evs...)
}

// check waits until Kafka holds every recorded event, then asserts none is
// missing, duplicated or out of order per aggregate, and each has its row's
// key and value.
func (l *ledger) check(t *testing.T, f *fixture) { l.checkDups(t, f, 0) }

// checkDelivering runs a relay told that table's inserts are events (the
// fix a placement stop prints), checks as check does, and stops it.
func (l *ledger) checkDelivering(t *testing.T, f *fixture, table string) {
	t.Helper()
	cfg := f.config(t)
	cfg.OtherTables = map[string]placement.Action{table: placement.Deliver}
	run := f.start(t, cfg)
	l.check(t, f)
	run.stop(t)
}

// checkDups is check allowing up to maxDups duplicates (a killed relay
// resends what it had not confirmed); order is checked on first deliveries.
func (l *ledger) checkDups(t *testing.T, f *fixture, maxDups int) {
	t.Helper()
	// Wait for every recorded event, not for as many messages: with
	// duplicates in Kafka a message count is reached before the last
	// events arrive.
	var got []delivered
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got = f.readAll(t)
		seen := make(map[string]bool, len(got))
		for _, d := range got {
			seen[d.Headers["id"]] = true
		}
		missing := 0
		for _, e := range l.evs {
			if !seen[e.ID] {
				missing++
			}
		}
		if missing == 0 || time.Now().After(deadline) {
			break
		}
	}
	byID := map[string]int{}
	lastSeq := map[string]int{}
	want := map[string]event{}
	for _, e := range l.evs {
		want[e.ID] = e
	}
	lost, dups, order, mismatch := 0, 0, 0, 0
	for _, d := range got {
		id := d.Headers["id"]
		byID[id]++
		if byID[id] > 1 {
			dups++
			continue
		}
		e, ok := want[id]
		if !ok || d.Key != e.AggregateID || !sameJSON(d.Value, e.Payload) {
			mismatch++
			continue
		}
		var p struct{ Seq int }
		json.Unmarshal([]byte(e.Payload), &p)
		if p.Seq <= lastSeq[e.AggregateID] {
			order++
		}
		lastSeq[e.AggregateID] = p.Seq
	}
	for id := range want {
		if byID[id] == 0 {
			lost++
		}
	}
	if lost+order+mismatch > 0 || dups > maxDups {
		t.Errorf("Kafka against the %d inserted events: lost %d, duplicates %d (bound %d), order violations %d, mismatches %d; want 0 but for duplicates within the bound",
			len(l.evs), lost, dups, maxDups, order, mismatch)
	}
	t.Logf("%d events: lost %d, duplicates %d (bound %d), order violations %d", len(l.evs), lost, dups, maxDups, order)
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return string(xb) == string(yb)
}

// TestPartitionedOutbox: an outbox partitioned by created_at, published as
// setup publishes it (via the root), loses nothing across partitions with
// columns in another order, a partition attached and one detached while
// the relay runs, and a restart.
func TestPartitionedOutbox(t *testing.T) {
	f := newFixture(t)
	f.partitionedOutbox(t, true)
	var l ledger
	run := f.start(t, f.config(t))
	l.insertAt(t, f, "outbox", "2026-01-15", f.makeEvents(20))
	l.insertAt(t, f, "outbox", "2026-02-15", f.makeEvents(20))
	l.insertAt(t, f, "outbox", "2027-05-01", f.makeEvents(20)) // default partition
	// Straight into a partition, as some applications write.
	l.insertAt(t, f, "outbox_2026_02", "2026-02-20", f.makeEvents(10))
	f.pg.Exec(t, `CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING DEFAULTS)`)
	f.pg.Exec(t, `ALTER TABLE outbox ATTACH PARTITION outbox_2026_03 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')`)
	l.insertAt(t, f, "outbox", "2026-03-02", f.makeEvents(20))
	l.insertAt(t, f, "outbox", "2026-01-20", f.makeEvents(5))
	f.pg.Exec(t, `ALTER TABLE outbox DETACH PARTITION outbox_2026_01`)
	l.insertAt(t, f, "outbox", "2026-03-05", f.makeEvents(20))
	l.check(t, f)
	run.stop(t)

	// After a restart: more rows, one transaction across three partitions.
	run = f.start(t, f.config(t))
	evs := f.makeEvents(30)
	l.insertAt(t, f, "outbox", "2026-02-03", evs[:10])
	l.insertAt(t, f, "outbox", "2026-03-03", evs[10:20])
	l.insertAt(t, f, "outbox", "2028-01-01", evs[20:])
	l.check(t, f)
	run.stop(t)
}

// TestPartitionedOutboxUnplaced: with a publication from an older setup
// (partitions published under their own names), inserts into an attached
// partition are delivered, found by the catalog. An insert into a partition
// that is detached before the relay reads it cannot be told from another
// table's: the relay stops before it, confirming nothing from it on, and
// names the fix; with the fix applied nothing is lost.
func TestPartitionedOutboxUnplaced(t *testing.T) {
	f := newFixture(t)
	f.partitionedOutbox(t, false)
	var l ledger
	run := f.start(t, f.config(t))
	l.insertAt(t, f, "outbox", "2026-01-15", f.makeEvents(20))
	l.insertAt(t, f, "outbox", "2026-02-15", f.makeEvents(20))
	l.check(t, f)
	run.stop(t)
	confirmed := f.slotConfirmed(t)

	// While the relay is down: rows go into January, which is then detached.
	l.insertAt(t, f, "outbox", "2026-01-16", f.makeEvents(10))
	f.pg.Exec(t, `ALTER TABLE outbox DETACH PARTITION outbox_2026_01`)
	l.insertAt(t, f, "outbox", "2026-02-16", f.makeEvents(10))

	ctx := context.Background()
	pe, err := runToStop(t, f.config(t))
	if pe.Action != placement.Stop || pe.Table != "public.outbox_2026_01" {
		t.Fatalf("Run after the detach = %v; want a *placement.Error stopping before public.outbox_2026_01", err)
	}
	for _, want := range []string{"detached", `{"public.outbox_2026_01": deliver}`, "nothing is lost"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run's error %q does not say %q", err, want)
		}
	}
	// Nothing at or past the transaction it stopped in is confirmed: the
	// stop record names that transaction's commit LSN.
	stoppedBefore := f.stoppedBefore(t)
	if stoppedBefore <= confirmed {
		t.Fatalf("stop recorded before %s, not after the last run's position %s", stoppedBefore, confirmed)
	}
	if got := f.slotConfirmed(t); got > stoppedBefore {
		t.Errorf("slot confirmed_flush_lsn %s is past the transaction committed at %s, which holds the insert the relay could not place", got, stoppedBefore)
	}
	if got := f.checkpointLSN(t); got > stoppedBefore {
		t.Errorf("checkpoint %s is past the transaction committed at %s, which holds the insert the relay could not place", got, stoppedBefore)
	}

	// lag and status say so while the relay is down; lag exits 1.
	ocfg := ops.Config{Slot: f.slot}
	var buf strings.Builder
	lerr := ops.RunLag(ctx, f.pool, ocfg, &buf, ops.LagOptions{})
	var se *ops.StoppedError
	if !errors.As(lerr, &se) || exitcode.Of(lerr) != exitcode.Failure || !strings.Contains(se.Reason, "public.outbox_2026_01") {
		t.Errorf("lag after the stop = %v (exit %d); want a *ops.StoppedError naming public.outbox_2026_01, exit 1", lerr, exitcode.Of(lerr))
	}
	st, err := ops.Status(ctx, f.pool, ocfg)
	if err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	st.WriteText(&buf)
	if !strings.Contains(buf.String(), "STOPPED") || !strings.Contains(buf.String(), `{"public.outbox_2026_01": deliver}`) {
		t.Errorf("status after the stop does not say it stopped and the fix:\n%s", buf.String())
	}

	// Restarted without the fix, it reports the stop on /readyz until it
	// stops there again.
	r2, err := newRelay(t, f.config(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r2.Run(ctx) }()
	var readyErr error
poll:
	for {
		select {
		case err := <-done:
			if !errors.As(err, &pe) {
				t.Fatalf("relay restarted without the fix = %v; want it to stop again with a *placement.Error", err)
			}
			break poll
		case <-time.After(5 * time.Millisecond):
			if err := r2.Ready(ctx); err != nil && strings.Contains(err.Error(), "the last run stopped before the transaction committed at") {
				readyErr = err
			}
		}
	}
	if readyErr == nil || !strings.Contains(readyErr.Error(), "public.outbox_2026_01") {
		t.Errorf("Ready of a relay restarted without the fix never reported the last stop naming public.outbox_2026_01 (last: %v)", readyErr)
	}

	// The printed fix: the operator says the table's inserts are events.
	l.checkDelivering(t, f, "public.outbox_2026_01")
	// Past the transaction it stopped in, the record is gone.
	if lerr := ops.RunLag(ctx, f.pool, ocfg, &buf, ops.LagOptions{}); lerr != nil {
		t.Errorf("lag once the relay passed the stop = %v; want nil", lerr)
	}
}

// TestPartitionedOutboxSIGKILL: relay processes killed with SIGKILL while
// events go into several partitions, one attached and one detached between
// kills: nothing lost, order kept, duplicates within the window.
func TestPartitionedOutboxSIGKILL(t *testing.T) {
	f := newFixture(t)
	f.partitionedOutbox(t, true)
	var l ledger
	months := []string{"2026-01-10", "2026-02-10", "2029-01-01"}
	const kills = 3
	for k := range kills {
		p := f.startProcess(t)
		before := len(f.readAll(t))
		for i := range 15 {
			l.insertAt(t, f, "outbox", months[i%len(months)], f.makeEvents(100))
		}
		// Killed while it streams: once it has delivered some of them.
		f.waitCount(t, before+1, time.Minute)
		p.cmd.Process.Kill()
		<-p.done
		for i := range 5 {
			l.insertAt(t, f, "outbox", months[i%len(months)], f.makeEvents(100))
		}
		switch k {
		case 0:
			f.pg.Exec(t, `CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING DEFAULTS)`)
			f.pg.Exec(t, `ALTER TABLE outbox ATTACH PARTITION outbox_2026_03 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')`)
			months = append(months, "2026-03-10")
		case 1:
			f.pg.Exec(t, `ALTER TABLE outbox DETACH PARTITION outbox_2026_01`)
			months = months[1:]
		}
	}
	f.startProcess(t)
	l.checkDups(t, f, kills*processWindow)
}

// TestOutboxRenamedWhileRunning: the outbox renamed while the relay runs is
// the outbox under a name the config does not have: the relay stops before
// the first insert under the new name and says to set outbox.table; once
// set, every event, before and after the rename, is delivered once.
func TestOutboxRenamedWhileRunning(t *testing.T) {
	f := newFixture(t)
	run := f.start(t, f.config(t))
	before := f.makeEvents(20)
	f.insertTx(t, before)
	f.waitCount(t, len(before), 60*time.Second)
	f.pg.Exec(t, `ALTER TABLE outbox RENAME TO events_outbox`)
	after := f.makeEvents(20)
	var l ledger
	l.evs = before
	l.insertAt(t, f, "events_outbox", "2026-06-01", after)
	err := run.exited(t, 60*time.Second, "the relay did not stop within 60s of inserts under the outbox's new name")
	var pe *placement.Error
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "set outbox.table to public.events_outbox") {
		t.Fatalf("relay stopped with %v; want a *placement.Error saying to set outbox.table to public.events_outbox", err)
	}
	if got := len(f.readAll(t)); got != len(before) {
		t.Errorf("%d events in Kafka after the stop; want the %d from before the rename", got, len(before))
	}
	cfg := f.config(t)
	cfg.Table = "public.events_outbox"
	run = f.start(t, cfg)
	l.check(t, f)
	run.stop(t)
}

// TestOutboxInheritanceChild: a table inheriting from the outbox may hold
// events or not (an archive): the relay stops before its first insert;
// the operator's decision is then honoured both ways.
func TestOutboxInheritanceChild(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `CREATE TABLE outbox_archive () INHERITS (outbox)`)
	f.pg.Exec(t, `CREATE TABLE outbox_child () INHERITS (outbox)`)
	// As CREATE PUBLICATION ... FOR TABLE outbox (without ONLY) adds them.
	f.pg.Exec(t, `ALTER PUBLICATION outbox_relay ADD TABLE outbox_archive, outbox_child`)
	var l ledger
	l.insertAt(t, f, "outbox", "2026-06-01", f.makeEvents(10))
	archived := f.makeEvents(5)
	var scratch ledger
	scratch.insertAt(t, f, "outbox_archive", "2026-06-01", archived)
	l.insertAt(t, f, "outbox_child", "2026-06-01", f.makeEvents(10))

	if pe, err := runToStop(t, f.config(t)); pe.Table != "public.outbox_archive" || !strings.Contains(err.Error(), "inherits from the outbox") {
		t.Fatalf("Run = %v; want a *placement.Error for the inheritance child public.outbox_archive", err)
	}
	if got := len(f.readAll(t)); got != 10 {
		t.Errorf("%d events in Kafka after the stop; want the 10 committed before the child's insert", got)
	}
	cfg := f.config(t)
	cfg.OtherTables = map[string]placement.Action{
		"public.outbox_archive": placement.Ignore,
		"public.outbox_child":   placement.Deliver,
	}
	run := f.start(t, cfg)
	l.check(t, f)
	run.stop(t)
	for _, d := range f.readAll(t) {
		for _, e := range archived {
			if d.Headers["id"] == e.ID {
				t.Errorf("archived event %s was delivered; the operator said to ignore %s", e.ID, "public.outbox_archive")
			}
		}
	}
}

// TestOtherTableIgnored: a table the publication covers in its own right,
// unrelated to the outbox, is provably not the outbox: ignored, nothing
// stops.
func TestOtherTableIgnored(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `ALTER PUBLICATION outbox_relay ADD TABLE orders`)
	run := f.start(t, f.config(t))
	var l ledger
	for range 3 {
		evs := f.makeEvents(10)
		f.insertTx(t, evs) // with a row of orders in the same transaction
		l.evs = append(l.evs, evs...)
	}
	l.check(t, f)
	run.stop(t)
}

// TestPartitionDroppedBeforeRead: a partition published under its own name,
// detached and dropped before the relay read its inserts, has no catalog
// entry left: the relay stops before its inserts, and delivers them once
// the operator says they are events.
func TestPartitionDroppedBeforeRead(t *testing.T) {
	f := newFixture(t)
	f.partitionedOutbox(t, false)
	var l ledger
	l.insertAt(t, f, "outbox", "2026-02-15", f.makeEvents(10))
	l.insertAt(t, f, "outbox", "2026-01-15", f.makeEvents(10))
	f.pg.Exec(t, `ALTER TABLE outbox DETACH PARTITION outbox_2026_01`)
	f.pg.Exec(t, `DROP TABLE outbox_2026_01`)
	l.insertAt(t, f, "outbox", "2026-02-16", f.makeEvents(10))

	if pe, err := runToStop(t, f.config(t)); pe.Table != "public.outbox_2026_01" || !strings.Contains(err.Error(), "dropped since") {
		t.Fatalf("Run = %v; want a *placement.Error saying public.outbox_2026_01 was dropped", err)
	}
	if got := len(f.readAll(t)); got != 10 {
		t.Errorf("%d events in Kafka after the stop; want the 10 committed before", got)
	}
	l.checkDelivering(t, f, "public.outbox_2026_01")
}

// TestDebeziumTableWithoutEventType: a Debezium-layout outbox without the
// "type" column, which Debezium's router reads only when something uses
// it, streams unchanged when nothing does.
func TestDebeziumTableWithoutEventType(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `DROP PUBLICATION outbox_relay`)
	f.pg.Exec(t, `CREATE TABLE dbz_outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	f.pg.Exec(t, outboxsql.CreatePublication("outbox_relay", outboxsql.Table{Schema: "public", Name: "dbz_outbox"}))
	f.pg.DropSlot(t, f.slot)
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	cfg := f.config(t)
	cfg.Table = "public.dbz_outbox"
	cfg.Router.Columns = router.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload", Headers: "-"}
	cfg.Router.Headers = []string{router.HeaderID}
	run := f.start(t, cfg)
	evs := f.makeEvents(25)
	for _, e := range evs {
		f.pg.Exec(t, `INSERT INTO dbz_outbox (id, aggregatetype, aggregateid, payload) VALUES ($1, $2, $3, $4::jsonb)`,
			e.ID, e.AggregateType, e.AggregateID, e.Payload)
	}
	got := f.waitCount(t, len(evs), time.Minute)
	run.stop(t)
	byID := map[string]delivered{}
	for _, d := range got {
		byID[d.Headers["id"]] = d
	}
	for _, e := range evs {
		d, ok := byID[e.ID]
		if !ok || d.Key != e.AggregateID || !sameJSON(d.Value, e.Payload) || len(d.Headers) != 1 {
			t.Errorf("event %s = %+v, delivered %v; want key %q, its payload, only the id header", e.ID, d, ok, e.AggregateID)
		}
	}
}

// TestPartitionedOutboxRetention: a relay with outbox.retention_partitions
// drop on a partitioned outbox drops each month once every row in it is
// delivered, never the default partition, and loses no event doing so.
func TestPartitionedOutboxRetention(t *testing.T) {
	f := newFixture(t)
	f.partitionedOutbox(t, true)
	cfg := retentionConfig(t, f)
	cfg.Retention.Partitions = retention.PartitionsDrop
	run := f.start(t, cfg)
	var l ledger
	for i := range 6 {
		l.insertAt(t, f, "outbox", []string{"2026-01-10", "2026-02-10", "2029-01-01"}[i%3], f.makeEvents(20))
	}
	f.pg.Exec(t, `CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING DEFAULTS)`)
	f.pg.Exec(t, `ALTER TABLE outbox ATTACH PARTITION outbox_2026_03 FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')`)
	l.insertAt(t, f, "outbox", "2026-03-10", f.makeEvents(20))
	l.check(t, f)

	partitions := func() string {
		var s string
		if err := f.pool.QueryRow(context.Background(), `SELECT string_agg(c.relname, ',' ORDER BY c.relname)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'outbox'::regclass`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	// Deleting waits for every older transaction on the whole server to
	// end (the horizon): other tests share it, hence the generous timeout.
	deadline := time.Now().Add(90 * time.Second)
	for partitions() != "outbox_default" {
		if time.Now().After(deadline) {
			t.Fatalf("after 90s the outbox has partitions %s; want only outbox_default (every month delivered and past the retention)", partitions())
		}
		time.Sleep(100 * time.Millisecond)
	}
	var left int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 40 {
		t.Errorf("%d rows left; want the 40 of the default partition (created in 2029: not past the retention)", left)
	}
	run.stop(t)
	l.check(t, f)
}
