package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	envelope "github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// Issue 21, part 2: a slot lost while the relay is stopped or running is
// healed from the outbox table (relay.Refill): lost 0, per-aggregate order
// kept, duplicates bounded by the history interval. The full forms (more
// events, a producer writing throughout) are in internal/faults.

// refillConfig is the fixture's config with refill on and a short history
// interval, so that a history row is covered by the checkpoint soon.
func (f *fixture) refillConfig(t *testing.T) relay.Config {
	cfg := f.config(t)
	cfg.OnSlotLoss = relay.OnSlotLossRefill
	cfg.HistoryInterval = 100 * time.Millisecond
	return cfg
}

// refillable starts a relay with cfg, delivers txs transactions of 5 events
// and waits until the checkpoint covers a history row: from then on a lost
// slot can be refilled. It returns the relay, still running.
func (f *fixture) refillable(t *testing.T, cfg relay.Config, txs int) *running {
	t.Helper()
	run := f.start(t, cfg)
	f.produce(t, txs, 5, 0)
	f.waitAll(t, time.Minute)
	f.pg.WaitHistoryCovered(t, f.slot)
	return run
}

// stoppedRefillable is refillable, the relay then stopped cleanly: a slot
// lost from here on is lost while the relay is stopped.
func (f *fixture) stoppedRefillable(t *testing.T, cfg relay.Config, txs int) {
	t.Helper()
	f.refillable(t, cfg, txs).stop(t)
}

// refused is e, committed at commit with value as its message value, as the
// relay stores an event Kafka refused in the retry table.
func (f *fixture) refused(e event, value string, commit pglogrepl.LSN) retry.Event {
	ev := envelope.Event{ID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Type: e.EventType,
		Topic: f.prefix + "." + e.AggregateType, Key: []byte(e.AggregateID), Value: []byte(value),
		Extra:     []envelope.Header{{Key: "trace_id", Value: []byte("tr-0")}, {Key: "tenant", Value: []byte("7")}},
		CommitLSN: commit, Pos: 1}
	return retry.NewEvent(&ev)
}

// storedRefused commits one new event and stores it in the retry table as
// the relay stores an event Kafka refused (with reason; dead at once if
// permanent), value(e) as its message value. It returns the event and its
// commit's end.
func (f *fixture) storedRefused(t *testing.T, reason string, permanent bool, value func(event) string) (event, pglogrepl.LSN) {
	t.Helper()
	e := f.makeEvents(1)[0]
	f.insertTx(t, []event{e})
	ends := f.commitEnds(t)
	rev := f.refused(e, value(e), ends[len(ends)-1])
	rev.Reason, rev.Permanent = reason, permanent
	if err := f.retryStore(t).Insert(context.Background(), []retry.Event{rev}); err != nil {
		t.Fatal(err)
	}
	return e, ends[len(ends)-1]
}

// walInsertLSN is the server's current WAL insert position: past every
// commit so far.
func (f *fixture) walInsertLSN(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var now string
	if err := f.pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	return mustLSN(t, now)
}

// delivered0 asserts lost 0 and per-aggregate order, and logs duplicates
// and refilled messages (the lead reports them).
func (f *fixture) assertHealed(t *testing.T, what string, took time.Duration) {
	t.Helper()
	got := f.readAll(t)
	rep := f.check(t, got)
	refilled := 0
	for _, d := range got {
		if d.Headers[relay.HeaderRefillID] != "" {
			refilled++
		}
	}
	t.Logf("%s: %d messages, lost %d, duplicates %d, refilled messages %d, order violations %d, time to recover %s",
		what, len(got), rep.lost, rep.duplicates, refilled, rep.orderViolations, took.Round(time.Millisecond))
	if rep.lost != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("%s: lost %d, order violations %d, mismatches %d; want 0: %s", what, rep.lost, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	if refilled == 0 {
		t.Errorf("%s: no message carries the header %s", what, relay.HeaderRefillID)
	}
}

// waitAll waits until every row of the outbox table is in Kafka.
func (f *fixture) waitAll(t *testing.T, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, "every outbox row in Kafka", func() (bool, string) {
		rep := f.check(t, f.readAll(t))
		return rep.lost == 0, rep.firstProblem
	})
}

