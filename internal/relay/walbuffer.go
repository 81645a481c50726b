package relay

// The WAL buffer's wiring (package walbuffer has the mode, its table and its
// drain, and their invariants): which mode a term leads in, the watch that
// switches a live term to buffering, the writer that appends to the buffer
// instead of Kafka, and the drain through the live writer.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// A termMode is how a term delivers.
type termMode int

const (
	// modeLive: the pipeline writes to Kafka (the buffer is empty).
	modeLive termMode = iota
	// modeBuffering: the pipeline appends to the buffer, a drainer
	// delivers it beside.
	modeBuffering
	// modeDrainFirst: the buffer is drained to its end before the stream
	// starts, then the term is live.
	modeDrainFirst
)

func (m termMode) String() string {
	switch m {
	case modeBuffering:
		return "buffering"
	case modeDrainFirst:
		return "draining before streaming live"
	}
	return "live"
}

// blockedAfter is how long the confirmed position must stand still (or
// Kafka be unreachable) before a live term counts as blocked.
const blockedAfter = 5 * time.Second

// A switchError ends a term to lead again at once in another mode, from the
// checkpoint.
type switchError struct {
	to  termMode
	why string
}

func (e *switchError) Error() string { return fmt.Sprintf("switching to %s: %s", e.to, e.why) }

// bufferOn reports whether the bound applies: set. (With exactly-once
// delivery too: the buffered range is delivered at least once, see
// eosbuffer.go.)
func (r *Relay) bufferOn() bool {
	return r.cfg.MaxRetainedWAL > 0
}

// openBuffer returns the slot's buffer store, the table created when
// missing; nil when the bound is off. A table that cannot be created turns
// the bound off for this term, with a warning (the relay then holds the slot
// as without it).
func (r *Relay) openBuffer(ctx context.Context, pool *pgxpool.Pool) (*walbuffer.Store, error) {
	if !r.bufferOn() {
		return nil, nil
	}
	t, err := walbuffer.TableFor(r.cfg.RetryTable)
	if err != nil {
		return nil, err
	}
	s, err := walbuffer.NewStore(pool, t, r.cfg.Replication.Slot)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		if unreachable(err) {
			return nil, err
		}
		r.log.Warn("cannot create the WAL buffer table: postgres.max_retained_wal does not apply until it exists (setup creates it)", "table", t.String(), "err", err)
		return nil, nil
	}
	return s, nil
}

// bufferTerm is a term's part of the WAL buffer: how it delivers, the slot's
// buffer (nil when off), and, while buffering, the signal to stop at a
// transaction boundary and lead again draining first.
type bufferTerm struct {
	mode   termMode
	buffer *walbuffer.Store
	toLive chan struct{}
	once   sync.Once
	began  time.Time // when the term began to lead
}

// minBuffering is the least a buffering term lasts before it leaves
// buffering: a broker that flaps does not make the relay switch each time.
const minBuffering = 10 * time.Second

func (r *Relay) newBufferTerm(ctx context.Context, buf *walbuffer.Store) (bufferTerm, error) {
	mode, err := r.termMode(ctx, buf)
	return bufferTerm{mode: mode, buffer: buf, toLive: make(chan struct{})}, err
}

// appendTo is the store the pipeline's writer appends to: the buffer while
// buffering, else nil (Kafka).
func (b *bufferTerm) appendTo() *walbuffer.Store {
	if b.mode == modeBuffering {
		return b.buffer
	}
	return nil
}

// leaveBuffering asks a buffering term to stop reading at a transaction
// boundary, save its checkpoint, and end: the next drains the rest, then
// streams live.
func (b *bufferTerm) leaveBuffering() {
	b.once.Do(func() { close(b.toLive) })
}

// leftBuffering reports whether leaveBuffering was called.
func (b *bufferTerm) leftBuffering() bool {
	select {
	case <-b.toLive:
		return true
	default:
		return false
	}
}

