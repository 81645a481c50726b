package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TestEndToEnd streams more than 10k events of five aggregate types, written in
// transactions of 1, 100 and 1000 events, one multi-row INSERT and one COPY,
// each transaction also writing another table. Every event must arrive exactly
// once with exact key, value and headers, per-aggregate order must equal commit
// order, and the slot must be confirmed up to the last transaction.
func TestEndToEnd(t *testing.T) {
	f := newFixture(t)
	run := f.start(t, f.config(t))

	total := 0
	for range 200 {
		f.insertTx(t, f.makeEvents(1))
		total++
	}
	for range 20 {
		f.insertTx(t, f.makeEvents(100))
		total += 100
	}
	for range 6 {
		f.insertTx(t, f.makeEvents(1000))
		total += 1000
	}
	f.insertMultiRow(t, f.makeEvents(1500))
	total += 1500
	f.insertCopy(t, f.makeEvents(500))
	total += 500

	f.waitCount(t, total, 2*time.Minute)
	ends := f.commitEnds(t)
	if len(ends) != 228 {
		t.Fatalf("probe slot saw %d outbox transactions; want 228", len(ends))
	}
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)

	got := f.readAll(t)
	rep := f.check(t, got)
	if len(got) != total || rep != (report{}) {
		t.Fatalf("Kafka holds %d events; want %d exactly once: lost %d, duplicates %d, order violations %d, mismatches %d; first: %s",
			len(got), total, rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	run.stop(t)
}

// TestKafkaDownHoldsLSN checks ack after confirm: while Kafka is down, neither
// the slot's confirmed_flush_lsn nor the checkpoint may pass a transaction that
// Kafka has not acknowledged; when Kafka is back, everything arrives.
func TestKafkaDownHoldsLSN(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	run := f.start(t, f.config(t))

	f.deliveredTx(t, 10)

	testenv.StopKafka(t)
	kafkaUp := false
	defer func() {
		if !kafkaUp {
			testenv.StartKafka(t)
		}
	}()
	for range 3 {
		f.insertTx(t, f.makeEvents(50))
	}
	ends := f.commitEnds(t)
	held := ends[1] // end of the first transaction written while Kafka is down
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); {
		if slot := f.slotConfirmed(t); slot >= held {
			t.Fatalf("Kafka down: slot confirmed_flush_lsn = %s; want < %s (an undelivered transaction's end)", slot, held)
		}
		if cp := f.checkpointLSN(t); cp >= held {
			t.Fatalf("Kafka down: checkpoint = %s; want < %s (an undelivered transaction's end)", cp, held)
		}
		run.runsFor(t, 200*time.Millisecond, "relay stopped while Kafka was down: %v; want it to wait for Kafka")
	}

	testenv.StartKafka(t)
	kafkaUp = true
	f.waitCount(t, 160, 2*time.Minute)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	rep := f.check(t, f.readAll(t))
	if rep.lost != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("after Kafka came back: lost %d, order violations %d, mismatches %d; want 0: %s",
			rep.lost, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	t.Logf("duplicates after the Kafka outage: %d", rep.duplicates)
	// A broker outage is not a poison message (DESIGN invariant 7).
	if rows := f.retryRows(t); len(rows) != 0 {
		t.Errorf("after a Kafka outage: %d rows in the retry table; want 0", len(rows))
	}
	run.stop(t)
}

// TestPostgresRestart stops Postgres with an immediate shutdown (a crash: the
// slot's position on disk may be older than what was confirmed) while the
// relay is streaming a backlog, and starts it again. The relay must reconnect
// by itself, lose nothing, and drop what the slot sends again.
func TestPostgresRestart(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	run := f.start(t, f.config(t))

	total := 0
	for range 40 {
		f.insertTx(t, f.makeEvents(500))
		total += 500
	}
	testenv.StopPostgres(t) // mid-stream: 20k events take the relay longer than this
	time.Sleep(2 * time.Second)
	testenv.StartPostgres(t)

	for range 10 {
		insertRetrying(t, f, f.makeEvents(100))
		total += 100
	}
	f.waitCount(t, total, 3*time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], 2*time.Minute)
	got := f.readAll(t)
	rep := f.check(t, got)
	if rep != (report{}) {
		t.Fatalf("after a Postgres crash and restart: lost %d, duplicates %d, order violations %d, mismatches %d; want 0: %s",
			rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	run.stop(t)
}

// insertRetrying inserts a transaction, retrying while Postgres still refuses
// connections after a restart (the pool's old connections are broken).
func insertRetrying(t *testing.T, f *fixture, evs []event) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := f.pool.Exec(ctx, `SELECT 1`)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres not back after 30s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.insertTx(t, evs)
}

// TestIdleAdvancesSlot checks that a quiet outbox in a busy database does not
// pin WAL: with every event delivered and another table written continuously,
// the slot's confirmed_flush_lsn keeps moving.
func TestIdleAdvancesSlot(t *testing.T) {
	f := newFixture(t)
	run := f.start(t, f.config(t))
	f.insertTx(t, f.makeEvents(5))
	f.waitCount(t, 5, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[0], time.Minute)

	ctx := context.Background()
	var target string
	for range 50 {
		if _, err := f.pool.Exec(ctx, `INSERT INTO orders (note) VALUES ('no outbox here')`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		t.Fatal(err)
	}
	// Keep the database busy while waiting: the walsender reports its position
	// when it has decoded something.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := f.pool.Exec(ctx, `INSERT INTO orders (note) VALUES ('still none')`); err != nil {
			t.Fatal(err)
		}
		slot := f.slotConfirmed(t)
		if slot >= mustLSN(t, target) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot confirmed_flush_lsn = %s after 30s of other-table writes; want >= %s (last outbox commit ended at %s)",
				slot, target, ends[0])
		}
		time.Sleep(100 * time.Millisecond)
	}
	run.stop(t)
}

