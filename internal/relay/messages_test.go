package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/replication"
)

// emitArchived is how an application writes an event with a message outbox
// and the archive docs/outbox-table.md recommends: one statement archives
// the row and emits its JSON as a transactional message.
const emitArchived = `WITH e AS (
	INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
	VALUES ($1, $2, $3, $4, $5::jsonb, nullif($6, '')::jsonb) RETURNING *)
SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', id, 'aggregate_type', aggregate_type,
	'aggregate_id', aggregate_id, 'event_type', event_type, 'payload', payload, 'headers', headers)::text) FROM e`

// messagesFixture is a fixture whose outbox table is an archive: the
// publication covers no table, and the relay reads messages only.
func messagesFixture(t *testing.T) (*fixture, relay.Config) {
	f := newFixture(t)
	var v int
	if err := f.pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v < replication.MessagesMinVersion {
		t.Skipf("Postgres %d: pgoutput sends logical decoding messages from 14 on", v)
	}
	f.pg.Exec(t, `ALTER PUBLICATION outbox_relay DROP TABLE outbox`)
	cfg := f.config(t)
	cfg.Source = relay.SourceMessages
	return f, cfg
}

func (f *fixture) emitTx(t testing.TB, evs []event, extra ...string) {
	t.Helper()
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO orders (note) VALUES ('business row')`)
	for _, e := range evs {
		b.Queue(emitArchived, e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers)
	}
	for _, sql := range extra {
		b.Queue(sql)
	}
	f.commitBatch(t, b)
}

// TestMessagesEndToEnd delivers events written as logical decoding
// messages, in transactions of 1, 100 and 1000 with business rows, exactly
// once, in order, with exact keys, values and headers; nothing of a
// rolled-back transaction; hostile contents to the retry table, dead, with
// their reason, without holding up anything else; and the slot confirmed
// past the last transaction.
func TestMessagesEndToEnd(t *testing.T) {
	f, cfg := messagesFixture(t)
	run := f.start(t, cfg)

	hostile := []struct{ content, reason string }{
		{`not json`, "not valid JSON"},
		{`["array"]`, "not an object"},
		{`{"id": {"nested": 1}, "aggregate_type": "Order", "aggregate_id": "hostile-1", "event_type": "X"}`, `"id"`},
		{`{"id": "dup", "id": "dup2", "aggregate_type": "Order", "aggregate_id": "hostile-2"}`, "twice"},
		{`{"aggregate_type": "Order", "aggregate_id": "hostile-3", "event_type": "X", "payload": {}}`, "event id"},
	}
	total := 0
	for i := range 50 {
		extra := []string{}
		if i%10 == 3 {
			h := hostile[(i/10)%len(hostile)]
			extra = append(extra, fmt.Sprintf(`SELECT pg_logical_emit_message(true, 'outbox', %s)`, quote(h.content)))
		}
		f.emitTx(t, f.makeEvents(1), extra...)
		total++
	}
	for range 5 {
		f.emitTx(t, f.makeEvents(100))
		total += 100
	}
	f.emitTx(t, f.makeEvents(1000))
	total += 1000
	// Rolled back: neither its messages nor a non-transactional one of
	// another prefix go anywhere.
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, emitArchived, newUUID(), "Order", "rolled-back", "X", `{}`, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_logical_emit_message(false, 'audit', 'not ours')`); err != nil {
		t.Fatal(err)
	}
	tx.Rollback(ctx)

	f.waitCount(t, total, 2*time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	got := f.readAll(t)
	if rep := f.check(t, got); len(got) != total || rep != (report{}) {
		t.Fatalf("Kafka holds %d events; want %d exactly once: lost %d, duplicates %d, order violations %d, mismatches %d; first: %s",
			len(got), total, rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	rows, err := f.pool.Query(ctx, `SELECT status, last_error, value FROM outbox_relay_retry ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	var dead []string
	for rows.Next() {
		var status, reason string
		var value []byte
		if err := rows.Scan(&status, &reason, &value); err != nil {
			t.Fatal(err)
		}
		if status != "dead" {
			t.Errorf("retry row %q is %s; want dead at once", reason, status)
		}
		dead = append(dead, reason)
	}
	if len(dead) != 5 {
		t.Fatalf("retry table holds %d rows; want the 5 hostile messages: %q", len(dead), dead)
	}
	for i, h := range hostile {
		if !strings.Contains(dead[i], h.reason) {
			t.Errorf("retry row %d: reason %q; want it to say %q", i, dead[i], h.reason)
		}
	}
	run.stop(t)
}

func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// TestMessagesNonTransactional: a non-transactional message of the prefix
// stops the relay before it, confirming nothing past it and recording why;
// restarted with non_transactional ignore, the relay skips it and delivers
// what came after.
func TestMessagesNonTransactional(t *testing.T) {
	f, cfg := messagesFixture(t)
	run := f.start(t, cfg)
	f.emitTx(t, f.makeEvents(3))
	f.waitCount(t, 3, time.Minute)
	f.pg.Exec(t, `BEGIN; SELECT pg_logical_emit_message(false, 'outbox', '{"id":"never"}'); ROLLBACK`)
	f.emitTx(t, f.makeEvents(2))
	err := run.exited(t, time.Minute, "relay still running a minute after a non-transactional message")
	var nt *replication.NonTransactionalError
	if !errors.As(err, &nt) {
		t.Fatalf("Run = %v; want a *replication.NonTransactionalError", err)
	}
	if slot, cp := f.slotConfirmed(t), f.checkpointLSN(t); slot >= nt.LSN || cp >= nt.LSN {
		t.Errorf("slot %s, checkpoint %s; want both before the message at %s", slot, cp, nt.LSN)
	}
	var before, reason string
	if err := f.pool.QueryRow(context.Background(), `SELECT stopped_before::text, stop_reason FROM outbox_relay_checkpoint WHERE slot_name = $1`, f.slot).Scan(&before, &reason); err != nil {
		t.Fatal(err)
	}
	if before != nt.LSN.String() || !strings.Contains(reason, "non-transactional") {
		t.Errorf("stop record %s %q; want %s and the reason", before, reason, nt.LSN)
	}
	if n := len(f.readAll(t)); n != 3 {
		t.Errorf("%d events in Kafka; want the 3 before the message", n)
	}

	cfg.Replication.NonTransactional = replication.NonTransactionalIgnore
	run = f.start(t, cfg)
	f.waitCount(t, 5, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	if rep := f.check(t, f.readAll(t)); rep != (report{}) {
		t.Errorf("after the restart: %+v", rep)
	}
	run.stop(t)
}

// TestMessagesRefillFromArchive: a message outbox whose slot was dropped
// and recreated while the relay was stopped is healed from its archive
// table (outbox.table), as docs/outbox-table.md says: the messages
// committed without a slot are in no WAL, their archive rows are.
func TestMessagesRefillFromArchive(t *testing.T) {
	f, cfg := messagesFixture(t)
	cfg.HistoryInterval = 100 * time.Millisecond
	emit := func(txns, n int) {
		for range txns {
			f.emitTx(t, f.makeEvents(n))
		}
	}
	run := f.start(t, cfg)
	emit(3, 5)
	f.waitAll(t, time.Minute)
	f.pg.WaitHistoryCovered(t, f.slot)
	run.stop(t)

	f.pg.DropSlot(t, f.slot)
	emit(3, 5) // no slot: only the archive has them
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	emit(1, 5)

	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := r.Recover(context.Background(), false); err != nil {
		t.Fatalf("Recover = %v; want a refill from the archive", err)
	}
	took := time.Since(began)
	f.start(t, cfg)
	emit(2, 5)
	f.waitAll(t, time.Minute)
	f.assertHealed(t, "message outbox, slot recreated while stopped, recover from the archive", took)
}
