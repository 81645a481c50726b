package retry_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	ev "github.com/outbox-relay/outbox-relay/event"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// newStoreIn is newStore that also returns the database, for tests that
// change the table under the Store.
// testSlot is the slot of the stores of newStore and newStoreIn.
const testSlot = "relay_test"

func newStoreIn(t *testing.T) (*retry.Store, *testenv.PG) {
	t.Helper()
	pg := testenv.Postgres(t)
	table, _ := sql.ParseTable(sql.DefaultRetryTable)
	for _, s := range sql.RetryTable(table) {
		pg.Exec(t, s)
	}
	s, err := retry.NewStore(pg.Pool(t), "", testSlot)
	if err != nil {
		t.Fatal(err)
	}
	return s, pg
}

// incompressible returns n bytes of random base64 text: pglz cannot shrink
// it below a btree entry's limit, as it could a repeated string.
func incompressible(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)[:n]
}

// TestInsertLongAggregate: an aggregate far beyond a btree entry's limit
// (which the old (aggregate, seq) index refused, stalling the relay) is
// stored normally and found by Aggregates and Undelivered.
func TestInsertLongAggregate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	key := incompressible(t, 12<<10)
	var events []retry.Event
	for i := range 3 {
		e := event("orders", key, fmt.Sprintf("long-%d", i))
		e.EventKey = ev.PositionKey(0x100, i)
		e.Waiting = i > 0
		events = append(events, e)
	}
	events = append(events, event("orders", "short", "short-1"))
	if err := s.Insert(ctx, events); err != nil {
		t.Fatalf("Insert of a %d-byte aggregate: %v", len(events[0].Aggregate), err)
	}
	long := ev.Lane{Topic: "orders", Key: key}.String()
	aggs, err := s.Aggregates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(aggs) != 2 || !slices.Contains(aggs, long) || !slices.Contains(aggs, "orders/short") {
		t.Errorf("Aggregates() has %d aggregates; want the long one and orders/short", len(aggs))
	}
	und, err := s.Undelivered(ctx, []string{long, long[:len(long)-1], "orders/short", "orders/none"})
	if err != nil {
		t.Fatal(err)
	}
	if !und[long] || und[long[:len(long)-1]] || !und["orders/short"] || und["orders/none"] {
		t.Errorf("Undelivered() = long %v, long minus a byte %v, short %v, none %v; want true false true false",
			und[long], und[long[:len(long)-1]], und["orders/short"], und["orders/none"])
	}
	for _, e := range list(t, s, retry.Filter{}) {
		if e.LastResort || e.Status != retry.StatusPending {
			t.Errorf("row %s: last resort %v, status %q; want a normal pending row", e.EventKey, e.LastResort, e.Status)
		}
	}
}

