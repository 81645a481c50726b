package walbuffer

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

func sample(lsn pglogrepl.LSN, pos int) Entry {
	return Entry{Event: event.Event{
		ID: fmt.Sprintf("id-%s-%d", lsn, pos), AggregateType: "Order", AggregateID: "o\x00-1", Type: "OrderPlaced",
		Topic: "t.Order", Key: []byte("o\x00-1"), Value: []byte(`{"n":1}`),
		Headers:   []event.Header{{Key: "id", Value: []byte("x")}, {Key: "bin", Value: []byte{0xff, 0}}, {Key: "nil"}},
		Extra:     []event.Header{{Key: "bin", Value: []byte{0xff, 0}}},
		Time:      time.Unix(1700000000, 123),
		CommitLSN: lsn, CommitTime: time.Unix(1700000001, 456), Pos: pos, Table: "public.outbox",
	}}
}

func TestEncodeRoundTrip(t *testing.T) {
	tests := []Entry{
		sample(0x16B3748, 1),
		{Event: event.Event{CommitLSN: 1, Pos: 7, Key: []byte{}, Value: nil}, Failure: "no aggregate type: set it"},
		{Event: event.Event{CommitLSN: 1, Pos: 8, Value: []byte{}}},
		{Event: event.Event{CommitLSN: 1, Pos: 9}, Failure: "no aggregate id: set it", FailureCode: "aggregate_id_empty"},
	}
	for i, e := range tests {
		got, err := decode(encode(&e))
		if err != nil {
			t.Fatalf("%d: decode(encode(%+v)) = %v", i, e, err)
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("%d: decode(encode(e)) = %+v; want %+v", i, got, e)
		}
	}
	// An entry without a code is written as version 1, byte for byte what a
	// binary before the code wrote and reads; one with a code is version 2.
	for i, want := range []byte{1, 1, 1, 2} {
		if b := encode(&tests[i]); b[0] != want {
			t.Errorf("%d: encoded as version %d; want %d", i, b[0], want)
		}
	}
	for _, b := range [][]byte{encode(&tests[0]), encode(&tests[3])} {
		for _, bad := range [][]byte{nil, {2}, {3}, b[:len(b)-1], append(b[:len(b):len(b)], 0)} {
			if _, err := decode(bad); err == nil {
				t.Errorf("decode(%x) = nil error; want one", bad)
			}
		}
	}
	// A version 1 entry of a refused event (before the code) still reads,
	// without a code.
	old := encode(&tests[1])
	if got, err := decode(old); err != nil || got.Failure != tests[1].Failure || got.FailureCode != "" {
		t.Errorf("decode(version 1 failure) = %+v, %v; want its failure, no code", got, err)
	}
}

func TestShouldBuffer(t *testing.T) {
	tests := []struct {
		retained, bound int64
		blocked, want   bool
	}{
		{50, 100, true, true},
		{49, 100, true, false},
		{99, 100, false, false},
		{1 << 40, 0, true, false},
	}
	for _, tt := range tests {
		if got := ShouldBuffer(tt.retained, tt.bound, tt.blocked); got != tt.want {
			t.Errorf("ShouldBuffer(%d, %d, %v) = %v; want %v", tt.retained, tt.bound, tt.blocked, got, tt.want)
		}
	}
}

