package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/source"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// routeStage turns the stream's batches into chunks of routed events, in
// commit order, taking the window for what it reads.
type routeStage struct {
	// shapes route the changes the stream delivers: each change goes to
	// the first that takes it (internal/source).
	shapes         []source.Shape
	win            *window
	maxMsgs        int // events per chunk
	maxBytes       int // bytes per chunk
	log            *slog.Logger
	m              *metrics.Metrics
	lastBadHeaders time.Time
	lastBadTrace   time.Time
	trace          bool // chunks carry their stage times (Config.StageTrace)
}

// run turns batches into chunks until in is closed, ctx is done, or stop is
// closed; it stops reading on stop only at a transaction boundary, so a clean
// shutdown leaves no transaction half-delivered. It closes out when it
// returns. A *router.SchemaError, and an insert the placer cannot place
// (*placement.Error), stop it before the event, after handing on the chunk
// of what came before: nothing from that event on is confirmed, and what
// came before can be.
func (r *routeStage) run(ctx context.Context, stop <-chan struct{}, in <-chan replication.Batch, out chan<- *chunk) error {
	defer close(out)
	l := &routeLoop{r: r, ctx: ctx, out: out}
	l.cur = l.newChunk()
	for {
		b, stopped, err := l.next(stop, in)
		if stopped || err != nil {
			return err
		}
		if r.trace {
			l.batchAt = time.Now()
		}
		if err := l.take(&b); err != nil {
			return err
		}
		if err := l.route(&b); err != nil {
			return err
		}
	}
}

// routeLoop is one run of the route stage: the chunk it fills and where it
// is in the transaction being read.
type routeLoop struct {
	r      *routeStage
	ctx    context.Context
	out    chan<- *chunk
	cur    *chunk
	inTxn  bool
	txnRow int // position of the next row in its transaction, for retry keys
	// batchAt is when the batch being routed was taken, while tracing.
	batchAt time.Time
}

func (l *routeLoop) newChunk() *chunk {
	evs := l.r.win.spareEvents()
	if evs == nil {
		evs = make([]event.Event, 0, min(l.r.maxMsgs, 1024))
	}
	return &chunk{evs: evs}
}

// flush hands on what is held, waiting for the writer to take it.
func (l *routeLoop) flush() error {
	if l.cur.empty() {
		return nil
	}
	select {
	case l.out <- l.cur:
		l.cur = l.newChunk()
		return nil
	case <-l.ctx.Done():
		return l.ctx.Err()
	}
}

// stopBefore hands on what came before the event at position pos of b's
// transaction, so that the caller can drain and confirm it as at a clean
// stop (a restart then resends at most this transaction's earlier events),
// and returns the *stopError that stops before the event.
func (l *routeLoop) stopBefore(b *replication.Batch, pos int, err error) error {
	if err := l.flush(); err != nil {
		return err
	}
	return &stopError{err: fmt.Errorf("stopped before the event at position %d of the transaction committed at %s, so that nothing from it on is confirmed: %w",
		pos, b.CommitLSN, err), lsn: b.CommitLSN}
}

// next returns the next batch, handing on what is held meanwhile. On stop
// (only between transactions: the open one is finished first) it hands on
// what it holds and returns stopped, with flush's error.
func (l *routeLoop) next(stop <-chan struct{}, in <-chan replication.Batch) (b replication.Batch, stopped bool, err error) {
	for {
		stopCh := stop
		if l.inTxn {
			stopCh = nil // finish the open transaction first
		}
		// What we hold goes to the writer as soon as it takes it, and
		// batches that arrive meanwhile join it: with out unbuffered, a
		// busy writer makes chunks grow (fewer, larger Kafka writes), an
		// idle one gets each batch at once (latency).
		var outCh chan<- *chunk
		if !l.cur.empty() {
			outCh = l.out
			// A batch already waiting joins what we hold before the writer
			// is offered it: select picks at random among ready cases, and
			// a stream that reads several small transactions at once would
			// otherwise hand them on one chunk (one produce request) each.
			select {
			case b = <-in:
				return b, false, nil
			default:
			}
		}
		select {
		case b = <-in:
			return b, false, nil
		case outCh <- l.cur:
			l.cur = l.newChunk()
		case <-stopCh:
			return b, true, l.flush()
		case <-l.ctx.Done():
			return b, false, l.ctx.Err()
		}
	}
}

// take takes the window's share for b's rows, handing on what is held
// before it waits, since what we hold counts against the window.
func (l *routeLoop) take(b *replication.Batch) error {
	charge := b.Bytes + len(b.Rows)*eventOverhead
	if l.r.win.tryTake(len(b.Rows), charge, l.inTxn) {
		return nil
	}
	if err := l.flush(); err != nil {
		return err
	}
	return l.r.win.take(l.ctx, len(b.Rows), charge, l.inTxn)
}

