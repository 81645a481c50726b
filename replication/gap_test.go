package replication

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TestStreamIdleHook: with Config.Idle set, an idle stream never confirms a
// position itself: it offers it, and the slot moves only once the caller
// Confirms (the relay records the position in its checkpoint in between,
// so its checkpoint explains every position of the slot).
func TestStreamIdleHook(t *testing.T) {
	db := outboxDB(t)
	var mu sync.Mutex
	var offered pglogrepl.LSN
	r := startStream(t, db, Config{Idle: func(lsn pglogrepl.LSN) {
		mu.Lock()
		offered = max(offered, lsn)
		mu.Unlock()
	}}, 0)
	db.exec(insertSQL(1, 3))
	b := r.txns(1)[0]
	end := b[len(b)-1].EndLSN
	r.s.Confirm(end)
	// Before Postgres 15 the busy writes arrive as empty transactions, which
	// the test confirms as a relay would: what the stream may report is then
	// the last of them, never an idle position it was only offered.
	// Before 15 every write is sent as an empty transaction, and the
	// walsender pings (a keepalive) only when the WAL it read runs ahead of
	// what the client confirmed: there, move the WAL on with a
	// non-transactional logical message, which pgoutput does not send.
	confirmed := end
	eventually(t, "an idle position past the outbox commit is offered", 20*time.Second, func() (bool, string) {
		if r.skipEmpty {
			db.exec("SELECT pg_logical_emit_message(false, 'outbox-relay-test', 'tick')")
		} else {
			db.exec("INSERT INTO other (note) VALUES ('busy')")
		}
		confirmed = max(confirmed, r.drainEmpty(200*time.Millisecond))
		mu.Lock()
		defer mu.Unlock()
		return offered > end, offered.String()
	})
	time.Sleep(1500 * time.Millisecond) // a few status updates
	if c := slotConfirmed(t, db, "relay_slot"); c != confirmed {
		t.Fatalf("confirmed_flush_lsn = %s with an idle position offered, not confirmed; want %s (the stream must not confirm it itself)", c, confirmed)
	}
	mu.Lock()
	idle := offered
	mu.Unlock()
	r.s.Confirm(idle)
	eventually(t, "confirmed_flush_lsn reaches the confirmed idle position", 10*time.Second, func() (bool, string) {
		c := slotConfirmed(t, db, "relay_slot")
		return c >= idle, c.String()
	})
}

// TestStreamRefusesRecreatedSlot: the slot is dropped and created again
// while the stream is disconnected (an operator, or a failover to a server
// with a slot of the same name), with outbox rows committed in between. The
// stream must not reconnect to it and stream on: Run returns a
// *pgslot.GapError naming what it had confirmed and the new slot's position.
func TestStreamRefusesRecreatedSlot(t *testing.T) {
	db := outboxDB(t)
	// Idle positions offered and never confirmed, as by a relay that has
	// not recorded one yet: what the stream confirmed stays end.
	r := startStream(t, db, Config{ReconnectMin: 3 * time.Second, ReconnectMax: 3 * time.Second,
		Idle: func(pglogrepl.LSN) {}}, 0)
	db.exec(insertSQL(1, 3))
	b := r.txns(1)[0]
	end := b[len(b)-1].EndLSN
	r.s.Confirm(end)
	eventually(t, "confirmed_flush_lsn reaches the confirmed end", 10*time.Second, func() (bool, string) {
		c := slotConfirmed(t, db, "relay_slot")
		return c == end, c.String()
	})

	db.exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = 'relay_slot'")
	eventually(t, "the walsender is gone", 5*time.Second, func() (bool, string) {
		v := db.value("SELECT active::text FROM pg_replication_slots WHERE slot_name = 'relay_slot'")
		return v == "false", v
	})
	db.exec("SELECT pg_drop_replication_slot('relay_slot')")
	db.exec(insertSQL(3, 5)) // never decodable from the new slot
	db.exec("SELECT pg_create_logical_replication_slot('relay_slot', 'pgoutput')")
	recreated := slotConfirmed(t, db, "relay_slot")

	select {
	case err := <-r.done:
		close(r.done)
		var gap *pgslot.GapError
		if !errors.As(err, &gap) || !errors.Is(err, ErrGap) {
			t.Fatalf("Run = %v; want a *pgslot.GapError", err)
		}
		if gap.Cause != pgslot.CauseSlotAhead || gap.From != end || gap.To != recreated {
			t.Errorf("GapError = %s %s; want %s %s..%s", gap.Cause, gap.Range(), pgslot.CauseSlotAhead, end, recreated)
		}
	case b := <-r.out:
		t.Fatalf("the stream went on from the recreated slot (batch at %s); want Run to refuse", b.CommitLSN)
	case <-time.After(30 * time.Second):
		t.Fatalf("Run did not return within 30s of the slot being recreated")
	}
}
