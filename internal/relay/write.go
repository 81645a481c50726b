package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/eos"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A writer sends chunks to Kafka in order, diverts to the retry table what
// must not or could not go (route failures, events of blocked lanes, events
// Kafka refused), and hands every chunk to the committer once each of its
// events is acknowledged or stored. One writer, finishing chunks in order, is
// what keeps the acknowledged prefix contiguous.
//
// Up to depth chunks are sent before the first of them is finished, while
// they hold less than bulk bytes (sink.Kafka writes them in the order of the
// Sends, one round at a time: sink/pipeline.go): sending ahead lets the
// route stage go on while Kafka answers; on a backlog chunks grow large, one
// in flight keeps the broker busy, and more would only cut the next chunks
// smaller (more requests for the same events) and hold more memory. A
// chunk is
// finished (its failures parked, then acknowledged to the committer) only
// after every chunk before it. A chunk sent before an earlier one's failures
// were parked was diverted without them: the sink fails its events of those
// lanes with sink.ErrBehind, and they are parked behind the failures.
type writer struct {
	sink   eventSink
	gate   *gate
	win    *window
	health *health
	log    *slog.Logger
	m      *metrics.Metrics
	fence  leader.Fence // asked before every write
	spans  SpanExporter // nil: no spans
	depth  int          // chunks sent and not yet finished, at most; 0 means 1
	bulk   int          // bytes of chunks sent and not yet finished above which no more are sent
	eos    *eos.Session // nil: at least once
	stages io.Writer    // nil: no stage trace (Config.StageTrace, stages.go)
	// buffer, when set, takes every chunk instead of the sink: a
	// buffering term's writer (walbuffer.go).
	buffer interface {
		Append(ctx context.Context, entries []walbuffer.Entry) error
	}
}

// writerEnds are what a writer writes through: the sink, the gate that
// parks the events of blocked lanes, and the fence asked before every write.
type writerEnds struct {
	sink  eventSink
	gate  *gate
	fence leader.Fence
}

// writerRole is what sets one writer apart from another: the stream's
// pipeline, a WAL buffer's drain and the refill each build theirs with
// newWriter and say here which of the Config's delivery settings they take.
type writerRole struct {
	// inFlight: up to Sink.MaxInFlight chunks of under Sink.BatchBytes sent
	// before the first is finished; without it, one chunk at a time.
	inFlight bool
	// traced: spans (Config.Spans) and the stage trace (Config.StageTrace),
	// both of an event's way from its commit in the WAL to its ack; only
	// the stream's pipeline reads events from the WAL as they commit.
	traced bool
	eos    *eos.Session // nil: at least once
}

// newWriter returns a writer of cfg's window size, health and logging,
// writing through ends, with what role takes of the Config.
func newWriter(cfg Config, ends writerEnds, win *window, h *health, role writerRole) *writer {
	w := &writer{sink: ends.sink, gate: ends.gate, fence: ends.fence, win: win, health: h,
		log: cfg.Logger, m: cfg.Metrics, eos: role.eos}
	if role.inFlight {
		w.depth, w.bulk = cfg.Sink.MaxInFlight, int(cfg.Sink.BatchBytes)
	}
	if role.traced {
		w.spans, w.stages = cfg.Spans, cfg.StageTrace
	}
	return w
}

// sent is a chunk on its way: what went to the sink, and what is parked.
type sent struct {
	c      *chunk
	send   []event.Event
	sendAt []int // nil: send is c.evs
	parked []diverted
	cp     *event.Event  // exactly-once's checkpoint record, sent last; nil: none
	d      sink.Delivery // nil: nothing sent
}