// TestInsertLastResort: events that the table refuses for reasons of their
// data (a CHECK constraint rejecting one value, a NUL byte in a text
// column, an event key beyond the unique index's limit) become last-resort
// records, while the other events of the same Insert are stored normally,
// all in input order; the records keep the whole event, block their
// aggregate, and say what to do.
func TestInsertLastResort(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	pg.Exec(t, `ALTER TABLE outbox_relay_retry ADD CONSTRAINT no_poison CHECK (value IS DISTINCT FROM 'poison'::bytea)`)

	a1, b1, poison, a3, nul, longKey, b2 := event("orders", "A", "a1"), event("orders", "B", "b1"),
		event("orders", "A", "a2"), event("orders", "A", "a3"), event("orders", "C", "c1"),
		event("orders", "D", "d1"), event("orders", "B", "b2")
	poison.Value = []byte("poison")
	poison.Extra = []retry.Header{{Key: "k\x00", Value: []byte{0xff, 0}}, {Key: "nil", Value: nil}}
	poison.SourceLSN, poison.CommitTime = 0x16B3748, time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	a3.Waiting = true
	nul.EventType = "Created\x00\xfe"
	longKey.EventKey = incompressible(t, 4000)
	b2.Permanent = true
	events := []retry.Event{a1, b1, poison, a3, nul, longKey, b2}
	if err := s.Insert(ctx, events); err != nil {
		t.Fatalf("Insert: %v", err)
	}

	rows := list(t, s, retry.Filter{})
	if len(rows) != len(events) {
		t.Fatalf("%d rows; want %d, one per event", len(rows), len(events))
	}
	if !slices.IsSorted(seqs(rows)) {
		t.Errorf("seqs = %v; want ascending", seqs(rows))
	}
	for i, e := range rows {
		want := events[i]
		lastResort := i == 2 || i == 4 || i == 5
		if e.Aggregate != want.Aggregate {
			t.Errorf("row %d: aggregate %q; want %q (input order, aggregate kept)", i, e.Aggregate, want.Aggregate)
		}
		if e.LastResort != lastResort {
			t.Errorf("row %d (%s): last resort %v; want %v", i, want.EventID, e.LastResort, lastResort)
			continue
		}
		switch {
		case lastResort:
			if e.Status != retry.StatusDead || !strings.Contains(e.LastError, "last-resort record") ||
				!strings.Contains(e.LastError, "outbox-relay retries show "+e.EventKey) || !strings.Contains(e.LastError, "drop") {
				t.Errorf("row %d: status %q, last error %q; want dead, saying what happened and what to do", i, e.Status, e.LastError)
			}
		case i == 6:
			if e.Status != retry.StatusDead || e.EventKey != want.EventKey {
				t.Errorf("row %d: %+v; want b2 stored normally, dead", i, e)
			}
		default:
			if e.Status != retry.StatusPending || e.EventKey != want.EventKey || e.Waiting != want.Waiting {
				t.Errorf("row %d: %+v; want %s stored normally", i, e, want.EventID)
			}
		}
	}
	if !strings.Contains(rows[2].LastError, "no_poison") {
		t.Errorf("poison's last error %q; want the constraint that refused it", rows[2].LastError)
	}
	if rows[5].EventKey == longKey.EventKey || len(rows[5].EventKey) > 256 {
		t.Errorf("long key's record has a %d-byte key; want a short digest", len(rows[5].EventKey))
	}

	// The whole event is recoverable, byte for byte.
	for _, i := range []int{2, 4, 5} {
		want := events[i]
		got, err := s.Get(ctx, rows[i].EventKey)
		if err != nil {
			t.Fatalf("Get(%q): %v", rows[i].EventKey, err)
		}
		if !got.LastResort || got.EventID != want.EventID || got.EventType != want.EventType ||
			got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID || got.Topic != want.Topic ||
			!bytes.Equal(got.Key, want.Key) || !bytes.Equal(got.Value, want.Value) ||
			got.SourceLSN != want.SourceLSN || !got.CommitTime.Equal(want.CommitTime) || !sameHeaders(got.Extra, want.Extra) {
			t.Errorf("Get(%q) = %+v; want the event as inserted: %+v", rows[i].EventKey, got, want)
		}
	}

	// They block their aggregates.
	und, err := s.Undelivered(ctx, []string{"orders/A", "orders/C", "orders/D"})
	if err != nil || !und["orders/A"] || !und["orders/C"] || !und["orders/D"] {
		t.Errorf("Undelivered() = %v, %v; want all true", und, err)
	}

	// Inserting again after a "crash" changes nothing.
	if err := s.Insert(ctx, events); err != nil {
		t.Fatalf("Insert again: %v", err)
	}
	if again := list(t, s, retry.Filter{}); !slices.Equal(seqs(again), seqs(rows)) {
		t.Errorf("after re-insert seqs = %v; want %v", seqs(again), seqs(rows))
	}
}

// TestInsertNotDataFault: an error that is not the data's fault is
// returned, not turned into last-resort records.
func TestInsertNotDataFault(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	pg.Exec(t, `DROP TABLE outbox_relay_retry`)
	if err := s.Insert(ctx, []retry.Event{event("orders", "A", "a1")}); err == nil || !strings.Contains(err.Error(), "42P01") {
		t.Errorf("Insert into a missing table = %v; want the undefined-table error", err)
	}
}

func sameHeaders(a, b []retry.Header) bool {
	return slices.EqualFunc(a, b, func(x, y retry.Header) bool {
		return x.Key == y.Key && bytes.Equal(x.Value, y.Value) && (x.Value == nil) == (y.Value == nil)
	})
}