// TestRefillRecreatedSlot is scenario (d), reduced: the slot dropped and
// created again by an operator while the relay is stopped, events committed
// in between; Recover refills and run streams on from the new slot.
func TestRefillRecreatedSlot(t *testing.T) {
	f := newFixture(t)
	cfg := f.refillConfig(t)
	cfg.OnSlotLoss = relay.OnSlotLossFail // recover by hand
	f.stoppedRefillable(t, cfg, 3)
	cp := f.checkpointLSN(t)

	f.pg.DropSlot(t, f.slot)
	f.produce(t, 3, 5, 0) // committed with no slot: only the table has them
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	f.produce(t, 1, 5, 0) // decoded by the recreated slot, and in the table

	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	res, err := r.Recover(context.Background(), false)
	if err != nil {
		t.Fatalf("Recover = %v; want a refill", err)
	}
	if res.From != cp || res.To <= cp || res.Events < 20 {
		t.Errorf("refill %+v; want from the checkpoint %s, to a later position, at least the 20 events since", res, cp)
	}
	if got := f.checkpointLSN(t); got != res.To {
		t.Errorf("checkpoint after the refill = %s; want the new slot's consistent point %s", got, res.To)
	}
	if slot := f.slotConfirmed(t); slot != res.To {
		t.Errorf("slot after the refill at %s; want the consistent point %s", slot, res.To)
	}
	f.waitAll(t, time.Minute) // before run: recover sent what the slot will not
	took := time.Since(began)

	// Nothing left to refill; run streams on from the new slot.
	r2, _ := newRelay(t, cfg)
	if _, err := r2.Recover(context.Background(), true); !errors.Is(err, relay.ErrNoGap) {
		t.Errorf("Recover after the refill = %v; want ErrNoGap", err)
	}
	f.start(t, cfg)
	f.produce(t, 2, 5, 0)
	f.waitAll(t, time.Minute)
	f.assertHealed(t, "slot recreated while stopped, recover", took)
}

// TestRefillInvalidatedSlot is scenario (c), reduced: the slot invalidated
// by a small max_slot_wal_keep_size while the relay is stopped; run with
// on_slot_loss: refill heals it at start and streams on.
func TestRefillInvalidatedSlot(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	cfg := f.refillConfig(t)
	f.stoppedRefillable(t, cfg, 3)
	f.produce(t, 4, 5, 0) // lost with the slot
	f.pg.InvalidateSlot(t, f.slot, f.probe)

	began := time.Now()
	f.start(t, cfg)
	f.waitAll(t, time.Minute)
	took := time.Since(began)
	f.produce(t, 2, 5, 0) // from the new slot
	f.waitAll(t, time.Minute)
	f.assertHealed(t, "slot invalidated while stopped, run with refill", took)
}

// TestRefillSlotDroppedWhileRunning: the slot dropped under a running relay
// (its walsender terminated), events committed meanwhile; with refill on the
// relay refills in-process and streams on.
func TestRefillSlotDroppedWhileRunning(t *testing.T) {
	f := newFixture(t)
	cfg := f.refillConfig(t)
	run := f.refillable(t, cfg, 3)

	began := time.Now()
	f.pg.DropActiveSlot(t, f.slot)
	f.produce(t, 4, 5, 0)
	f.waitAll(t, time.Minute)
	took := time.Since(began)
	select {
	case err := <-run.done:
		t.Fatalf("the relay stopped (%v); want it refilled and streaming", err)
	default:
	}
	f.produce(t, 2, 5, 0)
	f.waitAll(t, time.Minute)
	f.assertHealed(t, "slot dropped while running, refill in-process", took)
}

