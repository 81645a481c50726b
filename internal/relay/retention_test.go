package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// retentionConfig is the fixture's relay with retention at test speed: rows
// expire after 2s, history every 100ms, rounds every 200ms in batches of 7.
// The probe slot, which only peeks, is acknowledged as not a reader.
func retentionConfig(t *testing.T, f *fixture) relay.Config {
	cfg := f.config(t)
	cfg.HistoryInterval = 100 * time.Millisecond
	cfg.Retention = retention.Config{Retention: 2 * time.Second, Interval: 200 * time.Millisecond,
		BatchSize: 7, Pause: time.Millisecond, IgnoreSlots: []string{f.probe}}
	cfg.MetricsListen = testenv.FreeAddr(t)
	return cfg
}

// rowsLeft counts the outbox rows among ids.
func (f *fixture) rowsLeft(t *testing.T, ids []string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])`, ids).Scan(&n); err != nil {
		t.Fatalf("count outbox rows: %v", err)
	}
	return n
}

// insertIDs inserts txns transactions of per events and returns their ids.
func (f *fixture) insertIDs(t *testing.T, txns, per int) []string {
	t.Helper()
	var ids []string
	for range txns {
		evs := f.makeEvents(per)
		f.insertTx(t, evs)
		for _, e := range evs {
			ids = append(ids, e.ID)
		}
	}
	return ids
}

// TestRetentionLongTransaction proves retention's invariant with the relay
// running: a row inserted by a transaction that stays open across many
// checkpoints and retention rounds, and whose created_at is long past the
// retention when it commits, is not deleted before the checkpoint covers
// its transaction, and its event reaches Kafka. Rows committed while it is
// open are held back with it; rows before it, delivered, are deleted.
func TestRetentionLongTransaction(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	cfg := retentionConfig(t, f)
	run := f.start(t, cfg)
	metricsURL := "http://" + cfg.MetricsListen + "/metrics"
	waitFor := func(what string, timeout time.Duration, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(timeout); !cond(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %s: %s", timeout, what)
			}
		}
	}

	// Before the long transaction: delivered, expired, deleted.
	before := f.insertIDs(t, 3, 5)
	// Deleting waits for every transaction older than the rows to end, on
	// the whole server: other tests share it, hence the generous timeouts.
	waitFor("the rows before the long transaction are still there", 90*time.Second,
		func() bool { return f.rowsLeft(t, before) == 0 })

	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	long := f.makeEvents(1)[0]
	if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`,
		long.ID, long.AggregateType, long.AggregateID, long.EventType, long.Payload); err != nil {
		t.Fatal(err)
	}
	openedAt := time.Now()

	// While it is open: more transactions, delivered, checkpointed many
	// times, older than the retention, through many rounds.
	var during []string
	for range 5 {
		during = append(during, f.insertIDs(t, 1, 5)...)
		time.Sleep(300 * time.Millisecond)
	}
	f.waitCount(t, len(before)+len(during), time.Minute)
	time.Sleep(3 * time.Second)
	if n := f.rowsLeft(t, during); n != len(during) {
		t.Fatalf("while a transaction older than them is open: %d of %d delivered, expired rows left; want all kept", n, len(during))
	}
	if lag := sumMetric(httpGet(t, metricsURL, 200), "outbox_relay_retention_lag_seconds"); lag <= 0 {
		t.Errorf("outbox_relay_retention_lag_seconds while rows are held back = %v; want > 0", lag)
	}

	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	ends := f.commitEnds(t)
	longEnd := ends[len(ends)-1] // the last outbox transaction to commit
	if age := time.Since(openedAt); age < cfg.Retention.Retention {
		t.Fatalf("the long transaction was open %s; want longer than the retention %s", age, cfg.Retention.Retention)
	}
	// Its row is expired the moment it appears. Watch it until it goes,
	// with traffic moving the checkpoint on: it must not go before the
	// checkpoint covers its transaction. (Presence is read first: the
	// checkpoint only grows, so a later reading below its end proves an
	// early delete.)
	var after []string
	waitFor("the long transaction's row is still there", 90*time.Second, func() bool {
		present := f.rowsLeft(t, []string{long.ID}) == 1
		if cp := f.checkpointLSN(t); !present && cp < longEnd {
			t.Fatalf("the long transaction's row was deleted while the checkpoint (%s) was before its commit (%s)", cp, longEnd)
		}
		if !present {
			return true
		}
		after = append(after, f.insertIDs(t, 1, 1)...)
		time.Sleep(200 * time.Millisecond)
		return false
	})
	waitFor("the rows committed during the long transaction are still there", 90*time.Second,
		func() bool { return f.rowsLeft(t, during) == 0 })

	// Every event reached Kafka, once.
	all := append(append(append([]string{}, before...), during...), long.ID)
	all = append(all, after...)
	got := f.waitCount(t, len(all), time.Minute)
	seen := map[string]int{}
	for _, d := range got {
		seen[d.Headers["id"]]++
	}
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("event %s is in Kafka %d times; want once", id, seen[id])
		}
	}
	body := httpGet(t, metricsURL, 200)
	if n := sumMetric(body, "outbox_relay_retention_deleted_total"); n < float64(len(before)+len(during)+1) {
		t.Errorf("outbox_relay_retention_deleted_total = %v; want at least %d", n, len(before)+len(during)+1)
	}
	if last := sumMetric(body, "outbox_relay_retention_last_round_timestamp_seconds"); last < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("outbox_relay_retention_last_round_timestamp_seconds = %v; want within the last minute", last)
	}
	var history int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_checkpoint_history WHERE slot_name = $1`, f.slot).Scan(&history); err != nil || history < 5 {
		t.Errorf("checkpoint history rows = %d, %v; want several (the relay created the table and records into it)", history, err)
	}
	run.stop(t)
}

// TestRetentionNeedsCreatedAt: retention that cannot work stops the relay at
// start, saying why and how to fix it.
func TestRetentionNeedsCreatedAt(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `ALTER TABLE outbox DROP COLUMN created_at`)
	r, err := newRelay(t, retentionConfig(t, f))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var fe *field.Error
	if !errors.As(err, &fe) || fe.Field != "Retention.Retention" || !strings.Contains(err.Error(), `no "created_at" column`) {
		t.Errorf("Run with retention on a table without created_at = %v; want a *field.Error of Retention.Retention naming the column", err)
	}
}

// TestInsertThenDelete: an application that deletes its outbox row in the
// same transaction that inserted it (Debezium's pattern) still has its
// event delivered: the relay reads the insert from the WAL, and the
// publication does not even send the delete. The table stays empty, so
// nothing is left to replay.
func TestInsertThenDelete(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	run := f.start(t, f.config(t))
	evs := f.makeEvents(3)
	b := &pgx.Batch{}
	for _, e := range evs {
		b.Queue(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`,
			e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload)
		b.Queue(`DELETE FROM outbox WHERE id = $1`, e.ID)
	}
	f.commitBatch(t, b)
	got := f.waitCount(t, len(evs), time.Minute)
	seen := map[string]string{}
	for _, d := range got {
		seen[d.Headers["id"]] = d.Value
	}
	for _, e := range evs {
		if seen[e.ID] == "" {
			t.Errorf("event %s, deleted in the transaction that inserted it, is not in Kafka", e.ID)
		}
	}
	var n int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox`).Scan(&n); err != nil || n != 0 {
		t.Errorf("outbox rows = %d, %v; want 0", n, err)
	}
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	run.stop(t)
}

// TestRetentionWaitsForAnotherRelay is issue 34's case 2: two relays with
// slots of their own on one outbox (blue/green, a migration running side
// by side). While B is stopped, A delivers 50 events and its retention
// would delete them, but B has not: they stay, counted as kept for B's
// slot. When B's slot is then lost, recover refills all 50 from the table,
// and afterwards A's retention deletes them.
func TestRetentionWaitsForAnotherRelay(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	cfgB := f.otherReader(t, "blue")

	cfgA := retentionConfig(t, f)
	f.start(t, cfgA)
	ids := f.insertIDs(t, 10, 5)
	f.waitAll(t, time.Minute)
	// Wait until A's own horizon covers the 50 (a dry round counts them
	// as kept for B), then give A's running retention a few more rounds.
	rc := cfgA.Retention
	rc.Table, rc.CheckpointTable, rc.Slot, rc.DryRun = "public.outbox", "outbox_relay_checkpoint", f.slot, true
	var res retention.Result
	waitFor(t, time.Minute, "A's horizon past the 50 rows, kept for B", func() (bool, string) {
		var err error
		if res, err = retention.Round(ctx, f.pool, rc); err != nil {
			return false, err.Error()
		}
		return res.KeptForReaders >= 50, fmt.Sprintf("kept %d for %+v, %s", res.KeptForReaders, res.HeldBy, res.NoHorizon)
	})
	if len(res.HeldBy) != 1 || res.HeldBy[0].Slot != cfgB.Replication.Slot {
		t.Errorf("dry round held by %+v; want B's slot %s alone", res.HeldBy, cfgB.Replication.Slot)
	}
	time.Sleep(5 * rc.Interval)
	if n := f.rowsLeft(t, ids); n != 50 {
		t.Fatalf("A's retention left %d of the 50 rows B has not delivered; want all 50", n)
	}

	// B's slot lost: its refill finds every row.
	f.pg.Exec(t, `SELECT pg_drop_replication_slot($1)`, cfgB.Replication.Slot)
	r, err := newRelay(t, cfgB)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := r.Recover(ctx, false)
	if err != nil || rr.Pruned != nil {
		t.Fatalf("Recover of B = %+v, %v; want a refill with nothing pruned", rr, err)
	}
	refilled := map[string]bool{}
	for _, d := range f.readAll(t) {
		if d.Headers[relay.HeaderRefillID] == rr.ID {
			refilled[d.Headers["id"]] = true
		}
	}
	for _, id := range ids {
		if !refilled[id] {
			t.Errorf("event %s was not refilled for B (%d refilled, %d events in the refill)", id, len(refilled), rr.Events)
			break
		}
	}
	// B has passed them now: A's retention deletes them.
	waitFor(t, time.Minute, "A's retention to delete the rows B has passed", func() (bool, string) {
		n := f.rowsLeft(t, ids)
		return n == 0, fmt.Sprintf("%d left", n)
	})
}

// TestRecoverSaysRowsPruned: when retention did delete rows another slot
// needed (here its slot was listed in outbox.retention_ignore_slots by
// mistake), that slot's recover sends what is left and says the rest may
// be gone, naming the slot whose retention pruned them, with exit code 5:
// never "sent 0 events" and exit 0.
func TestRecoverSaysRowsPruned(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	cfgB := f.otherReader(t, "green")

	cfgA := retentionConfig(t, f)
	cfgA.Retention.IgnoreSlots = append(cfgA.Retention.IgnoreSlots, cfgB.Replication.Slot)
	f.start(t, cfgA)
	ids := f.insertIDs(t, 10, 5)
	waitFor(t, time.Minute, "A's retention to delete the 50 rows", func() (bool, string) {
		n := f.rowsLeft(t, ids)
		return n == 0, fmt.Sprintf("%d left", n)
	})

	f.pg.Exec(t, `SELECT pg_drop_replication_slot($1)`, cfgB.Replication.Slot)
	for _, dry := range []bool{true, false} {
		r, err := newRelay(t, cfgB)
		if err != nil {
			t.Fatal(err)
		}
		rr, err := r.Recover(ctx, dry)
		if err != nil {
			t.Fatalf("Recover(dry run %v) of B = %v; want a refill", dry, err)
		}
		if rr.Pruned == nil || exitcode.Of(rr.Pruned) != exitcode.Incomplete || rr.Pruned.By.Slot != f.slot ||
			!strings.Contains(rr.Pruned.Error(), strconv.Quote(f.slot)) || !strings.Contains(rr.Pruned.Error(), "rows found") {
			t.Errorf("Recover(dry run %v) of B after A pruned its rows = %d events, pruned %v; want it to say rows may be gone, pruned by slot %s, exit %d",
				dry, rr.Events, rr.Pruned, f.slot, exitcode.Incomplete)
		}
	}
}

// otherReader runs relay B on a slot of its own (named after prefix) over
// the fixture's outbox until it has delivered a few events and written a
// history row at or before its checkpoint, then stops it: another reader of
// the outbox that retention must wait for. It returns B's config.
func (f *fixture) otherReader(t *testing.T, prefix string) relay.Config {
	t.Helper()
	cfgB := f.refillConfig(t)
	cfgB.OnSlotLoss = relay.OnSlotLossFail
	cfgB.Replication.Slot = testenv.UniqueName(t, prefix)
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, cfgB.Replication.Slot)
	runB := f.start(t, cfgB)
	f.insertIDs(t, 2, 5)
	waitFor(t, time.Minute, "a history row of B at or before its checkpoint", func() (bool, string) {
		var ok bool
		err := f.pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM outbox_relay_checkpoint_history h
JOIN outbox_relay_checkpoint c USING (slot_name) WHERE c.slot_name = $1 AND h.snapshot_lsn <= c.lsn)`, cfgB.Replication.Slot).Scan(&ok)
		if err != nil {
			return false, err.Error()
		}
		return ok, "none yet"
	})
	runB.stop(t)
	return cfgB
}