// stopOn is the channel that stops the pipeline at a transaction boundary:
// closed on shutdown (ctx), and, while buffering, on leaveBuffering too.
func (b *bufferTerm) stopOn(ctx, streamCtx context.Context, g *errgroup.Group) <-chan struct{} {
	if b.mode != modeBuffering {
		return ctx.Done()
	}
	leave := make(chan struct{})
	g.Go(func() error {
		select {
		case <-ctx.Done():
		case <-b.toLive:
		case <-streamCtx.Done():
			return nil
		}
		close(leave)
		return nil
	})
	return leave
}

// runBuffered runs the term's stream (runStream) as its mode says: after
// draining the buffer to its end (draining first), beside the drainer
// (buffering), or beside the watch that switches to buffering (live, with
// the bound on).
func (r *Relay) runBuffered(streamCtx, gctx context.Context, pool *pgxpool.Pool, g *errgroup.Group, t *term, out chan<- replication.Batch) error {
	t.began = time.Now()
	slot := r.cfg.Replication.Slot
	r.m.SetBuffering(t.mode != modeLive)
	if t.buffer != nil {
		g.Go(func() error { r.nudgeSnapshots(streamCtx, pool); return nil })
	}
	switch {
	case t.mode == modeDrainFirst:
		// What the buffer holds comes before anything the stream reads:
		// drained to its end first. The stream starts at once all the
		// same: holding the slot is what makes this relay the leader
		// (lease.take waits for it), and the drain writes only as the
		// leader. What it reads meanwhile waits (a few batches, then the
		// stream waits too) until the rest, under half a page, is
		// delivered; the watch cuts the drain short if Kafka is away
		// again and the slot retains half the bound.
		raw := make(chan replication.Batch, cap(out))
		drained := make(chan struct{})
		g.Go(func() error { return r.watchRetained(streamCtx, pool, t) })
		g.Go(func() error {
			r.log.Info("WAL buffer: delivering what it holds before streaming live", "slot", slot)
			if err := r.drain(streamCtx, t, true, nil); err != nil {
				return ignoreCanceled(err)
			}
			r.log.Info("WAL buffer: empty; streaming live", "slot", slot)
			r.m.SetBuffering(false)
			close(drained)
			return nil
		})
		g.Go(func() error { forwardAfter(streamCtx, drained, raw, out); return nil })
		return r.runStream(streamCtx, gctx, t, raw)
	case t.mode == modeBuffering:
		r.log.Warn("WAL buffer: buffering: events read go to the buffer table, and from it to Kafka in order", "slot", slot, "table", t.buffer.Table().String())
		leave := walbuffer.NewLeaveGate(r.cfg.MaxRetainedWAL)
		g.Go(func() error { r.sampleRetained(streamCtx, pool, leave); return nil })
		g.Go(func() error {
			return ignoreCanceled(r.drain(streamCtx, t, false, func() {
				// Kafka takes what it is handed and little is left: leave
				// buffering once the buffering time covers a flap, and
				// just after the slot moved (walbuffer.LeaveGate).
				if since, _ := r.drainSink().Outage(); since.IsZero() && time.Since(t.began) >= minBuffering && leave.Ready(time.Now()) {
					t.leaveBuffering()
				}
			}))
		})
	case t.buffer != nil:
		g.Go(func() error { return r.watchRetained(streamCtx, pool, t) })
	}
	return r.runStream(streamCtx, gctx, t, out)
}