// route routes b's rows into the chunk, handing it on when full, and marks
// where its transaction ends.
func (l *routeLoop) route(b *replication.Batch) error {
	r := l.r
	if !l.inTxn {
		l.txnRow = 0
	}
	for i := range b.Rows {
		if err := l.routeRow(b, &b.Rows[i]); err != nil {
			return err
		}
	}
	for _, sh := range r.shapes {
		sh.Counted()
	}
	l.inTxn = !b.Last
	if b.Last {
		cur := l.cur // the chunk the transaction ends in
		cur.endLSN = b.EndLSN
		cur.commitTime = b.CommitTime
		cur.covered += cur.trailing
		cur.trailing = 0
	}
	return nil
}

// routeRow routes one row of b into the chunk: its event, or its failure
// to the retry table in its place, or nothing for a table that is no
// outbox; a schema or placement error stops before it.
func (l *routeLoop) routeRow(b *replication.Batch, row *replication.Row) error {
	r, cur := l.r, l.cur
	cur.trailing++
	cur.bytes += row.Size()
	cur.rows++
	l.txnRow++
	m, ok, err := r.routeChange(l.ctx, row)
	var pe *placement.Error
	if errors.As(err, &pe) {
		r.m.PlacementStop()
		return l.stopBefore(b, l.txnRow, err)
	}
	if !ok {
		return err // no event (counted by its shape), or its lookup failed
	}
	r.headerTrouble(&m)
	m.CommitLSN, m.CommitTime, m.Pos = b.CommitLSN, b.CommitTime, l.txnRow
	if err != nil {
		var re *router.RouteError
		if !errors.As(err, &re) {
			var se *router.SchemaError
			if errors.As(err, &se) {
				r.m.SchemaStop()
				return l.stopBefore(b, l.txnRow, err)
			}
			return fmt.Errorf("route event of transaction %d committed at %s: %w", b.Xid, b.CommitLSN, err)
		}
		// Not this relay's to drop nor to stop for: the event goes to the
		// retry table, in its place.
		cur.fails = append(cur.fails, routeFailure{before: len(cur.evs), ev: m.Event, err: err})
		return nil
	}
	if r.trace && cur.readAt.IsZero() {
		cur.readAt = l.batchAt
	}
	cur.evs = append(cur.evs, m.Event)
	cur.addCommit(b.CommitLSN, b.CommitTime)
	if len(cur.evs) >= r.maxMsgs || cur.bytes >= r.maxBytes {
		return l.flush()
	}
	return nil
}

// routeChange routes row with the first shape that takes it. A change no
// shape takes stops the relay before it: the stream delivered something the
// configuration did not ask for, and skipping it could lose an event.
func (r *routeStage) routeChange(ctx context.Context, row *replication.Row) (router.Message, bool, error) {
	for _, sh := range r.shapes {
		if sh.Takes(row) {
			return sh.Route(ctx, row)
		}
	}
	return router.Message{}, false, errors.New("the stream delivered a change no source of the relay takes (a logical decoding message while outbox.source reads tables only?): a bug, please report it; nothing from it on was confirmed")
}

// A stopError stops the relay before an event that must not be confirmed
// past (the outbox changed, or an insert cannot be placed): what came before
// it is drained and its checkpoint saved, as at a clean stop, so that a
// restart after the fix resends nothing already delivered. lsn is the
// commit LSN of the transaction it stopped in.
type stopError struct {
	err error
	lsn pglogrepl.LSN
}

func (e *stopError) Error() string { return e.err.Error() }
func (e *stopError) Unwrap() error { return e.err }

// headerTrouble counts what the router left out of an event's headers and
// warns about a headers value it ignored, at most once every ten seconds:
// the event is delivered all the same, so a line per event would only flood
// the log.
func (r *routeStage) headerTrouble(m *router.Message) {
	if m.DroppedHeaders > 0 {
		r.m.HeadersDropped(m.DroppedHeaders)
	}
	if m.BadTrace != "" {
		r.m.TraceContextInvalid()
		if now := time.Now(); now.Sub(r.lastBadTrace) >= 10*time.Second {
			r.lastBadTrace = now
			r.log.Warn("trace context ignored: event delivered without it",
				"event_id", m.ID, "aggregate_type", m.AggregateType, "reason", m.BadTrace)
		}
	}
	if m.BadHeaders == "" {
		return
	}
	r.m.HeadersInvalid()
	if now := time.Now(); now.Sub(r.lastBadHeaders) >= 10*time.Second {
		r.lastBadHeaders = now
		r.log.Warn("headers column ignored: event delivered without its extra headers",
			"event_id", m.ID, "aggregate_type", m.AggregateType, "reason", m.BadHeaders)
	}
}
