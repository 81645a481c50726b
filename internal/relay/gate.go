package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
)

// gate is the set of aggregates with undelivered rows in the retry table.
// While an aggregate is in it, its events go into the table behind those rows
// instead of to Kafka, so they cannot overtake them (DESIGN invariant 6).
//
// The gate alone touches its lock and its set. mu serialises inserts into the
// table (park) with unblocking (release): an aggregate is taken out only
// after the table is seen to hold none of its rows, under the same lock as
// every insert, so a row being inserted always keeps it blocked. An event
// diverted and not yet parked holds its aggregate too (pending): the writer
// sends later chunks before an earlier one's diverted events are parked
// (write.go), and neither they nor a release may pass such an event. Its
// methods are safe for concurrent use: the writer diverts and parks, the
// retry worker's Delivered hook and the sweep release.
//
// Its memory is bounded whatever the number of waiting aggregates: blocked
// holds at most max of them (~100 bytes each). When more wait (overflow),
// blocked holds some of them and the table is the set: divert asks it about
// each aggregate of a chunk it does not hold, one query a chunk, under mu
// like park, so the answer includes every row parked before. The sweep
// leaves overflow once the table holds max aggregates or fewer.
type gate struct {
	store retryTable
	log   *slog.Logger
	max   int // most aggregates blocked holds: maxBlocked

	mu       sync.Mutex
	blocked  map[string]struct{}
	overflow bool           // the table may hold blocked aggregates that blocked does not
	pending  map[string]int // diverted events not yet parked, by aggregate
}

// maxBlocked is the most aggregates the gate holds in memory (~1 MiB);
// past it, the chunks' other aggregates are looked up in the retry table.
const maxBlocked = 10_000

func newGate(store retryTable, log *slog.Logger) *gate {
	return &gate{store: store, log: log, max: maxBlocked, blocked: map[string]struct{}{}, pending: map[string]int{}}
}

// load rebuilds the set from the table, at start.
func (g *gate) load(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, err := g.reloadLocked(ctx)
	if err != nil {
		return err
	}
	if g.overflow {
		g.log.Info("aggregates waiting in the retry table: their new events queue behind them; more of them than the relay holds in memory, so it asks the table about the others",
			"aggregates_at_least", n, "held_in_memory", g.max)
	} else if n > 0 {
		g.log.Info("aggregates waiting in the retry table: their new events queue behind them", "aggregates", n)
	}
	return nil
}

// reloadLocked reads the blocked set from the table: up to max aggregates,
// and overflow if there are more. It returns how many it read (max + 1
// when more wait). g.mu must be held: no park runs meanwhile, so the set
// holds every aggregate with a row (rows the worker deletes meanwhile
// leave an aggregate blocked until a release finds them gone).
func (g *gate) reloadLocked(ctx context.Context) (int, error) {
	aggs, err := g.store.Aggregates(ctx, g.max+1)
	if err != nil {
		return 0, fmt.Errorf("read blocked aggregates from the retry table: %w", err)
	}
	n := len(aggs)
	g.overflow = n > g.max
	aggs = aggs[:min(n, g.max)]
	g.blocked = make(map[string]struct{}, len(aggs))
	for _, a := range aggs {
		g.blocked[a] = struct{}{}
	}
	return n, nil
}

// closed reports whether any aggregate may be blocked: when none is, a chunk
// without route failures goes to Kafka whole, without divert.
func (g *gate) closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.blocked) > 0 || len(g.pending) > 0 || g.overflow
}

// holds reports whether agg may be blocked: it has rows in the retry table,
// or, in overflow, the gate does not know that it has none.
func (g *gate) holds(agg string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.blocked[agg]
	return ok || g.pending[agg] > 0 || g.overflow
}

// blockLocked adds agg to the blocked set, or, when the set is full,
// records that the table holds more than the set (overflow).
func (g *gate) blockLocked(agg string) {
	if _, ok := g.blocked[agg]; ok {
		return
	}
	if len(g.blocked) >= g.max {
		if !g.overflow {
			g.log.Info("more aggregates have events waiting in the retry table than the relay holds in memory: it asks the table about the others, a query per chunk of events read, until they are delivered",
				"held_in_memory", g.max)
		}
		g.overflow = true
		return
	}
	g.blocked[agg] = struct{}{}
}

// inTable asks the table which aggregates of c the gate does not hold have
// rows: in overflow the set is partial. sweepPage aggregates a query. g.mu
// must be held. It returns nil when not in overflow.
func (g *gate) inTable(ctx context.Context, c *chunk) (map[string]bool, error) {
	if !g.overflow {
		return nil, nil
	}
	seen := map[string]bool{}
	var ask []string
	note := func(agg string) {
		_, held := g.blocked[agg]
		if _, dup := seen[agg]; held || dup || g.pending[agg] > 0 {
			return
		}
		seen[agg] = false
		ask = append(ask, agg)
	}
	for i := range c.evs {
		note(c.evs[i].Lane().String())
	}
	for len(ask) > 0 {
		n := min(len(ask), sweepPage)
		left, err := g.store.Undelivered(ctx, ask[:n])
		if err != nil {
			return nil, fmt.Errorf("read the retry table for %d aggregates that may have events waiting there: %w", n, err)
		}
		for _, a := range ask[:n] {
			seen[a] = left[a]
		}
		ask = ask[n:]
	}
	return seen, nil
}

