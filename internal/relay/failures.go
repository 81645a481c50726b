package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// gate is the set of aggregates with undelivered rows in the retry table.
// While an aggregate is in it, its events go into the table behind those rows
// instead of to Kafka, so they cannot overtake them (DESIGN invariant 6).
//
// mu serialises the writer's inserts with unblocking: an aggregate is taken
// out only after the table is seen to hold none of its rows, under the same
// lock as every insert, so a row being inserted always keeps it blocked.
type gate struct {
	store *retry.Store
	log   *slog.Logger

	mu      sync.Mutex
	blocked map[string]struct{}
}

// load rebuilds the set from the table, at start.
func (g *gate) load(ctx context.Context) error {
	aggs, err := g.store.Aggregates(ctx)
	if err != nil {
		return fmt.Errorf("read blocked aggregates from the retry table (run \"outbox-relay setup\" if it is missing): %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.blocked = make(map[string]struct{}, len(aggs))
	for _, a := range aggs {
		g.blocked[a] = struct{}{}
	}
	if len(aggs) > 0 {
		g.log.Info("aggregates waiting in the retry table: their new events queue behind them", "aggregates", len(aggs))
	}
	return nil
}

// release unblocks the given aggregates that have no row left in the table:
// the worker's Delivered hook, and a periodic sweep for rows delivered or
// dropped by another process.
func (g *gate) release(ctx context.Context, aggs []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	aggs = slices.DeleteFunc(slices.Clone(aggs), func(a string) bool { _, ok := g.blocked[a]; return !ok })
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

// sweep releases every blocked aggregate whose rows are gone, every interval.
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
		if len(aggs) > 0 {
			g.release(ctx, aggs)
		}
	}
}

// A routeFailure is an event the router refused, carried in its chunk at its
// place among the messages.
type routeFailure struct {
	before int // number of c.msgs before it
	ev     event
	err    error
}

// diverted is an event bound for the retry table, with its place in the chunk.
type diverted struct {
	place int // 2*i+1 for c.msgs[i]; 2*before for a route failure
	ev    retry.Event
}

// divert splits c into the messages to write now and the events that go to
// the retry table: route failures, and every event of an aggregate that is
// blocked (before this chunk, or by a route failure earlier in it). It returns
// the index in c.msgs of every message to write.
func (r *Relay) divert(c *chunk) (send []kafka.Message, sendAt []int, out []diverted) {
	local := map[string]struct{}{}
	r.gate.mu.Lock()
	defer r.gate.mu.Unlock()
	blocked := func(agg string) bool {
		if _, ok := r.gate.blocked[agg]; ok {
			return true
		}
		_, ok := local[agg]
		return ok
	}
	fi := 0
	takeFailures := func(upTo int) {
		for ; fi < len(c.fails) && c.fails[fi].before <= upTo; fi++ {
			f := &c.fails[fi]
			ev := failureEvent(f)
			local[ev.Aggregate] = struct{}{}
			out = append(out, diverted{place: 2 * f.before, ev: ev})
		}
	}
	for i := range c.msgs {
		takeFailures(i)
		m := &c.msgs[i]
		agg := retry.Aggregate(m.Topic, m.Key)
		if blocked(agg) {
			ev := retryEvent(&c.evs[i])
			ev.Aggregate = agg
			ev.Waiting = true
			ev.Reason = "waiting behind an earlier event of the same aggregate in the retry table; delivered after it, in order"
			out = append(out, diverted{place: 2*i + 1, ev: ev})
			continue
		}
		send = append(send, *m)
		sendAt = append(sendAt, i)
	}
	takeFailures(len(c.msgs))
	return send, sendAt, out
}

// failureEvent is the retry row of an event the router refused. Routing
// failures are permanent: the row goes dead at once, for an operator to fix
// the routing config (the worker routes again) or the data, and requeue.
func failureEvent(f *routeFailure) retry.Event {
	ev := retryEvent(&f.ev)
	m := &f.ev.msg
	if m.Topic == "" || m.AggregateID == "" {
		ev.Aggregate = retry.UnroutableAggregate(m.AggregateType, m.AggregateID)
	}
	reason := f.err.Error()
	var re *router.RouteError
	if errors.As(f.err, &re) && re.Reason != "" {
		reason = re.Reason
	}
	ev.Reason = "cannot route the event: " + reason + "; then requeue it"
	ev.Permanent = true
	return ev
}

// retryEvent is the retry row of an event, from its envelope: its identity
// is its place in the WAL and its id column, never its headers. Headers
// holds the headers column's entries only; the worker adds the relay's own
// from the row's columns, as the router does.
func retryEvent(e *event) retry.Event {
	m := &e.msg
	ev := retry.Event{
		EventKey:      retry.PositionKey(e.lsn, e.n),
		EventID:       m.EventID,
		Aggregate:     retry.Aggregate(m.Topic, m.Key),
		AggregateType: m.AggregateType,
		AggregateID:   m.AggregateID,
		EventType:     m.EventType,
		Topic:         m.Topic,
		Key:           m.Key,
		Value:         m.Value,
		SourceLSN:     e.lsn,
		CommitTime:    e.at,
	}
	if len(m.Extra) > 0 {
		ev.Headers = make([]retry.Header, len(m.Extra))
		for i, h := range m.Extra {
			ev.Headers[i] = retry.Header{Key: h.Key, Value: h.Value}
		}
	}
	return ev
}

// refused turns the sink's per-message failures into retry rows. sendAt maps
// send to the chunk's messages; nil when send is all of them.
func refused(we *sink.WriteError, c *chunk, send []kafka.Message, sendAt []int) []diverted {
	out := make([]diverted, 0, len(we.Failures))
	for _, f := range we.Failures {
		i := f.Index
		if sendAt != nil {
			i = sendAt[f.Index]
		}
		ev := retryEvent(&c.evs[i])
		if errors.Is(f.Err, sink.ErrBehind) {
			ev.Waiting = true
			ev.Reason = "waiting behind an earlier event of the same aggregate that Kafka refused; delivered after it, in order"
		} else {
			ev.Reason = retry.SinkReason(f.Err, send[f.Index])
			ev.Permanent = sink.Permanent(f.Err)
		}
		out = append(out, diverted{place: 2*i + 1, ev: ev})
	}
	return out
}

// park writes the diverted events to the retry table, in chunk order, and
// blocks their aggregates. It retries until the rows are durable or ctx is
// done: their LSN must not be confirmed before.
func (r *Relay) park(ctx context.Context, ds []diverted) error {
	slices.SortFunc(ds, func(a, b diverted) int { return cmp.Compare(a.place, b.place) })
	evs := make([]retry.Event, len(ds))
	for i, d := range ds {
		evs[i] = d.ev
	}
	err := persist(ctx, r.log, fmt.Sprintf("write %d events to the retry table (nothing after them is confirmed until they are stored)", len(evs)), r.health.watch("retry_table", func() error {
		r.gate.mu.Lock()
		defer r.gate.mu.Unlock()
		if err := r.gate.store.Insert(ctx, evs); err != nil {
			return err
		}
		for _, ev := range evs {
			r.gate.blocked[ev.Aggregate] = struct{}{}
		}
		return nil
	}))
	if err != nil {
		return err
	}
	r.logParked(evs)
	return nil
}

// logParked logs failures (not waiting events) once per chunk, with the first
// reason: a line per failed event would flood the log on a bad deploy.
func (r *Relay) logParked(evs []retry.Event) {
	failed, first := 0, -1
	for i, ev := range evs {
		if !ev.Waiting {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed == 0 {
		return
	}
	for _, ev := range evs {
		if !ev.Waiting {
			r.m.Topic(ev.Topic).Failed(1)
		}
	}
	ev := evs[first]
	r.log.Warn("events could not be delivered: written to the retry table",
		"failed", failed, "waiting_behind", len(evs)-failed, "first_event_id", ev.EventID,
		"first_aggregate", ev.Aggregate, "first_reason", ev.Reason, "dead_at_once", ev.Permanent)
}