func newStore(t *testing.T, slot string) (*Store, *testenv.PG) {
	pg := testenv.Postgres(t)
	s, err := NewStore(pg.Pool(t), sql.Table{Name: DefaultTable}, slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	return s, pg
}

// TestStore: rows come back in WAL order whatever the order they were
// appended in, an append again stores nothing twice, and each slot sees
// only its own rows.
func TestStore(t *testing.T) {
	ctx := context.Background()
	s, pg := newStore(t, "a")
	other, err := NewStore(pg.Pool(t), s.Table(), "b")
	if err != nil {
		t.Fatal(err)
	}
	// 0/10000000 after 0/FFFFFFF: LSNs compare as LSNs, not text.
	in := []Entry{sample(0xFFFFFFF, 2), sample(0xFFFFFFF, 1), sample(0x10000000, 1)}
	if err := s.Append(ctx, in); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(ctx, in[:1]); err != nil {
		t.Fatalf("Append again: %v", err)
	}
	if err := other.Append(ctx, []Entry{sample(0x1, 1)}); err != nil {
		t.Fatal(err)
	}
	got, err := s.Page(ctx, Key{}, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range got {
		keys = append(keys, e.Key().String())
	}
	want := []string{"lsn:0/FFFFFFF:1", "lsn:0/FFFFFFF:2", "lsn:0/10000000:1"}
	if !reflect.DeepEqual(keys, want) {
		t.Fatalf("Page = %v; want %v", keys, want)
	}
	if !reflect.DeepEqual(got[0], in[1]) {
		t.Errorf("Page()[0] = %+v; want %+v", got[0], in[1])
	}
	if page, _ := s.Page(ctx, got[0].Key(), 1, 0); len(page) != 1 || page[0].Key() != got[1].Key() {
		t.Errorf("Page(after %s, 1) = %v; want %s", got[0].Key(), page, got[1].Key())
	}
	if page, _ := s.Page(ctx, Key{}, 10, 1); len(page) != 1 {
		t.Errorf("Page(limit 10, 1 byte) = %d entries; want the first only", len(page))
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Events != 3 || st.OldestLSN != 0xFFFFFFF || st.Oldest.IsZero() {
		t.Errorf("Stats = %+v, %v; want 3 events from 0/FFFFFFF", st, err)
	}
	if n, err := s.Delete(ctx, got[1].Key()); err != nil || n != 2 {
		t.Errorf("Delete(%s) = %d, %v; want 2", got[1].Key(), n, err)
	}
	if any, _ := other.Any(ctx); !any {
		t.Errorf("the other slot's row went with this slot's")
	}
	missing, _ := NewStore(pg.Pool(t), sql.Table{Name: "no_such_buffer"}, "a")
	if st, err := missing.Stats(ctx); err != nil || st.Events != 0 {
		t.Errorf("Stats of a missing table = %+v, %v; want nothing, no error", st, err)
	}
}

// TestAppendPages: an Append larger than one statement's page stores every
// entry whole, in key order, and again as a no-op (a transaction read
// again); an entry without a commit LSN refuses the whole Append before
// anything is stored.
func TestAppendPages(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, "pages")
	in := make([]Entry, 2*AppendPage+1)
	for i := range in {
		in[i] = sample(pglogrepl.LSN(0x100+i/7), i%7)
	}
	bad := append(slices.Clone(in[:AppendPage+1]), Entry{Event: event.Event{ID: "no-lsn", Pos: 1}})
	if err := s.Append(ctx, bad); err == nil {
		t.Fatal("Append with an entry without a commit LSN = nil error; want one")
	}
	if any, _ := s.Any(ctx); any {
		t.Fatal("an Append refused for an entry without a commit LSN stored some of the others")
	}
	for range 2 {
		if err := s.Append(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Page(ctx, Key{}, len(in)+10, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(in) {
		t.Fatalf("Page = %d entries after appending %d twice; want %d", len(got), len(in), len(in))
	}
	for i := range in {
		if !reflect.DeepEqual(got[i], in[i]) {
			t.Fatalf("entry %d = %+v; want %+v", i, got[i], in[i])
		}
	}
}

// TestDrainer: the drainer hands on pages in order, never a row twice,
// deletes only what the writer finished, and, until empty, returns once
// everything is finished and deleted; rows appended while it runs come
// after.
func TestDrainer(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, "a")
	var in []Entry
	for i := range 2500 {
		in = append(in, sample(pglogrepl.LSN(0x1000+i/3), i%3+1))
	}
	if err := s.Append(ctx, in[:2000]); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sent []Key
	d := &Drainer{Store: s, PageSize: 300, Poll: 10 * time.Millisecond}
	pending := make(chan Key, 100)
	d.Send = func(ctx context.Context, page []Entry) error {
		mu.Lock()
		for _, e := range page {
			sent = append(sent, e.Key())
		}
		mu.Unlock()
		if len(sent) == 300 {
			// Appended while draining: after what is buffered.
			if err := s.Append(ctx, in[2000:]); err != nil {
				return err
			}
		}
		pending <- page[len(page)-1].Key()
		return nil
	}
	// The writer: finishes pages a little later, in order.
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		for {
			select {
			case k := <-pending:
				time.Sleep(5 * time.Millisecond)
				// Nothing is deleted before the writer finished it.
				if page, _ := s.Page(wctx, Key{}, 1, 0); len(page) == 0 || k.Less(page[0].Key()) {
					t.Errorf("rows up to %s were deleted before the writer finished them", k)
				}
				d.Acked(k)
			case <-wctx.Done():
				return
			}
		}
	}()
	if err := d.Run(ctx, true, nil); err != nil {
		t.Fatal(err)
	}
	if len(sent) != len(in) {
		t.Fatalf("sent %d rows; want %d", len(sent), len(in))
	}
	for i := range in {
		if sent[i] != in[i].Key() {
			t.Fatalf("row %d sent is %s; want %s", i, sent[i], in[i].Key())
		}
	}
	if any, _ := s.Any(ctx); any {
		t.Errorf("rows left in the buffer after Run until empty")
	}
}

// TestDrainerFenced: a fence's refusal ends the drain with it (a deposed
// leader deletes nothing).
func TestDrainerFenced(t *testing.T) {
	ctx := context.Background()
	s, _ := newStore(t, "a")
	if err := s.Append(ctx, []Entry{sample(0x100, 1)}); err != nil {
		t.Fatal(err)
	}
	fenced := errors.New("fenced")
	d := &Drainer{Store: s, Poll: 10 * time.Millisecond, Fence: func(context.Context) error { return fenced }}
	d.Send = func(ctx context.Context, page []Entry) error { d.Acked(page[len(page)-1].Key()); return nil }
	if err := d.Run(ctx, true, nil); !errors.Is(err, fenced) {
		t.Fatalf("Run = %v; want the fence's error", err)
	}
	if any, _ := s.Any(ctx); !any {
		t.Errorf("a fenced drainer deleted rows")
	}
}

// TestWriteCost measures what buffering costs Postgres per event: the WAL
// of appending and deleting it, and the table's size while it is held
// (docs/wal-buffer.md quotes the figures, per million events of a 300-byte
// JSON payload with three headers). It fails only if a row costs more than
// four times its event in WAL.
func TestWriteCost(t *testing.T) {
	ctx := context.Background()
	s, pg := newStore(t, "cost")
	pool := pg.Pool(t)
	const n, batch = 20000, 1000
	payload := []byte(`{"order_id": "8f14e45f-ceea-467f-a0e6-3c7a1e2d9b11", "customer": "c-12345", "items": [{"sku": "A-1", "qty": 2, "price": 19.99}, {"sku": "B-7", "qty": 1, "price": 5.5}], "total": 45.48, "currency": "EUR", "placed_at": "2026-11-28T03:00:00Z", "note": "leave at the door, ring twice"}`)
	wal := func() int64 {
		var lsn int64
		if err := pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint`).Scan(&lsn); err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	var stored int
	before := wal()
	for i := 0; i < n; i += batch {
		entries := make([]Entry, batch)
		for j := range entries {
			e := sample(pglogrepl.LSN(0x1000000+i+j), 1)
			e.Event.Value = payload
			entries[j] = e
			stored += len(encode(&e))
		}
		if err := s.Append(ctx, entries); err != nil {
			t.Fatal(err)
		}
	}
	appended := wal()
	var size int64
	if err := pool.QueryRow(ctx, `SELECT pg_total_relation_size($1)`, s.Table().Quoted()).Scan(&size); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete(ctx, Key{LSN: 0xFFFFFFFF}); err != nil {
		t.Fatal(err)
	}
	deleted := wal()
	perEvent := float64(stored) / n
	appendWAL, deleteWAL := float64(appended-before)/n, float64(deleted-appended)/n
	t.Logf("per event (%.0f bytes stored): append %.0f bytes of WAL, delete %.0f; table %.0f bytes while held. Per million events: %.0f MB of WAL, table %.0f MB",
		perEvent, appendWAL, deleteWAL, float64(size)/n, (appendWAL+deleteWAL)*1e6/(1<<20), float64(size)*1e6/n/(1<<20))
	if appendWAL+deleteWAL > 4*perEvent {
		t.Errorf("buffering an event of %.0f bytes wrote %.0f bytes of WAL; want at most 4 times its size", perEvent, appendWAL+deleteWAL)
	}
}
