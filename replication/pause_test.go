package replication

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStreamPauseFreesWalsender is issue 35's failure in small: a consumer
// that takes no batch (the pipeline waiting for a frozen Kafka) while the
// server has megabytes more to send. A client that stops reading leaves its
// walsender blocked in a socket write (wait events WalSenderWriteData, and
// ClientWrite once told to exit), where
// pg_terminate_backend cannot end it: the checkpointer, which terminates it
// the same way to invalidate its slot, then waits, and so does every
// checkpoint. With MaxUnread the stream pauses and keeps reading: the
// walsender ends within seconds, and once the consumer takes batches again
// every row arrives once, in order.
func TestStreamPauseFreesWalsender(t *testing.T) {
	db := outboxDB(t)
	r := startStream(t, db, Config{MaxUnread: time.Second, StatusInterval: 300 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}, 0)
	// 16 MB: more than the socket buffers of both ends and the stream's read
	// buffer hold, so that a client that does not read blocks the walsender.
	const rows = 8000
	pad := strings.Repeat("x", 2000)
	for from := 1; from <= rows; from += 1000 {
		db.exec(fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		  SELECT i, 'Order', 'o-' || i, 'Created', jsonb_build_object('i', i, 'pad', '%s') FROM generate_series(%d, %d) AS i`, pad, from, from+999))
	}
	eventually(t, "the stream paused", 20*time.Second, func() (bool, string) {
		st := r.s.Stats()
		return !st.PausedSince.IsZero() && st.Pauses >= 1, fmt.Sprintf("%+v", st)
	})
	// The server has sent everything, or blocks trying to.
	time.Sleep(2 * time.Second)
	pid := db.value("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'")
	if pid == "NULL" {
		t.Fatalf("no walsender holds the slot while the stream pauses; want the connection kept")
	}
	// Blocked, it waits in WalSenderWriteData (then, told to exit, in
	// ClientWrite): main at 1f1dc98 left it there until the consumer moved.
	if w := db.value("SELECT coalesce(wait_event, '') FROM pg_stat_activity WHERE pid = " + pid); w == "WalSenderWriteData" || w == "ClientWrite" {
		t.Errorf("walsender %s waits on %s %s after the pause began; want it done writing", pid, w, 2*time.Second)
	}
	db.value("SELECT pg_terminate_backend(" + pid + ")")
	began := time.Now()
	eventually(t, "the terminated walsender gone", 5*time.Second, func() (bool, string) {
		n := db.value("SELECT count(*) FROM pg_stat_activity WHERE pid = " + pid)
		return n == "0", "backends with pid " + pid + ": " + n
	})
	t.Logf("walsender %s ended %s after pg_terminate_backend", pid, time.Since(began).Round(time.Millisecond))

	// The consumer moves again: every row once, in order, across the pause,
	// the terminated connection and the reconnect.
	var got []Batch
	for _, txn := range r.txns(rows / 1000) {
		got = append(got, txn...)
		r.s.Confirm(txn[len(txn)-1].EndLSN)
	}
	if g, w := ids(got), seq(1, rows+1); strings.Join(g, ",") != strings.Join(w, ",") {
		dups, gaps := diff(g, w)
		t.Fatalf("got %d ids; want 1..%d once each in order (duplicates %v, missing %v)", len(g), rows, dups, gaps)
	}
	st := r.s.Stats()
	if st.Pauses < 1 || st.Reconnects < 1 || !st.PausedSince.IsZero() {
		t.Errorf("Stats Pauses = %d, Reconnects = %d, PausedSince = %v; want >= 1, >= 1, zero once delivered", st.Pauses, st.Reconnects, st.PausedSince)
	}
}

// TestStreamPauseResumes: a pause during which the server sent nothing
// ends when the consumer takes the batch, on the same connection; and a
// pause that dropped data reconnects and reads it again.
func TestStreamPauseResumes(t *testing.T) {
	db := outboxDB(t)
	r := startStream(t, db, Config{MaxUnread: 500 * time.Millisecond, StatusInterval: 300 * time.Millisecond,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond}, 0)
	r.drainEmpty(time.Second)

	db.exec(insertSQL(1, 3))
	eventually(t, "the stream paused on the first transaction", 10*time.Second, func() (bool, string) {
		st := r.s.Stats()
		return !st.PausedSince.IsZero(), fmt.Sprintf("%+v", st)
	})
	time.Sleep(time.Second) // paused: keepalives only
	pid := db.value("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'")
	first := r.txns(1)[0]
	r.s.Confirm(first[len(first)-1].EndLSN)
	if g := ids(first); fmt.Sprint(g) != "[1 2]" {
		t.Fatalf("ids = %v; want [1 2]", g)
	}
	db.exec(insertSQL(3, 4))
	second := r.txns(1)[0]
	r.s.Confirm(second[len(second)-1].EndLSN)
	if g := ids(second); fmt.Sprint(g) != "[3]" {
		t.Errorf("ids after the pause = %v; want [3]", g)
	}
	st := r.s.Stats()
	if st.Pauses != 1 || !st.PausedSince.IsZero() {
		t.Errorf("Stats Pauses = %d, PausedSince = %v; want 1, zero", st.Pauses, st.PausedSince)
	}
	// Before Postgres 15 an unrelated empty transaction may come during the
	// pause, and dropping it reconnects.
	if !r.skipEmpty {
		if st.Reconnects != 0 {
			t.Errorf("Stats Reconnects = %d after a pause that dropped nothing; want 0", st.Reconnects)
		}
		if now := db.value("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'"); now != pid {
			t.Errorf("walsender after the pause = %s; want the same one, %s", now, pid)
		}
	}

	// Two transactions: the second arrives while the stream pauses on the
	// first, is dropped, and is read again after a reconnect.
	db.exec(insertSQL(4, 5))
	eventually(t, "the stream paused again", 10*time.Second, func() (bool, string) {
		st := r.s.Stats()
		return !st.PausedSince.IsZero() && st.Pauses == 2, fmt.Sprintf("%+v", st)
	})
	db.exec(insertSQL(5, 6))
	time.Sleep(time.Second)
	pid = db.value("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'")
	var got []Batch
	for _, txn := range r.txns(2) {
		got = append(got, txn...)
		r.s.Confirm(txn[len(txn)-1].EndLSN)
	}
	if g := ids(got); fmt.Sprint(g) != "[4 5]" {
		t.Errorf("ids across a pause that dropped one = %v; want [4 5]", g)
	}
	if now := db.value("SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'relay_slot'"); now == pid {
		t.Errorf("walsender after a pause that dropped a transaction = %s; want a new one (the dropped part is read again)", now)
	}
	if st := r.s.Stats(); st.Reconnects != 0 || st.Pauses != 2 {
		t.Errorf("Stats Reconnects = %d, Pauses = %d; want 0 (a pause's reconnect is no lost connection), 2", st.Reconnects, st.Pauses)
	}
}
