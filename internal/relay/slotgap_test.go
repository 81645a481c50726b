package relay_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TestIdleSlotKilledRestarts is the legitimate case that must not look like
// a lost slot (DESIGN invariants 3 and 14): a relay advances its idle slot
// past its last event, is killed with SIGKILL while doing so, and starts
// again. The checkpoint must explain the slot at every moment (the slot
// never ahead of it), so the restart streams on without refusing.
func TestIdleSlotKilledRestarts(t *testing.T) {
	f := newFixture(t)
	p := f.startProcess(t)
	total := f.produce(t, 1, 5, 0)
	f.waitCount(t, total, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)

	// Other tables written: the slot advances past the last outbox commit.
	// Read the slot first and the checkpoint after: the checkpoint is
	// saved before a position is confirmed, so it is never behind.
	ctx := context.Background()
	advanced := 0
	for deadline := time.Now().Add(30 * time.Second); advanced < 3; {
		if _, err := f.pool.Exec(ctx, `INSERT INTO orders (note) VALUES ('not an event')`); err != nil {
			t.Fatal(err)
		}
		slot := f.slotConfirmed(t)
		cp := f.checkpointLSN(t)
		if slot > cp {
			t.Fatalf("slot confirmed_flush_lsn %s is ahead of the checkpoint %s: a crash now would look like a recreated slot", slot, cp)
		}
		if slot > ends[len(ends)-1] {
			advanced++
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle slot did not advance past %s within 30s (at %s)", ends[len(ends)-1], slot)
		}
		time.Sleep(300 * time.Millisecond)
	}
	p.cmd.Process.Kill()
	<-p.done

	p = f.startProcess(t)
	total += f.produce(t, 2, 5, 0)
	f.waitCount(t, total, time.Minute)
	select {
	case err := <-p.done:
		t.Fatalf("the restarted relay exited (%v); want it streaming", err)
	default:
	}
	if rep := f.check(t, f.readAll(t)); rep.lost != 0 || rep.orderViolations != 0 {
		t.Fatalf("lost %d, order violations %d; want 0: %s", rep.lost, rep.orderViolations, rep.firstProblem)
	}
}

// deliveredAndStopped runs a relay until one transaction of 5 events is in
// Kafka and its end confirmed on the slot, then stops it cleanly; it returns
// how many events were delivered and the checkpoint the relay left.
func (f *fixture) deliveredAndStopped(t *testing.T) (total int, cp pglogrepl.LSN) {
	t.Helper()
	run := f.start(t, f.config(t))
	total = f.produce(t, 1, 5, 0)
	f.waitCount(t, total, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	run.stop(t)
	return total, f.checkpointLSN(t)
}

// refusedGap waits a minute for run to refuse to stream with a
// *pgslot.GapError (exit code Gap) and returns the gap and Run's error.
func refusedGap(t *testing.T, run *running, notRefused string) (*pgslot.GapError, error) {
	t.Helper()
	err := run.exited(t, time.Minute, notRefused)
	var gap *pgslot.GapError
	if !errors.As(err, &gap) || exitcode.Of(err) != exitcode.Gap {
		t.Fatalf("Run = %v; want a *pgslot.GapError (exit %d)", err, exitcode.Gap)
	}
	return gap, err
}

// TestRecreatedSlotRefused: the slot dropped and recreated while the relay
// is stopped, with events committed in between. Run must refuse before
// delivering anything past the gap, with the range (the end-to-end form,
// with check, lag, status and the fix, is in cmd/outbox-relay).
func TestRecreatedSlotRefused(t *testing.T) {
	f := newFixture(t)
	total, cp := f.deliveredAndStopped(t)

	f.pg.DropSlot(t, f.slot)
	f.produce(t, 2, 5, 0) // never sent
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	slotAt := f.slotConfirmed(t)

	run := f.start(t, f.config(t))
	gap, _ := refusedGap(t, run, "run did not refuse the recreated slot within a minute")
	if gap.Cause != pgslot.CauseSlotAhead || gap.From != cp || gap.To != slotAt {
		t.Errorf("GapError = %s %s; want %s %s..%s", gap.Cause, gap.Range(), pgslot.CauseSlotAhead, cp, slotAt)
	}
	if got := f.readAll(t); len(got) != total {
		t.Errorf("%d events in Kafka after the refusal; want the %d delivered before", len(got), total)
	}
}

// TestInvalidatedSlotRefused is issue 21's scenario (c), reduced: the
// relay is stopped, events are committed, and the slot is invalidated by a
// small max_slot_wal_keep_size. Run must refuse with the checkpoint as the
// start of the uncovered range and say how to recreate the slot and
// re-deliver. max_slot_wal_keep_size is server-wide: the test holds
// testenv.Exclusive, and PG.InvalidateSlot refuses to invalidate a slot the
// test does not own and restores the setting.
func TestInvalidatedSlotRefused(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	total, cp := f.deliveredAndStopped(t)
	f.produce(t, 2, 5, 0) // committed while the relay is stopped: lost with the slot

	f.pg.InvalidateSlot(t, f.slot, f.probe)

	run := f.start(t, f.config(t))
	gap, err := refusedGap(t, run, "run did not refuse the invalidated slot within a minute")
	if gap.Cause != pgslot.CauseSlotLost || gap.From != cp {
		t.Errorf("GapError = %s %s; want %s from %s", gap.Cause, gap.Range(), pgslot.CauseSlotLost, cp)
	}
	for _, want := range []string{"wal_status lost", "max_slot_wal_keep_size", "refill the range"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run error lacks %q:\n%s", want, err)
		}
	}
	if got := f.readAll(t); len(got) != total {
		t.Errorf("%d events in Kafka after the refusal; want the %d delivered before", len(got), total)
	}
}