// run writes the chunks of in until it is closed, then closes com. It
// returns ctx's error, or an error that is not one event's (the caller
// stops). With exactly-once delivery (eos) it first takes the transactional
// id and writes each chunk as deliverExactlyOnce does.
func (r *writer) run(ctx context.Context, in <-chan *chunk, com acker) error {
	if r.buffer != nil {
		if r.eos != nil {
			r.eos.Buffering()
		}
		return r.runBuffer(ctx, in, com)
	}
	if r.eos != nil {
		return r.runExactlyOnce(ctx, in, com)
	}
	var queue []*sent
	held := 0 // bytes of the chunks in queue
	defer func() {
		if len(queue) > 0 {
			r.sink.Abandon()
		}
	}()
	depth := max(r.depth, 1)
	for in != nil || len(queue) > 0 {
		// A chunk whose answers are in is finished first: that frees the
		// window and lets the committer confirm as early as possible.
		if len(queue) > 0 {
			select {
			case <-queue[0].done():
				held -= queue[0].c.bytes
				if err := r.finish(ctx, queue[0], com); err != nil {
					return err
				}
				queue = queue[1:]
				continue
			default:
			}
		}
		var inCh <-chan *chunk
		if len(queue) == 0 || len(queue) < depth && held < r.bulk {
			inCh = in
		}
		var doneCh <-chan struct{}
		if len(queue) > 0 {
			doneCh = queue[0].done()
			if inCh == nil {
				// Nothing else to do: Wait blocks until the answers are in
				// and writes again what failed.
				doneCh = closedCh
			}
		}
		select {
		case c, ok := <-inCh:
			if !ok {
				in = nil
				continue
			}
			r.took(c)
			s, err := r.start(ctx, c, nil)
			if err != nil {
				return err
			}
			queue = append(queue, s)
			held += c.bytes
		case <-doneCh:
			held -= queue[0].c.bytes
			if err := r.finish(ctx, queue[0], com); err != nil {
				return err
			}
			queue = queue[1:]
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	com.close()
	return nil
}

// runExactlyOnce is run with exactly-once delivery: chunk after chunk, each
// in a Kafka transaction committed before the next is written (package eos).
func (r *writer) runExactlyOnce(ctx context.Context, in <-chan *chunk, com acker) error {
	if err := r.eos.Start(ctx, r.fence); err != nil {
		return err
	}
	for c := range in {
		r.took(c)
		send, parked, err := deliverExactlyOnce(ctx, r.eos, r, c)
		if err != nil {
			return err
		}
		r.done(c, send, parked, com)
	}
	if err := r.eos.Close(ctx); err != nil {
		return err
	}
	com.close()
	return nil
}

// took stamps when the writer took c from the route stage, for the stage
// trace.
func (r *writer) took(c *chunk) {
	if r.stages != nil {
		c.tookAt = time.Now()
	}
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (s *sent) done() <-chan struct{} {
	if s.d == nil {
		return closedCh
	}
	return s.d.Done()
}

// start diverts what must not go to Kafka and sends the rest, and cp, when
// not nil, last (exactly-once's checkpoint record).
func (r *writer) start(ctx context.Context, c *chunk, cp *event.Event) (*sent, error) {
	s := &sent{c: c, send: c.evs, cp: cp}
	if len(c.fails) > 0 || r.gate.closed() {
		// Only with more aggregates waiting than the gate holds does
		// divert read the table, and fail with it.
		err := backoff.Persist(ctx, r.log, "read the retry table for aggregates with events waiting there (nothing of them is sent before)", r.health.watch("retry_table", func() (err error) {
			s.send, s.sendAt, s.parked, err = r.gate.divert(ctx, c)
			return err
		}))
		if err != nil {
			return nil, err
		}
	}
	if len(s.send) > 0 || len(s.parked) > 0 || cp != nil {
		// A write only while leading, proven within the lease: a
		// former leader that wakes up learns here that it lost.
		if err := r.fence.Check(ctx); err != nil {
			return nil, err
		}
	}
	if out := s.send; len(out) > 0 || cp != nil {
		if cp != nil {
			out = append(out[:len(out):len(out)], *cp)
		}
		if r.stages != nil {
			c.sentAt = time.Now()
		}
		s.d = r.sink.Send(ctx, out)
	}
	return s, nil
}

// land waits for a sent chunk's acknowledgements and parks what Kafka
// refused, and returns the events Kafka acknowledged and how many were
// parked: every event of the chunk is then acknowledged or stored. The
// checkpoint record's refusal is an error.
func (r *writer) land(ctx context.Context, s *sent) (acked []event.Event, parked int, _ error) {
	send := s.send
	if s.d != nil {
		n := len(send)
		if s.cp != nil {
			n++
		}
		r.health.waitFor("Kafka to acknowledge %d events", n)
		if err := s.d.Wait(ctx); err != nil {
			var we *sink.WriteError
			if !errors.As(err, &we) {
				return nil, 0, fmt.Errorf("write to kafka: %w", err)
			}
			if last := we.Failures[len(we.Failures)-1]; s.cp != nil && last.Index == len(send) {
				return nil, 0, fmt.Errorf("write the checkpoint record to Kafka topic %s: %s", s.cp.Topic, last.Reason)
			}
			s.parked = append(s.parked, refused(we, send, s.sendAt)...)
			send = acknowledged(send, we)
		}
	}
	if len(s.parked) > 0 {
		// Durable in the retry table before the chunk's LSN can be
		// confirmed (with exactly-once, before the commit that covers
		// it): the table is where these events now live.
		r.health.waitFor("the retry table to store %d events", len(s.parked))
		if err := r.park(ctx, s.parked); err != nil {
			return nil, 0, err
		}
	}
	return send, len(s.parked), nil
}

// deliver writes a chunk (start) and waits for it (land): exactly-once's
// writes, one at a time inside a Kafka transaction.
func (r *writer) deliver(ctx context.Context, c *chunk, cp *event.Event) (acked []event.Event, parked int, err error) {
	s, err := r.start(ctx, c, cp)
	if err != nil {
		return nil, 0, err
	}
	return r.land(ctx, s)
}

// finish lands a sent chunk and hands it to com.
func (r *writer) finish(ctx context.Context, s *sent, com acker) error {
	send, parked, err := r.land(ctx, s)
	if err != nil {
		return err
	}
	r.done(s.c, send, parked, com)
	return nil
}

// done hands a chunk whose events are all acknowledged or stored to com.
func (r *writer) done(c *chunk, send []event.Event, parked int, com acker) {
	r.win.giveBytes(c.windowBytes())
	com.ack(c)
	r.health.progress()
	if r.m != nil && len(send) > 0 {
		r.observe(c, send, parked)
	}
	if r.spans != nil && len(send) > 0 {
		r.spans.Delivered(send, time.Now())
	}
	if r.stages != nil && parked == 0 && len(send) > 0 {
		writeStages(r.stages, c, len(send), time.Now())
	}
	// Nothing reads c's events any more: the sink copied what it
	// sends, the retry table what it stores (their bytes are the
	// rows', which stay untouched).
	r.win.recycle(c.evs)
	c.evs = nil
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
	ev.Reason = "cannot route the event: " + routeReason(f.err) + "; then requeue it"
	ev.Code = routeCode(f.err)
	ev.Permanent = true
	return ev
}

// routeReason is what a router's refusal says is wrong.
func routeReason(err error) string {
	var re *router.RouteError
	if errors.As(err, &re) && re.Reason != "" {
		return re.Reason
	}
	return err.Error()
}

// routeCode is the code of a router's refusal, "" when it gave none.
func routeCode(err error) string {
	var re *router.RouteError
	if errors.As(err, &re) {
		return re.Code
	}
	return ""
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
			ev.Reason, ev.Code, ev.Permanent = f.Reason, f.Code, f.Permanent
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
	var held []string
	for i, d := range ds {
		evs[i] = d.ev
		if d.held != "" {
			held = append(held, d.held)
		}
	}
	err := backoff.Persist(ctx, r.log, fmt.Sprintf("write %d events to the retry table (nothing after them is confirmed until they are stored)", len(evs)), r.health.watch("retry_table", func() error {
		return r.gate.park(ctx, evs, held)
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
