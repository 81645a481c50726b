package relay

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// The gate in overflow against a real retry table: more aggregates parked
// than it holds in memory; each new event of every one of them is diverted
// behind its rows (the table asked, by slot: another slot's rows of the same
// aggregates hold nothing back), an aggregate without rows is sent; a gate
// loaded at start from such a table is in overflow too, and once rows are
// delivered down to its maximum the sweep's reload holds them all again.
func TestGateOverflowRetryTable(t *testing.T) {
	pg := testenv.Postgres(t)
	table, _ := sql.ParseTable(sql.DefaultRetryTable)
	for _, s := range sql.RetryTable(table) {
		pg.Exec(t, s)
	}
	store, err := retry.NewStore(pg.Pool(t), "", "gate_slot")
	if err != nil {
		t.Fatal(err)
	}
	other, err := retry.NewStore(pg.Pool(t), "", "other_slot")
	if err != nil {
		t.Fatal(err)
	}
	ev := func(agg string, n int) event.Event {
		return event.Event{Topic: "t", Key: []byte(agg), AggregateType: "T", AggregateID: agg, ID: fmt.Sprintf("%s-%d", agg, n)}
	}
	stored := func(agg string, n int) retry.Event {
		e := ev(agg, n)
		r := retry.NewEvent(&e)
		r.EventKey = e.ID
		return r
	}
	// Another slot's row of aggregate z: nothing of this slot's waits.
	if err := other.Insert(t.Context(), []retry.Event{stored("z", 0)}); err != nil {
		t.Fatal(err)
	}
	g := newGate(store, slog.New(slog.DiscardHandler))
	g.max = 2
	if err := g.load(t.Context()); err != nil {
		t.Fatal(err)
	}
	aggs := []string{"a", "b", "c", "d", "e"}
	for _, a := range aggs {
		if err := g.park(t.Context(), []retry.Event{stored(a, 1)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	check := func(g *gate, n int, wantSent ...string) {
		t.Helper()
		c := &chunk{}
		for _, a := range append(slices.Clone(aggs), "z") {
			c.evs = append(c.evs, ev(a, n))
		}
		send, _, out, err := g.divert(t.Context(), c)
		if err != nil {
			t.Fatalf("divert: %v", err)
		}
		var sent []string
		for _, e := range send {
			sent = append(sent, e.AggregateID)
		}
		if !slices.Equal(sent, wantSent) {
			t.Fatalf("sent %q; want %q (the others have rows in the table)", sent, wantSent)
		}
		if len(g.blocked) > g.max {
			t.Fatalf("%d aggregates held in memory; want at most %d", len(g.blocked), g.max)
		}
		var evs []retry.Event
		var held []string
		for _, d := range out {
			d.ev.EventKey = d.ev.EventID
			evs, held = append(evs, d.ev), append(held, d.held)
		}
		if err := g.park(t.Context(), evs, held); err != nil {
			t.Fatal(err)
		}
	}
	check(g, 2, "z")
	if !g.overflow {
		t.Fatal("5 aggregates parked in a gate that holds 2: not in overflow")
	}

	// Loaded at start from the table: the same.
	g2 := newGate(store, slog.New(slog.DiscardHandler))
	g2.max = 2
	if err := g2.load(t.Context()); err != nil {
		t.Fatal(err)
	}
	check(g2, 3, "z")

	// Rows of a, b and c delivered: the reload holds d and e, and stops
	// asking the table; a, b and c go to Kafka again.
	pg.Exec(t, `DELETE FROM outbox_relay_retry WHERE slot_name = 'gate_slot' AND aggregate_id IN ('a', 'b', 'c')`)
	g2.leaveOverflow(t.Context())
	if g2.overflow || len(g2.blocked) != 2 {
		t.Fatalf("after the table went down to 2 aggregates: overflow %t, %d held; want no overflow, 2 held", g2.overflow, len(g2.blocked))
	}
	check(g2, 4, "a", "b", "c", "z")
}