// TestHeadersRoundTrip: every byte value 0..255, alone and together, in
// header keys and values survives the headers column unchanged (jsonb
// cannot hold NUL, JSON strings cannot hold invalid UTF-8), nil and empty
// values stay apart, readable headers stay readable, and rows of the old
// format still decode.
func TestHeadersRoundTrip(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	var hs []retry.Header
	all := make([]byte, 256)
	for b := range 256 {
		all[b] = byte(b)
		hs = append(hs, retry.Header{Key: string([]byte{byte(b)}), Value: []byte{byte(b)}})
	}
	hs = append(hs,
		retry.Header{Key: string(all), Value: all},
		retry.Header{Key: "", Value: []byte{}},
		retry.Header{Key: "nil", Value: nil},
		retry.Header{Key: "é", Value: []byte("ü\x01")})
	e := event("orders", "A", "h1")
	e.Extra = hs
	if err := s.Insert(ctx, []retry.Event{e}); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	got, err := s.Get(ctx, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if got.LastResort {
		t.Fatalf("headers made a last-resort record; want them in the headers column")
	}
	if !sameHeaders(got.Extra, hs) {
		for i := range min(len(got.Extra), len(hs)) {
			if !sameHeaders(got.Extra[i:i+1], hs[i:i+1]) {
				t.Errorf("header %d = %q: %q; want %q: %q", i, got.Extra[i].Key, got.Extra[i].Value, hs[i].Key, hs[i].Value)
			}
		}
		t.Fatalf("got %d headers; want %d, equal", len(got.Extra), len(hs))
	}
	var readable bool
	if err := pg.Pool(t).QueryRow(ctx, `SELECT headers @> '[{"key": "é", "value": "ü\u0001"}]' FROM outbox_relay_retry`).Scan(&readable); err != nil || !readable {
		t.Errorf("headers column holds é: ü\\x01 readable = %v, %v; want true", readable, err)
	}

	// The old format, as earlier versions wrote it.
	pg.Exec(t, `INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, headers, slot_name)
VALUES ('old', 'orders/O', 'pending', now(), '[{"key":"id","value":"o1"},{"key":"trace","value":""}]', $1)`, testSlot)
	old, err := s.Get(ctx, "old")
	if err != nil {
		t.Fatal(err)
	}
	if want := []retry.Header{{Key: "id", Value: []byte("o1")}, {Key: "trace", Value: []byte{}}}; !sameHeaders(old.Extra, want) {
		t.Errorf("old-format headers = %q; want %q", old.Extra, want)
	}
}

// TestMigrate: a table as an earlier version made it (no last_resort or
// slot_name column, event_key unique across the table, indexes without the
// slot, the (aggregate, seq) one) is upgraded, keeping its rows, and a
// second Migrate is a no-op. Its rows belong to no slot until adopted.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	pg.Exec(t, `DROP TABLE outbox_relay_retry`)
	pg.Exec(t, `CREATE TABLE outbox_relay_retry (
    `+testenv.OldRetryColumns+`,
    "message_time" timestamptz,
    "outbox_table" text)`)
	pg.Exec(t, `CREATE INDEX outbox_relay_retry_status_next_attempt_at_idx ON outbox_relay_retry (status, next_attempt_at)`)
	pg.Exec(t, `CREATE INDEX outbox_relay_retry_aggregate_seq_idx ON outbox_relay_retry (aggregate, seq)`)
	pg.Exec(t, `INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at) VALUES ('old', 'orders/O', 'dead', now())`)
	if _, err := s.List(ctx, retry.Filter{}); err == nil || !strings.Contains(err.Error(), "setup") {
		t.Errorf("List on an old table = %v; want an error saying to upgrade it", err)
	}
	for range 2 {
		if err := s.Migrate(ctx); err != nil {
			t.Fatalf("Migrate: %v", err)
		}
	}
	if keys := eventKeys(list(t, s, retry.Filter{})); len(keys) != 0 {
		t.Errorf("rows of the slot after Migrate = %q; want none before Adopt (the old row belongs to no slot)", keys)
	}
	if n, err := s.Adopt(ctx, sql.Table{Name: sql.DefaultCheckpointTable}, []string{"public.outbox"}); err != nil || n != 1 {
		t.Fatalf("Adopt = %d, %v; want 1 row adopted (no checkpoint table: no other slot)", n, err)
	}
	var idx []string
	rows, err := pg.Pool(t).Query(ctx, `SELECT indexname FROM pg_indexes WHERE tablename = 'outbox_relay_retry' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		idx = append(idx, n)
	}
	want := []string{"outbox_relay_retry_pkey", "outbox_relay_retry_slot_aggregate_md5_seq_idx",
		"outbox_relay_retry_slot_event_key_idx", "outbox_relay_retry_slot_status_next_attempt_idx"}
	if !slices.Equal(idx, want) {
		t.Errorf("indexes after Migrate = %q; want %q", idx, want)
	}
	if keys := eventKeys(list(t, s, retry.Filter{})); !slices.Equal(keys, []string{"old"}) {
		t.Errorf("rows after Migrate = %q; want the old row", keys)
	}
	long := event("orders", incompressible(t, 9000), "long")
	if err := s.Insert(ctx, []retry.Event{long}); err != nil {
		t.Fatalf("Insert after Migrate: %v", err)
	}
	if e := get(t, s, "long"); e.LastResort {
		t.Errorf("long aggregate after Migrate stored as a last-resort record; want a normal row")
	}
}

// TestCountKeys counts the slot's rows whose key starts with the prefix, as
// text (no pattern: "_" is no wildcard), and no other slot's.
func TestCountKeys(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	other, err := retry.NewStore(pg.Pool(t), "", "other_slot")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Insert(ctx, []retry.Event{event("orders", "a", "refill:r_1:1"), event("orders", "b", "refill:r_1:2"),
		event("orders", "c", "refill:rx1:3"), event("orders", "d", "live-1")}); err != nil {
		t.Fatal(err)
	}
	if err := other.Insert(ctx, []retry.Event{event("orders", "a", "refill:r_1:9")}); err != nil {
		t.Fatal(err)
	}
	for prefix, want := range map[string]int64{"refill:r_1:": 2, "refill:": 3, "live": 1, "none": 0} {
		if n, err := s.CountKeys(ctx, prefix); err != nil || n != want {
			t.Errorf("CountKeys(%q) = %d, %v; want %d", prefix, n, err, want)
		}
	}
}
