package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
)

// retentionConfig is the fixture's relay with retention at test speed: rows
// expire after 2s, history every 100ms, rounds every 200ms in batches of 7.
func retentionConfig(t *testing.T, f *fixture) relay.Config {
	cfg := f.config(t)
	cfg.HistoryInterval = 100 * time.Millisecond
	cfg.Retention = retention.Config{Retention: 2 * time.Second, Interval: 200 * time.Millisecond,
		BatchSize: 7, Pause: time.Millisecond}
	cfg.MetricsListen = freeAddr(t)
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
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	for _, e := range evs {
		if _, err := tx.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`,
			e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, e.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
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