// forwardAfter passes what in receives to out, once ready is closed, until
// ctx is done.
func forwardAfter(ctx context.Context, ready <-chan struct{}, in <-chan replication.Batch, out chan<- replication.Batch) {
	select {
	case <-ready:
	case <-ctx.Done():
		return
	}
	for {
		select {
		case b := <-in:
			select {
			case out <- b:
			case <-ctx.Done():
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// termMode decides how the term delivers: a buffer holding rows of the slot
// is drained before anything read later (buffering, or draining first when
// the last term left buffering for it); an empty one means live, unless the
// last term asked to buffer.
func (r *Relay) termMode(ctx context.Context, buf *walbuffer.Store) (termMode, error) {
	next := r.next
	r.next = modeLive
	if buf == nil {
		return modeLive, nil
	}
	if next == modeBuffering {
		return modeBuffering, nil
	}
	any, err := buf.Any(ctx)
	if err != nil {
		return modeLive, err
	}
	switch {
	case !any:
		return modeLive, nil
	case next == modeDrainFirst:
		return modeDrainFirst, nil
	}
	return modeBuffering, nil
}

// watchRetained ends a live term for buffering when its delivery is blocked
// (Kafka unreachable, or the confirmed position still for blockedAfter
// while the slot retains WAL) and the slot retains EnterFraction of the
// bound. It samples once a second; a failed sample is skipped.
func (r *Relay) watchRetained(ctx context.Context, pool *pgxpool.Pool, t *term) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var last pglogrepl.LSN
	moved := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := time.Now()
		if lsn := t.stream.Stats().ConfirmedLSN; lsn != last {
			last, moved = lsn, now
		}
		// Still with events held: a relay with nothing in flight is not
		// blocked while Postgres decodes a large transaction of another
		// table (a switch would make it decode it again from the start).
		since, cause := r.outage(t)
		held, _ := t.pipe.win.usage()
		blocked := !since.IsZero() || held > 0 && now.Sub(moved) >= blockedAfter
		if !blocked {
			// ShouldBuffer would say no whatever the slot retains: a relay
			// that delivers asks Postgres nothing.
			continue
		}
		retained, ok, err := walbuffer.RetainedWAL(ctx, pool, r.cfg.Replication.Slot)
		if err != nil || !ok || !walbuffer.ShouldBuffer(retained, r.cfg.MaxRetainedWAL, blocked) {
			continue
		}
		why := fmt.Sprintf("the slot retains %d bytes of WAL (postgres.max_retained_wal %d) and delivery is blocked", retained, r.cfg.MaxRetainedWAL)
		if cause != nil {
			why += ": " + cause.Error()
		} else {
			why += fmt.Sprintf(": nothing confirmed for %s", now.Sub(moved).Round(time.Second))
		}
		return &switchError{to: modeBuffering, why: why}
	}
}

// sampleRetained feeds the slot's retained WAL to gate once a second until
// ctx ends; a failed sample is skipped (the gate's MaxLeaveWait covers it).
func (r *Relay) sampleRetained(ctx context.Context, pool *pgxpool.Pool, gate *walbuffer.LeaveGate) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if b, ok, err := walbuffer.RetainedWAL(ctx, pool, r.cfg.Replication.Slot); err == nil && ok {
			gate.Sample(b, time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// nudgeSnapshots logs an xl_running_xacts record every
// walbuffer.NudgeEvery while the slot retains walbuffer.NudgeFraction of the
// bound and the relay has confirmed most of it, so that restart_lsn follows
// the confirmed position within seconds rather than the bgwriter's 15 s (or
// 30 s and more when a record finds a transaction open: walbuffer's
// snapshots.go), by pg_log_standby_snapshot() where the role may run it,
// else by a temporary slot on a connection of its own. It does nothing on a
// standby. A call that fails ends it for the term, with a warning, except a
// temporary slot's wait for open transactions (its record is logged first).
func (r *Relay) nudgeSnapshots(ctx context.Context, pool *pgxpool.Pool) {
	method, _, err := walbuffer.SnapshotMethodOf(ctx, pool)
	if err != nil || method == walbuffer.NoSnapshots {
		return
	}
	var conn *pgx.Conn // the temporary slots' session
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	name := fmt.Sprintf("outbox_relay_xacts_%d_%x", os.Getpid(), rand.Uint32())
	tick := time.NewTicker(walbuffer.NudgeEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		retained, unconfirmed, ok, err := walbuffer.SlotWAL(ctx, pool, r.cfg.Replication.Slot)
		if err != nil || !ok || !walbuffer.ShouldNudge(retained, unconfirmed, r.cfg.MaxRetainedWAL) {
			continue
		}
		if method == walbuffer.SnapshotFunction {
			err = walbuffer.LogSnapshot(ctx, pool)
		} else {
			if conn == nil {
				c, aerr := pool.Acquire(ctx)
				if aerr != nil {
					continue
				}
				conn = c.Hijack()
			}
			err = walbuffer.LogSnapshotBySlot(ctx, conn, name)
			if err != nil {
				// Closing the session drops a slot the call left.
				conn.Close(context.Background())
				conn = nil
				if lockTimedOut(err) {
					r.m.WALSnapshotLogged()
					continue
				}
			}
		}
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("WAL buffer: cannot log a running-xacts record; the slot moves at the server's own, every 15 s or more", "by", method.String(), "err", err)
			}
			return
		}
		r.m.WALSnapshotLogged()
	}
}

// lockTimedOut reports whether err is a lock_timeout or statement_timeout
// cancellation (a temporary slot waiting for open transactions).
func lockTimedOut(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "55P03" || pe.Code == "57014")
}

// outage is the Kafka outage the term's health (/readyz, health_failing)
// and watchRetained's blocked delivery take: the stream sink's. With exactly-once the stream's transactional sink writes
// nothing while the relay buffers or drains (the drain has a sink of its
// own), and a sink learns that Kafka is back only by writing: an outage it
// reports from before term t began may be long over, so the drain's sink,
// which wrote since, is asked instead. (Taking the stale one made a relay
// that left buffering go back to it at once with the broker up, and with
// the slot retaining half the bound, as a busy primary's does between
// xl_running_xacts records, never stream live again.) A new outage of a
// live term still ends it: the confirmed position stands still.
func (r *Relay) outage(t *term) (time.Time, error) {
	since, cause := r.sink.Outage()
	if r.cfg.Delivery != DeliveryExactlyOnce || since.IsZero() || !since.Before(t.began) {
		return since, cause
	}
	return r.drainSink().Outage()
}

// bufferWriter is the writer of a buffering term: it appends every chunk,
// router failures included, to the buffer in order, and hands it to the
// committer once the rows are committed.
func (r *writer) runBuffer(ctx context.Context, in <-chan *chunk, com acker) error {
	for c := range in {
		if entries := bufferEntries(c); len(entries) > 0 {
			if err := r.fence.Check(ctx); err != nil {
				return err
			}
			r.health.waitFor("the WAL buffer to store %d events", len(entries))
			err := backoff.Persist(ctx, r.log, fmt.Sprintf("append %d events to the WAL buffer (nothing after them is confirmed until they are stored)", len(entries)),
				r.health.watch("wal_buffer", func() error { return r.buffer.Append(ctx, entries) }))
			if err != nil {
				return err
			}
			r.m.Buffered(len(entries))
		}
		r.done(c, nil, 0, com)
	}
	com.close()
	return nil
}

// bufferEntries are a chunk's events and router failures, in order.
func bufferEntries(c *chunk) []walbuffer.Entry {
	out := make([]walbuffer.Entry, 0, len(c.evs)+len(c.fails))
	f := 0
	for i := 0; i <= len(c.evs); i++ {
		for f < len(c.fails) && c.fails[f].before == i {
			ev := c.fails[f].ev
			ev.Topic = ""
			out = append(out, walbuffer.Entry{Event: ev, Failure: routeReason(c.fails[f].err), FailureCode: routeCode(c.fails[f].err)})
			f++
		}
		if i < len(c.evs) {
			out = append(out, walbuffer.Entry{Event: c.evs[i]})
		}
	}
	return out
}

// drainChunk is a page of the buffer as the writer takes it: router
// failures back in their places, its events in evs (a buffer the writer
// recycled, or nil), its bytes the page's stored copies, which the drain
// holds in its window until the writer is done with it.
func drainChunk(page []walbuffer.Entry, evs []event.Event) *chunk {
	if evs == nil {
		evs = make([]event.Event, 0, len(page))
	}
	c := &chunk{evs: evs}
	for i := range page {
		e := &page[i]
		c.bytes += e.Size()
		c.rows++
		if e.Failure != "" {
			c.fails = append(c.fails, routeFailure{before: len(c.evs), ev: e.Event,
				err: &router.RouteError{EventID: e.Event.ID, Code: e.FailureCode, Reason: e.Failure}})
			continue
		}
		c.evs = append(c.evs, e.Event)
	}
	return c
}

// drainTally is the drain's acker: it tells the drainer the key of the last
// entry of each chunk the writer finished.
type drainTally struct {
	d  *walbuffer.Drainer
	mu sync.Mutex
	at map[*chunk]walbuffer.Key
}

func (t *drainTally) ack(c *chunk) {
	t.mu.Lock()
	k, ok := t.at[c]
	delete(t.at, c)
	t.mu.Unlock()
	if ok {
		t.d.Acked(k)
	}
}

func (t *drainTally) close() {}

// drain delivers the buffer through a writer of its own (the stream's sink,
// which the term's pipeline does not use meanwhile: a buffering pipeline
// writes to the buffer, a draining-first one has not started; with
// exactly-once delivery the drain's own, drainSink), with the
// term's gate and lease. untilEmpty and nearlyEmpty are walbuffer.Drainer.Run's.
func (r *Relay) drain(ctx context.Context, t *term, untilEmpty bool, nearlyEmpty func()) error {
	// The drain's events were read from the WAL, but long before: no spans
	// or stage trace; at least once, as the buffered range is (drainSink).
	w := newWriter(r.cfg, writerEnds{sink: r.drainSink(), gate: t.pipe.gate, fence: t.lease},
		newWindow(r.cfg.MaxInFlightEvents, r.cfg.MaxInFlightBytes), newHealth(r.cfg.StallAfter, r.log), writerRole{inFlight: true})
	// The drain's memory is bounded as the pipeline's: pages of at most
	// DefaultPageSize rows and half the window, the writer holding at most
	// the window's bytes of them (taken in Send, given back when done).
	// Pages of kafka.batch_size rows (10,000 at the defaults), with the
	// writer's queue unbounded by bytes, held ~40 MB of events beside the
	// buffering pipeline's window (issue 34: 119 MiB RSS against the bound
	// of 80 MiB).
	d := &walbuffer.Drainer{Store: t.buffer, PageSize: walbuffer.DefaultPageSize, PageBytes: r.cfg.MaxInFlightBytes / 2,
		Fence:   t.lease.Check,
		Deleted: func(n int64) { r.m.Drained(int(n)) },
		Failed:  func(err error) { r.log.Warn("WAL buffer: read or delete failed; trying again", "err", err) }}
	tally := &drainTally{d: d, at: map[*chunk]walbuffer.Key{}}
	chunks := make(chan *chunk)
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = w.run(dctx, chunks, tally)
		cancel() // a writer that failed ends the drain
	}()
	d.Send = func(ctx context.Context, page []walbuffer.Entry) error {
		c := drainChunk(page, w.win.spareEvents())
		if err := w.win.take(ctx, 0, c.windowBytes(), false); err != nil {
			return err
		}
		tally.mu.Lock()
		tally.at[c] = page[len(page)-1].Key()
		tally.mu.Unlock()
		select {
		case chunks <- c:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := d.Run(dctx, untilEmpty, nearlyEmpty)
	close(chunks)
	if err != nil {
		cancel()
	}
	wg.Wait()
	if werr != nil && !errors.Is(werr, context.Canceled) {
		return werr
	}
	return err
}

// sampleBuffer records what the slot's buffer holds, for the metrics. A
// failed read is skipped: the next sample tries again.
func (r *Relay) sampleBuffer(ctx context.Context, t *term) {
	if t.buffer == nil || r.m == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if st, err := t.buffer.Stats(sctx); err == nil {
		r.m.SetBuffered(st.Events, st.Oldest)
	}
}