// diverted is an event bound for the retry table, with its place in the chunk.
type diverted struct {
	place int // 2*i+1 for c.evs[i]; 2*before for a route failure
	ev    retry.Event
	held  string // the aggregate divert counted it under in gate.pending, until park; "" for none
}

// divert splits c into the events to write now and the events that go to
// the retry table: route failures, and every event of an aggregate that is
// blocked (before this chunk, or by an event diverted and not yet parked, in
// this chunk or an earlier one). It returns the index in c.evs of every event
// to write. Each diverted event holds its aggregate (pending) until park
// stores it. In overflow it asks the table first (inTable); an error of that
// changes nothing, and the caller tries again.
func (g *gate) divert(ctx context.Context, c *chunk) (send []event.Event, sendAt []int, out []diverted, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inTable, err := g.inTable(ctx, c)
	if err != nil {
		return nil, nil, nil, err
	}
	blocked := func(agg string) bool {
		_, ok := g.blocked[agg]
		return ok || g.pending[agg] > 0 || inTable[agg]
	}
	fi := 0
	takeFailures := func(upTo int) {
		for ; fi < len(c.fails) && c.fails[fi].before <= upTo; fi++ {
			f := &c.fails[fi]
			ev := failureEvent(f)
			g.pending[ev.Aggregate]++
			out = append(out, diverted{place: 2 * f.before, ev: ev, held: ev.Aggregate})
		}
	}
	for i := range c.evs {
		takeFailures(i)
		m := &c.evs[i]
		if agg := m.Lane().String(); blocked(agg) {
			g.pending[agg]++
			out = append(out, diverted{place: 2*i + 1, ev: waitingEvent(m, "waiting behind an earlier event of the same aggregate in the retry table; delivered after it, in order"), held: agg})
			continue
		}
		send = append(send, *m)
		sendAt = append(sendAt, i)
	}
	takeFailures(len(c.evs))
	return send, sendAt, out, nil
}

// park inserts evs into the retry table, in order, and blocks their
// aggregates, under the lock release takes: once it returns nil the rows are
// durable and their aggregates stay blocked until release finds the rows
// gone. held are the aggregates divert counted evs' diverted events under
// (one per event): stored, they no longer hold them. One attempt: the caller
// retries.
func (g *gate) park(ctx context.Context, evs []retry.Event, held []string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// In pages, in order: a chunk of 10,000 events in one statement held
	// ~30 MB of encoded parameters at once, outside the window. A page
	// stored before a later one failed is stored again as a no-op when the
	// caller retries (Insert is idempotent on the event key), and seq still
	// follows the chunk's order; until every page is stored, divert's
	// pending count keeps the aggregates held.
	for page := evs; len(page) > 0; {
		n := min(len(page), parkPage)
		if err := g.store.Insert(ctx, page[:n]); err != nil {
			return err
		}
		page = page[n:]
	}
	for _, ev := range evs {
		g.blockLocked(ev.Aggregate)
	}
	for _, a := range held {
		if g.pending[a]--; g.pending[a] <= 0 {
			delete(g.pending, a)
		}
	}
	return nil
}

// release unblocks the given aggregates that have no row left in the table:
// the worker's Delivered hook, and a periodic sweep for rows delivered or
// dropped by another process.
func (g *gate) release(ctx context.Context, aggs []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	// An aggregate with events diverted and not yet parked stays: its rows
	// are on their way.
	aggs = slices.DeleteFunc(slices.Clone(aggs), func(a string) bool { _, ok := g.blocked[a]; return !ok || g.pending[a] > 0 })
	if len(aggs) == 0 {
		return
	}
	left, err := g.store.Undelivered(ctx, aggs)
	if err != nil {
		g.log.Warn("check the retry table before unblocking aggregates", "err", err)
		return
	}
	for _, a := range aggs {
		if !left[a] {
			delete(g.blocked, a)
		}
	}
}

// parkPage is the most events park stores with one statement.
const parkPage = 1000

// sweepPage is the most aggregates one sweep query asks about: the table is
// asked page by page, so that 100,000 waiting aggregates cost neither one
// query and answer of them all (an array of every aggregate, a map of the
// answers, ~25 MB) nor the gate's lock held for its whole length, which
// holds up the writer.
const sweepPage = 1000

// sweep releases every blocked aggregate whose rows are gone, every interval,
// asking the table sweepPage aggregates at a time.
func (g *gate) sweep(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.mu.Lock()
		aggs := make([]string, 0, len(g.blocked))
		for a := range g.blocked {
			aggs = append(aggs, a)
		}
		g.mu.Unlock()
		for len(aggs) > 0 && ctx.Err() == nil {
			n := min(len(aggs), sweepPage)
			g.release(ctx, aggs[:n])
			aggs = aggs[n:]
		}
		g.leaveOverflow(ctx)
	}
}

// leaveOverflow reads the set from the table again when in overflow: once it
// holds max aggregates or fewer, the gate holds them all and stops asking
// the table about each chunk.
func (g *gate) leaveOverflow(ctx context.Context) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.overflow || ctx.Err() != nil {
		return
	}
	n, err := g.reloadLocked(ctx)
	if err != nil {
		// Still in overflow, the set as it was: divert asks the table.
		g.log.Warn("read the aggregates waiting in the retry table", "err", err)
		return
	}
	if !g.overflow {
		g.log.Info("the aggregates with events waiting in the retry table are held in memory again", "aggregates", n)
	}
}