// TestTransactionLargerThanWindow: a transaction with more events than
// max_in_flight_events must stream through (its events can only be
// checkpointed at its end, so the event limit must not hold its rest back).
func TestTransactionLargerThanWindow(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MaxInFlightEvents = 1000
	run := f.start(t, cfg)
	f.insertTx(t, f.makeEvents(5000))
	f.insertTx(t, f.makeEvents(10))
	f.waitCount(t, 5010, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	if rep := f.check(t, f.readAll(t)); rep != (report{}) {
		t.Fatalf("lost %d, duplicates %d, order violations %d, mismatches %d: %s",
			rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	run.stop(t)
}

// TestStartWhilePostgresDown: a relay started while Postgres is down waits for
// it instead of exiting, then streams.
func TestStartWhilePostgresDown(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	testenv.StopPostgres(t)
	pgUp := false
	defer func() {
		if !pgUp {
			testenv.StartPostgres(t)
		}
	}()
	run := f.start(t, f.config(t))
	run.runsFor(t, 3*time.Second, "relay started while Postgres was down returned %v; want it to wait")
	testenv.StartPostgres(t)
	pgUp = true
	insertRetrying(t, f, f.makeEvents(20))
	f.waitCount(t, 20, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	run.stop(t)
}

// TestStartWithoutSlotFails: what needs an operator fails at once, with the fix.
func TestStartWithoutSlotFails(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.Replication.Slot = "no_such_slot"
	err := f.start(t, cfg).exited(t, 30*time.Second, "Run without a slot still running after 30s; want it to fail at once")
	if !errors.Is(err, replication.ErrSlotMissing) && !errors.Is(err, pgslot.ErrNotFound) {
		t.Fatalf("Run without a slot = %v; want ErrSlotMissing (the command line's hint names setup)", err)
	}
}

// TestStartLSNSkipsForward: an operator's StartLSN at the end of a
// transaction skips it and everything before it; later events are delivered.
// A StartLSN behind the slot's position is refused.
func TestStartLSNSkipsForward(t *testing.T) {
	f := newFixture(t)
	skipped := f.makeEvents(10)
	f.insertTx(t, skipped[:5])
	f.insertTx(t, skipped[5:])
	ends := f.commitEnds(t)

	cfg := f.config(t)
	cfg.StartLSN = ends[1]
	run := f.start(t, cfg)
	f.insertTx(t, f.makeEvents(7))
	f.waitCount(t, 7, time.Minute)
	ends = f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	got := f.readAll(t)
	if len(got) != 7 {
		t.Fatalf("Kafka holds %d events; want only the 7 committed after --start-lsn %s", len(got), cfg.StartLSN)
	}
	for _, d := range got {
		for _, e := range skipped {
			if d.Headers["id"] == e.ID {
				t.Errorf("event %s committed before --start-lsn was delivered", e.ID)
			}
		}
	}
	run.stop(t)

	// The slot is now past ends[1]: starting behind it is refused.
	cfg.StartLSN = ends[0]
	back := f.start(t, cfg)
	select {
	case err := <-back.done:
		if err == nil || !strings.Contains(err.Error(), ends[0].String()) {
			t.Fatalf("Run with a StartLSN behind the slot = %v; want a refusal naming %s", err, ends[0])
		}
		back.done <- err
	case <-time.After(30 * time.Second):
		t.Fatalf("Run with a StartLSN behind the slot still running after 30s; want a refusal")
	}
}
