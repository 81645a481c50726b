package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A writer sends chunks to Kafka in order, diverts to the retry table what
// must not or could not go (route failures, events of blocked lanes, events
// Kafka refused), and hands every chunk to the committer once each of its
// events is acknowledged or stored. One writer, writing chunks in order, is
// what keeps the acknowledged prefix contiguous.
type writer struct {
	sink   eventSink
	gate   *gate
	win    *window
	health *health
	log    *slog.Logger
	m      *metrics.Metrics
	fence  fence        // asked before every write
	spans  SpanExporter // nil: no spans
	eos    *eos         // nil: at least once
}

// run writes the chunks of in until it is closed, then closes com. It
// returns ctx's error, or an error that is not one event's (the caller
// stops). With exactly-once delivery (eos) it first takes the transactional
// id and writes each chunk as eos.deliver does.
func (r *writer) run(ctx context.Context, in <-chan *chunk, com acker) error {
	if r.eos != nil {
		if err := r.eos.start(ctx, r.fence); err != nil {
			return err
		}
	}
	for c := range in {
		var send []event.Event
		var parked int
		var err error
		if r.eos != nil {
			send, parked, err = r.eos.deliver(ctx, r, c)
		} else {
			send, parked, err = r.deliver(ctx, c, nil)
		}
		if err != nil {
			return err
		}
		r.win.giveBytes(c.bytes)
		com.ack(c)
		r.health.progress()
		if r.m != nil && len(send) > 0 {
			r.observe(c, send, parked)
		}
		if r.spans != nil && len(send) > 0 {
			r.spans.Delivered(send, time.Now())
		}
		// Nothing reads c's events any more: the sink copied what it
		// sends, the retry table what it stores (their bytes are the
		// rows', which stay untouched).
		r.win.recycle(c.evs)
		c.evs = nil
	}
	if r.eos != nil {
		if err := r.eos.close(ctx); err != nil {
			return err
		}
	}
	com.close()
	return nil
}

// deliver writes the events of c that go to Kafka and parks in the retry
// table those that must not or could not go, and returns the events Kafka
// acknowledged and how many were parked: every event of c is then
// acknowledged or stored. cp, when not nil, is written last in the same
// Write (exactly-once's checkpoint record); its refusal is an error.
func (r *writer) deliver(ctx context.Context, c *chunk, cp *event.Event) (sent []event.Event, parked int, err error) {
	send, sendAt := c.evs, []int(nil) // sendAt nil: send is c.evs
	var ds []diverted
	if len(c.fails) > 0 || r.gate.closed() {
		send, sendAt, ds = r.gate.divert(c)
	}
	if len(send) > 0 || len(ds) > 0 || cp != nil {
		// A write only while leading, proven within the lease: a
		// former leader that wakes up learns here that it lost.
		if err := r.fence.check(ctx); err != nil {
			return nil, 0, err
		}
	}
	if len(send) > 0 || cp != nil {
		out := send
		if cp != nil {
			out = append(send[:len(send):len(send)], *cp)
		}
		r.health.waitFor("Kafka to acknowledge %d events", len(out))
		if err := r.sink.Write(ctx, out); err != nil {
			var we *sink.WriteError
			if !errors.As(err, &we) {
				return nil, 0, fmt.Errorf("write to kafka: %w", err)
			}
			if last := we.Failures[len(we.Failures)-1]; cp != nil && last.Index == len(send) {
				return nil, 0, fmt.Errorf("write the checkpoint record to Kafka topic %s: %s", cp.Topic, last.Reason)
			}
			ds = append(ds, refused(we, send, sendAt)...)
			send = acknowledged(send, we)
		}
	}
	if len(ds) > 0 {
		// Durable in the retry table before the chunk's LSN can be
		// confirmed (with exactly-once, before the commit that covers
		// it): the table is where these events now live.
		r.health.waitFor("the retry table to store %d events", len(ds))
		if err := r.park(ctx, ds); err != nil {
			return nil, 0, err
		}
	}
	return send, len(ds), nil
}

