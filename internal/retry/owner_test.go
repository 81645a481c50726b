package retry_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	ev "github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// twoSlots returns stores of two slots on one fresh retry table, each
// holding the same three events (same event keys: two slots reading one
// outbox table park the same event under the same key), the second of A
// dead.
func twoSlots(t *testing.T) (a, b *retry.Store, pg *testenv.PG) {
	t.Helper()
	a, pg = newStoreIn(t)
	b, err := retry.NewStore(pg.Pool(t), "", "other_slot")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*retry.Store{a, b} {
		evs := []retry.Event{event("orders", "A", "e1"), event("orders", "A", "e2"), event("orders", "B", "e3")}
		for i := range evs {
			evs[i].SourceLSN = pglogrepl.LSN(100 + i)
		}
		if s == a {
			evs[1].Permanent = true
		}
		if err := s.Insert(context.Background(), evs); err != nil {
			t.Fatalf("Insert into slot %s: %v", s.Slot(), err)
		}
	}
	return a, b, pg
}

// TestStoreOwnRowsOnly: every operation of a Store sees and changes only
// its own slot's rows, though another slot holds rows with the same keys,
// ids and aggregates in the same table.
func TestStoreOwnRowsOnly(t *testing.T) {
	ctx := context.Background()
	a, b, _ := twoSlots(t)
	if got := eventKeys(list(t, a, retry.Filter{})); !slices.Equal(got, []string{"e1", "e2", "e3"}) {
		t.Fatalf("List of slot A = %q; want its three rows (the same keys as B's, stored once per slot)", got)
	}
	bRows := list(t, b, retry.Filter{})
	if got := eventKeys(bRows); !slices.Equal(got, []string{"e1", "e2", "e3"}) {
		t.Fatalf("List of slot B = %q; want its three rows", got)
	}
	if dead := list(t, b, retry.Filter{Status: retry.StatusDead}); len(dead) != 0 {
		t.Errorf("dead rows of slot B = %q; want none (A's dead row is A's)", eventKeys(dead))
	}
	// Get by a seq of the other slot's row finds nothing.
	for _, e := range bRows {
		if got, err := a.Get(ctx, itoa(e.Seq)); err == nil {
			t.Errorf("A.Get(%d) (a row of slot B) = row %d of slot A; want not found", e.Seq, got.Seq)
		}
	}
	// Requeue and drop by id or seq touch only the store's own rows.
	if _, err := a.Requeue(ctx, []string{itoa(bRows[0].Seq)}); !errors.Is(err, retry.ErrNotFound) {
		t.Errorf("A.Requeue(seq of B's row) = %v; want not found", err)
	}
	if seqs, err := b.RequeueAllDead(ctx); err != nil || len(seqs) != 0 {
		t.Errorf("B.RequeueAllDead = %v, %v; want nothing (the dead row is A's)", seqs, err)
	}
	if get(t, a, "e2").Status != retry.StatusDead {
		t.Errorf("A's dead row changed by B's RequeueAllDead")
	}
	if dropped, err := b.Drop(ctx, []string{"e1", "e2"}); err != nil || !slices.Equal(dropped, seqs(bRows[:2])) {
		t.Fatalf("B.Drop(e1, e2) = %v, %v; want B's rows %v", dropped, err, seqs(bRows[:2]))
	}
	if got := eventKeys(list(t, a, retry.Filter{})); !slices.Equal(got, []string{"e1", "e2", "e3"}) {
		t.Errorf("A's rows after B dropped its own = %q; want all three", got)
	}
	// Aggregates and Undelivered: B's A aggregate is gone with its row,
	// A's is not.
	aggA := ev.Lane{Topic: "orders", Key: "A"}.String()
	if got, err := b.Undelivered(ctx, []string{aggA}); err != nil || got[aggA] {
		t.Errorf("B.Undelivered(A) = %v, %v; want false (only A's slot has rows of it)", got, err)
	}
	if got, err := a.Undelivered(ctx, []string{aggA}); err != nil || !got[aggA] {
		t.Errorf("A.Undelivered(A) = %v, %v; want true", got, err)
	}
	if got, err := b.Aggregates(ctx, 0); err != nil || len(got) != 1 {
		t.Errorf("B.Aggregates = %q, %v; want its one aggregate left", got, err)
	}
	// Held looks at the store's own rows.
	evs := []ev.Event{{ID: "e1", Type: "Created", Topic: "orders", Key: []byte("A"), Value: []byte(`{"id":"e1"}`)}}
	if held, err := b.Held(ctx, evs, ""); err != nil || held[0] {
		t.Errorf("B.Held(e1) = %v, %v; want not held (only A holds it)", held, err)
	}
	if held, err := a.Held(ctx, evs, ""); err != nil || !held[0] {
		t.Errorf("A.Held(e1) = %v, %v; want held", held, err)
	}
	// Unpark deletes the store's own rows only.
	if n, err := b.Unpark(ctx, 0, nil); err != nil || n != 1 {
		t.Errorf("B.Unpark(0) = %d, %v; want its 1 row", n, err)
	}
	if got := eventKeys(list(t, a, retry.Filter{})); !slices.Equal(got, []string{"e1", "e2", "e3"}) {
		t.Errorf("A's rows after B's Unpark = %q; want all three", got)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestWorkerOwnRowsOnly: a Worker delivers its own slot's rows only, to its
// own topic; the rows of another slot in the same table stay, untouched,
// for that slot's Worker.
func TestWorkerOwnRowsOnly(t *testing.T) {
	a, pg := newStoreIn(t)
	b, err := retry.NewStore(pg.Pool(t), "", "other_slot")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := a.Insert(ctx, []retry.Event{event("a-topic", "K", "a1"), event("a-topic", "K", "a2")}); err != nil {
		t.Fatal(err)
	}
	if err := b.Insert(ctx, []retry.Event{event("b-topic", "K", "b1"), event("b-topic", "L", "b2")}); err != nil {
		t.Fatal(err)
	}
	sk := &fakeSink{}
	startWorker(t, fastConfig(a, sk, func(string, string) (string, error) { return "a-topic", nil }))
	waitFor(t, 30*time.Second, "slot A's rows delivered", empty(t, a))
	time.Sleep(300 * time.Millisecond) // a few more polls
	if got := sk.keys(); !slices.Equal(got, []string{"K", "K"}) {
		t.Errorf("worker of slot A wrote keys %q; want its own two rows (K, K)", got)
	}
	for _, m := range sk.written {
		if m.Topic != "a-topic" || !strings.HasPrefix(m.ID, "a") {
			t.Errorf("worker of slot A wrote %s to %s; want only its own rows, to a-topic", m.ID, m.Topic)
		}
	}
	if got := eventKeys(list(t, b, retry.Filter{})); !slices.Equal(got, []string{"b1", "b2"}) {
		t.Errorf("slot B's rows after A's worker ran = %q; want both, untouched", got)
	}
	if e := get(t, b, "b1"); e.Attempts != 0 {
		t.Errorf("slot B's b1 has %d attempts after A's worker ran; want 0", e.Attempts)
	}
}

// TestAdopt: rows of an earlier version (no slot) are adopted when nothing
// else can own them, and otherwise left alone with an error naming the
// UPDATE that assigns them.
func TestAdopt(t *testing.T) {
	ctx := context.Background()
	orphan := func(t *testing.T, pg *testenv.PG, key, table string) {
		t.Helper()
		pg.Exec(t, `INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, outbox_table)
VALUES ($1, 'orders/O', 'pending', now(), nullif($2, ''))`, key, table)
	}
	cp := sql.Table{Name: sql.DefaultCheckpointTable}
	mine := []string{"public.outbox"}
	checkpoint := func(t *testing.T, pg *testenv.PG, slots ...string) {
		t.Helper()
		pg.Exec(t, sql.CheckpointTable(cp))
		for _, s := range slots {
			pg.Exec(t, `INSERT INTO outbox_relay_checkpoint (slot_name, lsn) VALUES ($1, '0/1')`, s)
		}
	}

	t.Run("only slot", func(t *testing.T) {
		s, pg := newStoreIn(t)
		checkpoint(t, pg, testSlot)
		orphan(t, pg, "o1", "public.outbox")
		orphan(t, pg, "o2", "")
		if n, err := s.Adopt(ctx, cp, mine); err != nil || n != 2 {
			t.Fatalf("Adopt = %d, %v; want 2", n, err)
		}
		if got := eventKeys(list(t, s, retry.Filter{})); !slices.Equal(got, []string{"o1", "o2"}) {
			t.Errorf("rows of the slot after Adopt = %q; want o1, o2", got)
		}
		if n, err := s.Adopt(ctx, cp, mine); err != nil || n != 0 {
			t.Errorf("second Adopt = %d, %v; want 0, nil", n, err)
		}
	})
	t.Run("another slot", func(t *testing.T) {
		s, pg := newStoreIn(t)
		checkpoint(t, pg, testSlot, "billing_slot")
		orphan(t, pg, "o1", "public.outbox")
		n, err := s.Adopt(ctx, cp, mine)
		var oe *retry.OrphansError
		if !errors.As(err, &oe) || n != 0 {
			t.Fatalf("Adopt with another slot in the checkpoint table = %d, %v; want an *OrphansError", n, err)
		}
		for _, want := range []string{"billing_slot", "UPDATE \"outbox_relay_retry\" SET slot_name", "public.outbox: 1"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Adopt error %q; want it to say %q", err, want)
			}
		}
		if got := list(t, s, retry.Filter{}); len(got) != 0 {
			t.Errorf("rows of the slot after a refused Adopt = %q; want none", eventKeys(got))
		}
	})
	t.Run("another outbox table", func(t *testing.T) {
		s, pg := newStoreIn(t)
		orphan(t, pg, "o1", "public.outbox")
		orphan(t, pg, "o2", "public.billing_outbox")
		_, err := s.Adopt(ctx, cp, mine)
		var oe *retry.OrphansError
		if !errors.As(err, &oe) || !strings.Contains(err.Error(), "public.billing_outbox") {
			t.Fatalf("Adopt with a row of another outbox table = %v; want an *OrphansError naming public.billing_outbox", err)
		}
		if got := list(t, s, retry.Filter{}); len(got) != 0 {
			t.Errorf("rows of the slot after a refused Adopt = %q; want none", eventKeys(got))
		}
	})
}
