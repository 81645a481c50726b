package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The ways a test loses a relay's logical slot (issue 21's scenarios), shared by
// the reduced tests (internal/relay), the command's (cmd/outbox-relay) and the
// full ones (internal/faults), so that each loses it the same way.

// InvalidateSlot invalidates slot (wal_status lost) the way a server does to a
// slot left behind for too long: a small max_slot_wal_keep_size, then WAL
// switches and checkpoints until the slot is lost, within 60 s. The setting is
// server-wide, so the caller must hold Exclusive, and InvalidateSlot fails the
// test rather than lose a slot it was not given (slot and keep are the test's
// own; slots already lost do not count). The setting is restored as soon as
// the slot is lost, so that a slot created next is not lost too, and again at
// cleanup if the test fails before that.
func (p *PG) InvalidateSlot(t testing.TB, slot string, keep ...string) {
	t.Helper()
	ctx := context.Background()
	su := SuperuserConn(t, p.DSN)
	refuseOtherSlots(t, su, append([]string{slot}, keep...))
	restore := func() {
		if _, err := su.Exec(ctx, "ALTER SYSTEM RESET max_slot_wal_keep_size"); err != nil {
			t.Errorf("testenv: restore max_slot_wal_keep_size: %v", err)
		}
		su.Exec(ctx, "SELECT pg_reload_conf()")
	}
	t.Cleanup(restore)
	for _, s := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"} {
		if _, err := su.Exec(ctx, s); err != nil {
			t.Fatalf("testenv: %s: %v", s, err)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		for _, s := range []string{"SELECT pg_switch_wal()", "SELECT pg_logical_emit_message(false, 'testenv', repeat('x', 100000))", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := su.Exec(ctx, s); err != nil {
				t.Fatalf("testenv: %s: %v", s, err)
			}
		}
		var status string
		if err := su.QueryRow(ctx, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&status); err != nil {
			t.Fatalf("testenv: wal_status of slot %s: %v", slot, err)
		}
		if status == "lost" {
			restore()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: slot %s not lost after 60s of WAL switches and checkpoints (wal_status %s)", slot, status)
		}
	}
}

// refuseOtherSlots fails the test when the server holds a usable slot outside
// own: max_slot_wal_keep_size would invalidate it too.
func refuseOtherSlots(t testing.TB, su *pgx.Conn, own []string) {
	t.Helper()
	rows, err := su.Query(context.Background(), `SELECT slot_name FROM pg_replication_slots WHERE slot_name <> ALL($1) AND wal_status <> 'lost'`, own)
	if err != nil {
		t.Fatalf("testenv: list slots: %v", err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("testenv: list slots: %v", err)
	}
	if len(others) > 0 {
		t.Fatalf("other slots on the server would be invalidated too: %v; drop them or run this test on its own server", others)
	}
}

// DropActiveSlot drops slot under the relay that streams from it, as an
// operator would: the relay's walsender is terminated and the slot dropped,
// again and again within a minute, because the stream reconnects at once and
// the drop must land between two of its connections.
func (p *PG) DropActiveSlot(t testing.TB, slot string) {
	t.Helper()
	ctx := context.Background()
	su := SuperuserConn(t, p.DSN)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		su.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := su.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: could not drop slot %s under the running relay within a minute: %v", slot, err)
		}
	}
}

// WaitHistoryCovered waits up to a minute until the relay's checkpoint of slot
// covers a row of its checkpoint history (the default table names): a refill
// maps the checkpoint with such a row, so a slot lost before it exists cannot
// be refilled.
func (p *PG) WaitHistoryCovered(t testing.TB, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: WaitHistoryCovered: connect: %v", err)
	}
	defer conn.Close(context.Background())
	var last error
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		var ok bool
		last = conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_relay_checkpoint_history h
JOIN outbox_relay_checkpoint c USING (slot_name) WHERE c.slot_name = $1 AND h.snapshot_lsn <= c.lsn)`, slot).Scan(&ok)
		if last == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: no checkpoint history row of slot %s covered by the checkpoint within a minute (last error: %v)", slot, last)
		}
	}
}