// acknowledged returns the events of send that we does not list.
func acknowledged(send []event.Event, we *sink.WriteError) []event.Event {
	out := make([]event.Event, 0, len(send)-len(we.Failures))
	f := 0
	for i := range send {
		if f < len(we.Failures) && we.Failures[f].Index == i {
			f++
			continue
		}
		out = append(out, send[i])
	}
	return out
}

// observe records an acknowledged chunk: per-topic counts, batch size and
// commit-to-ack latency. Per chunk, not per event, except for counting.
func (r *writer) observe(c *chunk, sent []event.Event, parked int) {
	now := time.Now()
	r.m.ObserveBatch(len(sent))
	if parked == 0 {
		// The latency of events that went to the retry table is not a
		// delivery latency; only a clean chunk is observed run by run.
		for _, run := range c.commits {
			r.m.ObserveDelivery(run.at, now, run.n)
		}
	}
	for i := 0; i < len(sent); {
		topic := sent[i].Topic
		j := i + 1
		for j < len(sent) && sent[j].Topic == topic {
			j++
		}
		r.m.Topic(topic).Delivered(j - i)
		i = j
	}
	r.m.SetInFlight(r.win.usage())
}

// failureEvent is the retry row of an event the router refused. Routing
// failures are permanent: the row goes dead at once, for an operator to fix
// the routing config (the worker routes again) or the data, and requeue.
func failureEvent(f *routeFailure) retry.Event {
	ev := retry.NewEvent(&f.ev)
	reason := f.err.Error()
	var re *router.RouteError
	if errors.As(f.err, &re) && re.Reason != "" {
		reason = re.Reason
	}
	ev.Reason = "cannot route the event: " + reason + "; then requeue it"
	ev.Permanent = true
	return ev
}

// waitingEvent is the retry row of an event that waits behind an earlier
// event of its aggregate: delivered after it, never on its own.
func waitingEvent(e *event.Event, reason string) retry.Event {
	ev := retry.NewEvent(e)
	ev.Waiting, ev.Reason = true, reason
	return ev
}

// refused turns the sink's per-event failures into retry rows. sendAt maps
// send to the chunk's events; nil when send is all of them.
func refused(we *sink.WriteError, send []event.Event, sendAt []int) []diverted {
	out := make([]diverted, 0, len(we.Failures))
	for _, f := range we.Failures {
		i := f.Index
		if sendAt != nil {
			i = sendAt[f.Index]
		}
		e := &send[f.Index]
		var ev retry.Event
		if errors.Is(f.Err, sink.ErrBehind) {
			ev = waitingEvent(e, "waiting behind an earlier event of the same aggregate that Kafka refused; delivered after it, in order")
		} else {
			// What the failure means is the sink's to say.
			ev = retry.NewEvent(e)
			ev.Reason, ev.Permanent = f.Reason, f.Permanent
		}
		out = append(out, diverted{place: 2*i + 1, ev: ev})
	}
	return out
}

// park writes the diverted events to the retry table, in chunk order, and
// blocks their aggregates (gate.park). It retries until the rows are durable or ctx is
// done: their LSN must not be confirmed before.
func (r *writer) park(ctx context.Context, ds []diverted) error {
	slices.SortFunc(ds, func(a, b diverted) int { return cmp.Compare(a.place, b.place) })
	evs := make([]retry.Event, len(ds))
	for i, d := range ds {
		evs[i] = d.ev
	}
	err := persist(ctx, r.log, fmt.Sprintf("write %d events to the retry table (nothing after them is confirmed until they are stored)", len(evs)), r.health.watch("retry_table", func() error {
		return r.gate.park(ctx, evs)
	}))
	if err != nil {
		return err
	}
	r.logParked(evs)
	return nil
}

// logParked logs failures (not waiting events) once per chunk, with the first
// reason: a line per failed event would flood the log on a bad deploy.
func (r *writer) logParked(evs []retry.Event) {
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
