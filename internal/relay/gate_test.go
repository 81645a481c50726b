package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
)

// rows is a retry table in memory: the undelivered rows of each aggregate.
// While insertGate is set, Insert waits for it to close (a slow insert).
type rows struct {
	mu         sync.Mutex
	n          map[string]int
	asked      [][]string      // every Undelivered call's aggregates
	inserted   [][]retry.Event // every Insert call's events
	fail       error           // Undelivered fails while set
	insertGate chan struct{}
	inserting  chan struct{} // closed when an Insert begins, if set
}

func (r *rows) Insert(ctx context.Context, evs []retry.Event) error {
	r.mu.Lock()
	wait, began := r.insertGate, r.inserting
	r.mu.Unlock()
	if began != nil {
		close(began)
	}
	if wait != nil {
		<-wait
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range evs {
		r.n[e.Aggregate]++
	}
	r.inserted = append(r.inserted, slices.Clone(evs))
	return nil
}

func (r *rows) Aggregates(_ context.Context, limit int) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for a, n := range r.n {
		if n > 0 {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (r *rows) Undelivered(_ context.Context, aggs []string) (map[string]bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, slices.Clone(aggs))
	if r.fail != nil {
		return nil, r.fail
	}
	out := map[string]bool{}
	for _, a := range aggs {
		out[a] = r.n[a] > 0
	}
	return out, nil
}

// deliver removes an aggregate's rows: the retry worker delivered them, or
// an operator dropped them.
func (r *rows) deliver(agg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.n, agg)
}

func loadedGate(t *testing.T, r *rows) *gate {
	t.Helper()
	g := newGate(r, slog.New(slog.DiscardHandler))
	if err := g.load(t.Context()); err != nil {
		t.Fatal(err)
	}
	return g
}

// release unblocks an aggregate only once the table holds none of its rows,
// asks the table only about aggregates that are blocked, and keeps them
// blocked while the table cannot say.
func TestGateRelease(t *testing.T) {
	r := &rows{n: map[string]int{"a": 1, "b": 2}}
	g := loadedGate(t, r)
	if !g.closed() || !g.holds("a") || !g.holds("b") {
		t.Fatalf("after load: closed %t, holds(a) %t, holds(b) %t; want all true", g.closed(), g.holds("a"), g.holds("b"))
	}

	r.deliver("a")
	g.release(t.Context(), []string{"a", "b", "c"})
	if g.holds("a") || !g.holds("b") {
		t.Errorf("after a's rows were delivered: holds(a) %t, holds(b) %t; want false, true", g.holds("a"), g.holds("b"))
	}
	if want := [][]string{{"a", "b"}}; !slices.EqualFunc(r.asked, want, slices.Equal) {
		t.Errorf("Undelivered asked %q; want %q (c was never blocked)", r.asked, want)
	}

	g.release(t.Context(), []string{"a"}) // no longer blocked: nothing to ask
	if len(r.asked) != 1 {
		t.Errorf("release of an aggregate not blocked asked the table: %q", r.asked)
	}

	r.fail = errors.New("connection refused")
	r.deliver("b")
	g.release(t.Context(), []string{"b"})
	if !g.holds("b") {
		t.Error("b unblocked while the table could not say whether it has rows left")
	}
	r.fail = nil
	g.release(t.Context(), []string{"b"})
	if g.holds("b") || g.closed() {
		t.Errorf("after b's rows were delivered and the table answered: holds(b) %t, closed %t; want false, false", g.holds("b"), g.closed())
	}
}

// sweep releases, every interval, the blocked aggregates whose rows another
// process delivered or dropped, and keeps the others.
func TestGateSweep(t *testing.T) {
	r := &rows{n: map[string]int{"a": 1, "b": 1}}
	g := loadedGate(t, r)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { g.sweep(ctx, 5*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()

	r.deliver("a")
	deadline := time.Now().Add(5 * time.Second)
	for g.holds("a") {
		if time.Now().After(deadline) {
			t.Fatal("sweep did not release a within 5s of its rows being delivered")
		}
		time.Sleep(time.Millisecond)
	}
	if !g.holds("b") {
		t.Error("sweep released b, which still has a row")
	}
}

// sweep asks the table about the blocked aggregates a page at a time, however
// many wait: one query of 100,000 aggregates held their array, its answer
// and the gate's lock at once (issue 34).
func TestGateSweepPages(t *testing.T) {
	const waiting = 2*sweepPage + 10
	r := &rows{n: map[string]int{}}
	for i := range waiting {
		r.n[fmt.Sprintf("agg-%d", i)] = 1
	}
	g := loadedGate(t, r)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { g.sweep(ctx, 5*time.Millisecond); close(done) }()
	defer func() { cancel(); <-done }()
	for _, a := range []string{"agg-0", fmt.Sprintf("agg-%d", waiting-1)} {
		r.deliver(a)
	}
	deadline := time.Now().Add(5 * time.Second)
	for g.holds("agg-0") || g.holds(fmt.Sprintf("agg-%d", waiting-1)) {
		if time.Now().After(deadline) {
			t.Fatal("sweep did not release the delivered aggregates within 5s")
		}
		time.Sleep(time.Millisecond)
	}
	if !g.holds("agg-1") {
		t.Error("sweep released agg-1, which still has a row")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, q := range r.asked {
		if len(q) > sweepPage {
			t.Fatalf("Undelivered call %d asked about %d aggregates; want at most %d per query", i, len(q), sweepPage)
		}
	}
}

// park stores a chunk's diverted events a page at a time, in order: one
// statement of 10,000 events held ~30 MB of parameters (issue 34).
func TestGateParkPages(t *testing.T) {
	const n = 2*parkPage + 10
	r := &rows{n: map[string]int{}}
	g := loadedGate(t, r)
	var evs []retry.Event
	for i := range n {
		evs = append(evs, retry.Event{EventKey: fmt.Sprintf("k%d", i), Aggregate: fmt.Sprintf("agg-%d", i)})
	}
	if err := g.park(t.Context(), evs, nil); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.inserted) != 3 {
		t.Fatalf("park of %d events made %d inserts; want 3 of at most %d", n, len(r.inserted), parkPage)
	}
	var keys []string
	for _, page := range r.inserted {
		if len(page) > parkPage {
			t.Errorf("an insert of %d events; want at most %d", len(page), parkPage)
		}
		for _, e := range page {
			keys = append(keys, e.EventKey)
		}
	}
	for i, k := range keys {
		if want := fmt.Sprintf("k%d", i); k != want {
			t.Fatalf("stored event %d = %s; want %s (the chunk's order)", i, k, want)
		}
	}
	if !g.holds("agg-0") || !g.holds(fmt.Sprintf("agg-%d", n-1)) {
		t.Error("parked aggregates not blocked")
	}
}

// A release that runs while the writer parks a row of its aggregate waits
// for the insert, sees the row, and keeps the aggregate blocked: an event
// parked behind a row is never overtaken by a later event sent to Kafka.
func TestGateParkBeatsRelease(t *testing.T) {
	r := &rows{n: map[string]int{"a": 1}}
	g := loadedGate(t, r)
	r.deliver("a") // the worker delivered a's row; its Delivered hook is about to release
	r.insertGate, r.inserting = make(chan struct{}), make(chan struct{})
	parked := make(chan error, 1)
	go func() { parked <- g.park(t.Context(), []retry.Event{{Aggregate: "a"}}, nil) }()
	<-r.inserting
	released := make(chan struct{})
	go func() { g.release(t.Context(), []string{"a"}); close(released) }()
	select {
	case <-released:
		t.Fatal("release returned while a row of a was being inserted")
	case <-time.After(20 * time.Millisecond):
	}
	close(r.insertGate)
	if err := <-parked; err != nil {
		t.Fatal(err)
	}
	<-released
	if !g.holds("a") {
		t.Error("a was unblocked although a row of it was inserted before the release looked")
	}
}

// A fenced writer writes nothing: neither to Kafka nor to the retry table,
// and nothing is confirmed. The pipeline stops with the fence's error.
func TestPipelineFencedWritesNothing(t *testing.T) {
	fenced := fenceFunc(func(context.Context) error {
		return &checkpoint.FencedError{Slot: "s", Epoch: 1, Newest: 2}
	})
	p := startPipe(t, pipeConfig{fence: fenced})
	p.send(t, txn{{"Order", "a", "1"}, {"Bad Type!", "b", "1"}}, 2)
	select {
	case err := <-p.done:
		if !errors.Is(err, checkpoint.ErrFenced) {
			t.Errorf("pipeline stopped with %v; want checkpoint.ErrFenced", err)
		}
		p.done <- nil // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not stop when fenced")
	}
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if len(p.l.acked) != 0 || len(p.l.parked) != 0 || len(p.l.confirmed) != 0 {
		t.Errorf("fenced: %d acknowledged, %d stored, %d confirmed; want none", len(p.l.acked), len(p.l.parked), len(p.l.confirmed))
	}
}

type fenceFunc func(context.Context) error

func (f fenceFunc) Check(ctx context.Context) error { return f(ctx) }

// Once the retry worker delivered an aggregate's rows and released it, the
// aggregate's new events go to Kafka again; until then they queue behind.
func TestPipelineUnblocksAfterDelivery(t *testing.T) {
	s := &fakeSink{Refuse: func(e *event.Event) error {
		if string(e.Value) == "2" {
			return errTooLarge
		}
		return nil
	}}
	p := startPipe(t, pipeConfig{sink: s})
	p.send(t, txn{{"Order", "a", "1"}, {"Order", "a", "2"}}, 2)
	p.waitConfirmed(t, p.send(t, txn{{"Order", "a", "3"}}, 1))
	if got, want := p.l.parkedLanes()["a"], []string{"2", "3 (waiting)"}; !slices.Equal(got, want) {
		t.Fatalf("retry rows of a = %q; want %q", got, want)
	}

	lane := p.l.parked[0].Aggregate
	p.l.dropParked(lane) // the worker delivered them
	p.pl.gate.release(t.Context(), []string{lane})
	p.waitConfirmed(t, p.send(t, txn{{"Order", "a", "4"}}, 1))
	if got, want := p.l.lanes()["a"], []string{"1", "4"}; !slices.Equal(got, want) {
		t.Errorf("acknowledged of a = %q; want %q (4 sent once a was released)", got, want)
	}
}

// TestGateHoldsDivertedUntilParked: the writer sends a chunk before an earlier
// chunk's diverted events are parked (pipelining). A route failure diverted
// in the first chunk must divert the next chunk's events of its aggregate,
// and no release may unblock the aggregate before the failure is stored.
func TestGateHoldsDivertedUntilParked(t *testing.T) {
	store := &rows{n: map[string]int{}}
	g := newGate(store, slog.New(slog.DiscardHandler))
	ev := func(agg string, seq int) event.Event {
		return event.Event{Topic: "t", Key: []byte(agg), AggregateType: "T", AggregateID: agg, ID: agg + "-" + string(rune('0'+seq))}
	}
	first := &chunk{evs: []event.Event{ev("b", 1)}, fails: []routeFailure{{before: 0, ev: ev("a", 1), err: errors.New("bad")}}}
	second := &chunk{evs: []event.Event{ev("a", 2), ev("b", 2)}}

	_, _, out1, _ := g.divert(t.Context(), first)
	if len(out1) != 1 || out1[0].held == "" {
		t.Fatalf("first chunk diverted %+v; want a's failure, held", out1)
	}
	// The sweep runs before the first chunk is parked: nothing of a is in
	// the table yet, and a must stay held all the same.
	g.release(t.Context(), []string{out1[0].held})
	send, _, out2, _ := g.divert(t.Context(), second)
	if len(send) != 1 || send[0].AggregateID != "b" || len(out2) != 1 || out2[0].ev.EventID != "a-2" {
		t.Fatalf("second chunk sends %v and diverts %+v; want b-2 sent and a-2 diverted behind a-1", send, out2)
	}
	for _, out := range [][]diverted{out1, out2} {
		if err := g.park(t.Context(), []retry.Event{out[0].ev}, []string{out[0].held}); err != nil {
			t.Fatal(err)
		}
	}
	if !g.holds(out1[0].held) {
		t.Fatal("a is not blocked once its rows are parked")
	}
	store.deliver(out1[0].held)
	g.release(t.Context(), []string{out1[0].held})
	if g.holds(out1[0].held) || g.closed() {
		t.Fatal("a is still held after its rows were delivered and released")
	}
}

// With more aggregates waiting than the gate holds (overflow), it holds at
// most its maximum in memory and asks the table about the others, so that no
// event overtakes an earlier one of its aggregate in the table, however many
// wait: at start (load) and after parking more than it holds. Once the table
// holds no more than the maximum, the sweep takes them all in again and the
// table is no longer asked.
func TestGateOverflow(t *testing.T) {
	ev := func(agg string) event.Event {
		return event.Event{Topic: "t", Key: []byte(agg), AggregateType: "T", AggregateID: agg, ID: agg + "-new"}
	}
	lane := func(agg string) string { e := ev(agg); return e.Lane().String() }
	r := &rows{n: map[string]int{}}
	for _, a := range []string{"a", "b", "c", "d", "e"} {
		r.n[lane(a)] = 1
	}
	g := newGate(r, slog.New(slog.DiscardHandler))
	g.max = 3
	if err := g.load(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(g.blocked) > g.max || !g.overflow {
		t.Fatalf("after load of 5 aggregates: %d held, overflow %t; want at most %d held, overflow", len(g.blocked), g.overflow, g.max)
	}
	divert := func(aggs ...string) (sent, diverted []string) {
		t.Helper()
		c := &chunk{}
		for _, a := range aggs {
			c.evs = append(c.evs, ev(a))
		}
		send, _, out, err := g.divert(t.Context(), c)
		if err != nil {
			t.Fatalf("divert: %v", err)
		}
		for _, e := range send {
			sent = append(sent, e.AggregateID)
		}
		var evs []retry.Event
		var held []string
		for _, d := range out {
			diverted = append(diverted, d.ev.AggregateID)
			evs, held = append(evs, d.ev), append(held, d.held)
		}
		if err := g.park(t.Context(), evs, held); err != nil {
			t.Fatal(err)
		}
		return sent, diverted
	}
	sent, diverted := divert("a", "x", "e", "y", "d")
	if !slices.Equal(sent, []string{"x", "y"}) || !slices.Equal(diverted, []string{"a", "e", "d"}) {
		t.Fatalf("in overflow: sent %q, diverted %q; want x, y sent and a, e, d (rows in the table) diverted", sent, diverted)
	}
	// x and y were sent; new aggregates parked past the maximum are found
	// in the table too.
	for _, a := range []string{"f", "g", "h"} {
		if err := g.park(t.Context(), []retry.Event{{EventKey: a, Aggregate: lane(a)}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(g.blocked) > g.max {
		t.Fatalf("%d aggregates held in memory; want at most %d", len(g.blocked), g.max)
	}
	sent, diverted = divert("h", "g", "f", "x")
	if !slices.Equal(sent, []string{"x"}) || !slices.Equal(diverted, []string{"h", "g", "f"}) {
		t.Fatalf("after parking past the maximum: sent %q, diverted %q; want x sent, h, g, f diverted", sent, diverted)
	}
	if !g.holds(lane("zz")) {
		t.Error("holds(an aggregate the gate does not know) = false in overflow; want true (the table may hold it)")
	}

	// The table cannot answer: divert fails and diverts nothing.
	r.mu.Lock()
	r.fail = errors.New("connection refused")
	r.mu.Unlock()
	if _, _, _, err := g.divert(t.Context(), &chunk{evs: []event.Event{ev("q")}}); err == nil {
		t.Fatal("divert in overflow succeeded while the table could not say which aggregates wait there")
	}
	if len(g.pending) != 0 {
		t.Fatalf("a failed divert left %d aggregates pending", len(g.pending))
	}
	r.mu.Lock()
	r.fail = nil
	r.mu.Unlock()

	// Delivered down to three aggregates: the sweep leaves overflow and
	// holds them all.
	for _, a := range []string{"a", "b", "c", "d", "e"} {
		r.deliver(lane(a))
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { g.sweep(ctx, 5*time.Millisecond); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for g.closed() && g.holds(lane("zz")) {
		if time.Now().After(deadline) {
			t.Fatal("the sweep did not leave overflow within 5s of the table holding 3 aggregates")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	r.mu.Lock()
	asked := len(r.asked)
	r.mu.Unlock()
	sent, diverted = divert("f", "a", "g", "h", "x")
	if !slices.Equal(sent, []string{"a", "x"}) || !slices.Equal(diverted, []string{"f", "g", "h"}) {
		t.Errorf("out of overflow: sent %q, diverted %q; want a, x sent, f, g, h diverted", sent, diverted)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.asked) != asked {
		t.Errorf("divert out of overflow asked the table %d times; want none", len(r.asked)-asked)
	}
}

// The pipeline with more aggregates waiting than the gate holds: every later
// event of each of them is parked behind its rows, as when the gate holds
// them all; an aggregate whose rows were delivered goes to Kafka again.
func TestPipelineGateOverflow(t *testing.T) {
	s := &fakeSink{Refuse: func(e *event.Event) error {
		if string(e.Value) == "bad" {
			return errTooLarge
		}
		return nil
	}}
	p := startPipe(t, pipeConfig{sink: s})
	p.pl.gate.mu.Lock()
	p.pl.gate.max = 2
	p.pl.gate.mu.Unlock()
	aggs := []string{"a", "b", "c", "d", "e"}
	var first, second txn
	for _, a := range aggs {
		first = append(first, [3]string{"Order", a, "bad"})
		second = append(second, [3]string{"Order", a, "2"})
	}
	p.waitConfirmed(t, p.send(t, first, 5))
	p.waitConfirmed(t, p.send(t, append(second, [3]string{"Order", "x", "2"}), 6))
	p.pl.gate.mu.Lock()
	held, overflow := len(p.pl.gate.blocked), p.pl.gate.overflow
	p.pl.gate.mu.Unlock()
	if held > 2 || !overflow {
		t.Fatalf("gate holds %d aggregates, overflow %t; want at most 2, overflow", held, overflow)
	}
	for _, a := range aggs {
		if got, want := p.l.parkedLanes()[a], []string{"bad", "2 (waiting)"}; !slices.Equal(got, want) {
			t.Errorf("retry rows of %s = %q; want %q (never overtaken)", a, got, want)
		}
	}
	var c string
	for _, e := range p.l.parked {
		if e.AggregateID == "c" {
			c = e.Aggregate
		}
	}
	p.l.dropParked(c) // the worker delivered c's rows
	p.pl.gate.release(t.Context(), []string{c})
	p.waitConfirmed(t, p.send(t, txn{{"Order", "c", "3"}, {"Order", "a", "3"}}, 2))
	lanes := p.l.lanes()
	if !slices.Equal(lanes["x"], []string{"2"}) || !slices.Equal(lanes["c"], []string{"3"}) || len(lanes["a"]) != 0 {
		t.Errorf("acknowledged: x %q, c %q, a %q; want x 2, c 3 (its rows delivered), nothing of a", lanes["x"], lanes["c"], lanes["a"])
	}
	if got, want := p.l.parkedLanes()["a"], []string{"bad", "2 (waiting)", "3 (waiting)"}; !slices.Equal(got, want) {
		t.Errorf("retry rows of a = %q; want %q", got, want)
	}
}