// TestRefillBehindRetryRow: an aggregate has a row waiting in the retry
// table when the slot is lost; its refilled events must queue behind that
// row (the gate), never overtake it (DESIGN invariant 6).
func TestRefillBehindRetryRow(t *testing.T) {
	f := newFixture(t)
	cfg := f.refillConfig(t)
	f.stoppedRefillable(t, cfg, 3)

	// What the relay does with an event Kafka refused: store it in the
	// retry table and confirm past it. Done by hand here, so that it is
	// still pending when the refill runs (the worker starts after it).
	ctx := context.Background()
	_, commit := f.storedRefused(t, "test: refused by Kafka", false, func(e event) string { return e.Payload })
	// The checkpoint past it, and a history row past it: the refill does
	// not send it again, so only the gate keeps its aggregate in order.
	store := checkpoint.New(f.pool, "outbox_relay_checkpoint")
	if err := store.Record(ctx, f.slot, commit, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := store.Save(ctx, f.slot, f.walInsertLSN(t), time.Now()); err != nil {
		t.Fatal(err)
	}

	f.pg.DropSlot(t, f.slot)
	f.produce(t, 3, 5, 0) // the held event's aggregate has later events here

	began := time.Now()
	f.start(t, cfg)
	f.waitAll(t, time.Minute)
	took := time.Since(began)
	f.assertHealed(t, "refill behind a pending retry row", took)
	var parked int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_retry WHERE event_key LIKE 'refill:%'`).Scan(&parked); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	t.Logf("refilled rows still in the retry table: %d (delivered ones are removed)", parked)
}

// TestRefillLeavesDeadLetter: an event the stream stored as a dead letter
// before the slot was lost is inside the refill's range (the newest history
// row is older than it). The refill must leave it to the operator as the one
// row it is: not store a second copy behind it (pending for ever behind the
// dead one, and sent after it once requeued: a duplicate) nor send it.
func TestRefillLeavesDeadLetter(t *testing.T) {
	f := newFixture(t)
	cfg := f.refillConfig(t)
	f.stoppedRefillable(t, cfg, 3)

	// What the relay does with an event Kafka refuses for good: store it
	// dead and confirm past it. By hand, with the value as the router
	// reads it, and the checkpoint (not the history) past it.
	ctx := context.Background()
	dead, _ := f.storedRefused(t, "test: refused by Kafka for good", true, func(e event) string {
		var value string
		if err := f.pool.QueryRow(ctx, `SELECT payload::text FROM outbox WHERE id = $1`, e.ID).Scan(&value); err != nil {
			t.Fatal(err)
		}
		return value
	})
	if err := checkpoint.New(f.pool, "outbox_relay_checkpoint").Save(ctx, f.slot, f.walInsertLSN(t), time.Now()); err != nil {
		t.Fatal(err)
	}

	f.pg.DropSlot(t, f.slot)
	f.produce(t, 3, 5, 0) // the dead letter's aggregate has later events here
	f.start(t, cfg)
	waitFor(t, time.Minute, "the refill recorded in the checkpoint row", func() (bool, string) {
		var done bool
		err := f.pool.QueryRow(ctx, `SELECT last_refill IS NOT NULL FROM outbox_relay_checkpoint WHERE slot_name = $1`, f.slot).Scan(&done)
		if err != nil {
			return false, err.Error()
		}
		return done, "not yet"
	})
	rows, err := f.pool.Query(ctx, `SELECT event_key || ' ' || status FROM outbox_relay_retry WHERE event_id = $1 ORDER BY seq`, dead.ID)
	if err != nil {
		t.Fatal(err)
	}
	held, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 || !strings.HasPrefix(held[0], "lsn:") {
		t.Fatalf("retry rows of the dead letter after the refill: %q; want only the stream's dead row", held)
	}

	// The operator requeues it: it goes out once, its aggregate after it.
	if _, err := f.retryStore(t).RequeueAllDead(ctx); err != nil {
		t.Fatal(err)
	}
	f.waitAll(t, time.Minute)
	f.assertHealed(t, "refill past a dead letter", 0)
	n := 0
	for _, d := range f.readAll(t) {
		if d.Headers["id"] == dead.ID {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the dead letter was delivered %d times after its requeue; want once", n)
	}
}

// TestRefillRefused: a refill that would be wrong is refused with exit code
// 4 and the reason, changing nothing: without a history row at or before the
// checkpoint (the rows cannot be told apart), and on another system (the
// history's positions mean nothing there: replay by time).
func TestRefillRefused(t *testing.T) {
	f := newFixture(t)
	cfg := f.refillConfig(t)
	f.stoppedRefillable(t, cfg, 2)
	cp := f.checkpointLSN(t)
	f.pg.DropSlot(t, f.slot)
	f.produce(t, 1, 5, 0)

	f.pg.Exec(t, `UPDATE outbox_relay_checkpoint SET system_identifier = '1' WHERE slot_name = $1`, f.slot)
	r, _ := newRelay(t, cfg)
	_, err := r.Recover(context.Background(), false)
	var gap *pgslot.GapError
	if !errors.As(err, &gap) || gap.Cause != pgslot.CauseOtherSystem || exitcode.Of(err) != exitcode.Gap {
		t.Fatalf("Recover on another system = %v; want the other_system gap, exit %d", err, exitcode.Gap)
	}
	if !strings.Contains(err.Error(), "replay by time") {
		t.Errorf("Recover on another system: %v; want it to say to replay by time", err)
	}

	f.pg.Exec(t, `UPDATE outbox_relay_checkpoint SET system_identifier = (SELECT system_identifier::text FROM pg_control_system()) WHERE slot_name = $1`, f.slot)
	f.pg.Exec(t, `DELETE FROM outbox_relay_checkpoint_history WHERE slot_name = $1`, f.slot)
	r, _ = newRelay(t, cfg)
	_, err = r.Recover(context.Background(), false)
	var re *relay.RefillError
	if !errors.As(err, &re) || exitcode.Of(err) != exitcode.Gap || !strings.Contains(err.Error(), "no row at or before the checkpoint") {
		t.Fatalf("Recover without history = %v; want a *relay.RefillError saying so, exit %d", err, exitcode.Gap)
	}
	if got := f.checkpointLSN(t); got != cp {
		t.Errorf("checkpoint after the refused refills = %s; want %s unchanged", got, cp)
	}
	var slots int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, f.slot).Scan(&slots); err != nil || slots != 0 {
		t.Errorf("refused refills created the slot (%d, %v); want it left missing", slots, err)
	}
	// run with refill on stops the same way (exit 4), not in a loop.
	err = f.start(t, cfg).exited(t, time.Minute, "run with refill on did not stop within a minute on a gap it cannot refill")
	if !errors.As(err, &re) || exitcode.Of(err) != exitcode.Gap {
		t.Fatalf("run = %v; want the *relay.RefillError, exit %d", err, exitcode.Gap)
	}
}

// TestRefillKilledResumes is issue 34's case 6 (first point): a refill
// killed midway records how far it got, and the refill after it skips what
// it handled: lost 0, and only what the first sent after its last record is
// sent twice (not everything it had sent).
func TestRefillKilledResumes(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	cfg := f.refillConfig(t)
	cfg.OnSlotLoss = relay.OnSlotLossFail // recover by hand
	f.stoppedRefillable(t, cfg, 2)

	f.pg.DropSlot(t, f.slot)
	const total = 20000
	f.pg.Exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'Order', 'k-' || (i % 50), 'OrderChanged', jsonb_build_object('i', i) FROM generate_series(1, $1::int) i`, total)

	// The first refill, cancelled once it has recorded progress.
	r1, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	kctx, kill := context.WithCancel(ctx)
	go func() {
		defer kill()
		for kctx.Err() == nil {
			var recorded bool
			if err := f.pool.QueryRow(ctx, `SELECT refill_progress IS NOT NULL FROM outbox_relay_checkpoint WHERE slot_name = $1`, f.slot).Scan(&recorded); err == nil && recorded {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	if res, err := r1.Recover(kctx, false); err == nil {
		t.Fatalf("the first refill finished (%+v) before it was killed: make it longer", res)
	}
	r2, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r2.Recover(ctx, false)
	if err != nil {
		t.Fatalf("Recover after the killed refill = %v; want a refill", err)
	}

	var ids []string
	rows, err := f.pool.Query(ctx, `SELECT id::text FROM outbox WHERE aggregate_type = 'Order' AND aggregate_id LIKE 'k-%'`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids = append(ids, id)
	}
	rows.Close()
	first, second := map[string]bool{}, map[string]bool{}
	for _, d := range f.readAll(t) {
		switch id := d.Headers[relay.HeaderRefillID]; {
		case id == res.ID:
			second[d.Headers["id"]] = true
		case id != "":
			first[d.Headers["id"]] = true
		}
	}
	lost, twice := 0, 0
	for _, id := range ids {
		if !first[id] && !second[id] {
			lost++
		}
		if first[id] && second[id] {
			twice++
		}
	}
	t.Logf("killed refill sent %d of %d; the next one skipped %d it handled and sent %d; sent by both %d", len(first), total, res.Resumed, len(second), twice)
	if len(ids) != total || lost != 0 {
		t.Fatalf("%d of %d rows lost over the two refills", lost, len(ids))
	}
	if res.Resumed == 0 || int64(twice) > int64(len(first))-res.Resumed+1 {
		t.Errorf("the refill after a killed one skipped %d and sent %d of the %d the first sent again; want only those sent after its last record (at most %d)",
			res.Resumed, twice, len(first), int64(len(first))-res.Resumed)
	}
}

// TestRecoverLogsProgress: a refill (recover, or run with refill) logs how
// many events it sent as it goes, as replay does (issue 37 item 10: recover
// said nothing until it was done). The interval is shortened to every chunk.
func TestRecoverLogsProgress(t *testing.T) {
	defer relay.SetRefillProgressEvery(0)()
	f := newFixture(t)
	cfg := f.refillConfig(t)
	cfg.OnSlotLoss = relay.OnSlotLossFail // recover by hand
	f.stoppedRefillable(t, cfg, 3)
	f.pg.DropSlot(t, f.slot)
	f.produce(t, 3, 5, 0) // committed with no slot: only the table has them

	logs := &logBuffer{t: t}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Recover(context.Background(), false)
	if err != nil {
		t.Fatalf("Recover = %v; want a refill", err)
	}
	if n := logs.lines("refill progress", "refill_id="+res.ID, "sent="); n == 0 {
		t.Errorf("the refill of %d events logged no progress line", res.Events)
	}
}
