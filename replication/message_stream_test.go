package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStreamMessages reads logical decoding messages from a real server:
// transactional ones of the prefix in their place among the inserts, none of
// a rolled-back transaction or subtransaction, none of another prefix; and a
// non-transactional one (written although its transaction rolled back) is
// skipped with ignore, and stops Run by default.
func TestStreamMessages(t *testing.T) {
	db := outboxDB(t)
	if v := db.value("SHOW server_version_num"); v < "140000" {
		t.Skipf("Postgres %s: pgoutput sends messages from 14 on", v)
	}
	r := startStream(t, db, Config{MessagePrefixes: []string{"outbox"}, NonTransactional: NonTransactionalIgnore}, 0)
	db.exec(`BEGIN;
		INSERT INTO outbox VALUES (1, 'Order', 'o-1', 'Created', '{}');
		SELECT pg_logical_emit_message(true, 'outbox', '{"id":"m1"}');
		SELECT pg_logical_emit_message(true, 'audit', 'not an event');
		SELECT pg_logical_emit_message(true, 'outbox', '\xff00'::bytea);
		INSERT INTO outbox VALUES (2, 'Order', 'o-2', 'Created', '{}');
		COMMIT`)
	db.exec(`BEGIN; SELECT pg_logical_emit_message(true, 'outbox', 'rolled back'); ROLLBACK`)
	db.exec(`BEGIN; SELECT pg_logical_emit_message(false, 'outbox', 'not transactional'); ROLLBACK`)
	db.exec(`BEGIN;
		SELECT pg_logical_emit_message(true, 'outbox', 'kept');
		SAVEPOINT s; SELECT pg_logical_emit_message(true, 'outbox', 'in a rolled-back savepoint'); ROLLBACK TO s;
		COMMIT`)
	txns := r.txns(2)
	var got []string
	for _, txn := range txns {
		for _, b := range txn {
			for _, row := range b.Rows {
				if row.Message != nil {
					got = append(got, fmt.Sprintf("msg %q", row.Message.Content))
				} else {
					got = append(got, "row "+string(row.Values[0]))
				}
			}
		}
	}
	want := []string{"row 1", `msg "{\"id\":\"m1\"}"`, "msg \"\\xff\\x00\"", "row 2", `msg "kept"`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("rows = %q; want %q", got, want)
	}
	eventually(t, "the non-transactional message counted as skipped", 10*time.Second, func() (bool, string) {
		st := r.s.Stats()
		return st.SkippedNonTransactional == 1 && st.SkippedMessages == 1, fmt.Sprintf("%+v", st)
	})
}

func TestStreamStopsAtNonTransactionalMessage(t *testing.T) {
	db := outboxDB(t)
	if v := db.value("SHOW server_version_num"); v < "140000" {
		t.Skipf("Postgres %s: pgoutput sends messages from 14 on", v)
	}
	db.exec(`INSERT INTO outbox VALUES (1, 'Order', 'o-1', 'Created', '{}')`)
	db.exec(`BEGIN; SELECT pg_logical_emit_message(false, 'outbox', 'x'); ROLLBACK`)
	cfg := Config{DSN: db.dsn, Slot: "relay_slot", Publication: "relay_pub", MessagePrefixes: []string{"outbox"}, Logger: testLogger(t)}
	s := New(cfg)
	out := make(chan Batch, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		for b := range out {
			if b.Last {
				s.Confirm(b.EndLSN)
			}
		}
	}()
	err := s.Run(ctx, 0, out)
	close(out)
	var nt *NonTransactionalError
	if !errors.As(err, &nt) || nt.Prefix != "outbox" {
		t.Fatalf("Run = %v; want a *NonTransactionalError", err)
	}
	if st := s.Stats(); st.ConfirmedLSN >= nt.LSN {
		t.Errorf("confirmed %s; want before the message at %s", st.ConfirmedLSN, nt.LSN)
	}
}

// TestStreamMessagesUnsupported: before Postgres 14 pgoutput has no
// messages option; the stream refuses to start, naming the version, rather
// than fail on START_REPLICATION's "unrecognized pgoutput option".
func TestStreamMessagesUnsupported(t *testing.T) {
	db := outboxDB(t)
	if v := db.value("SHOW server_version_num"); v >= "140000" {
		t.Skipf("Postgres %s sends messages (the make test-pg-matrix run on 13 checks the refusal)", v)
	}
	s := New(Config{DSN: db.dsn, Slot: "relay_slot", Publication: "relay_pub", MessagePrefixes: []string{"outbox"}, Logger: testLogger(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := s.Run(ctx, 0, make(chan Batch))
	if !errors.Is(err, ErrMessagesUnsupported) || !strings.Contains(err.Error(), "Postgres 13") {
		t.Fatalf("Run = %v; want ErrMessagesUnsupported naming Postgres 13", err)
	}
}
