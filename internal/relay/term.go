package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/eos"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// A term is one term of leadership: everything that lives from taking the
// slot to losing it (or stopping), built once by newTerm from where the term
// starts (open) and dropped whole when lead returns. A term that lost the
// slot delivers and saves nothing more; the next term builds its own.
type term struct {
	start   pglogrepl.LSN
	store   *checkpoint.Store
	stopped *checkpoint.Stop // the last run's stop record, nil when none
	stream  *replication.Stream
	lease   *leader.Lease
	pipe    *pipeline
	worker  *retry.Worker

	bufferTerm // the WAL buffer's part (walbuffer.go)
}

// newTerm opens the term (open: where it starts, checked) and builds its
// stream, lease, pipeline and retry worker. Nothing runs yet.
func (r *Relay) newTerm(ctx context.Context, pool *pgxpool.Pool) (*term, error) {
	o, err := r.open(ctx, pool)
	if err != nil {
		return nil, err
	}
	t := &term{start: o.start, store: o.store}
	if t.bufferTerm, err = r.newBufferTerm(ctx, o.buffer); err != nil {
		return nil, err
	}
	slot := r.cfg.Replication.Slot
	t.lease = leader.New(slot, r.cfg.Identity, r.cfg.LeaseDuration, r.log, o.store, o.store, func() checkpoint.Server {
		if srv := t.stream.Server(); srv != nil {
			return srv.Server
		}
		return checkpoint.Server{}
	})
	rcfg := r.cfg.Replication
	// The stream's connections must reach the server the checkpoint was
	// checked against (a failover while running is refused the same way).
	rcfg.Server = &o.srv
	rcfg.Started = t.lease.Started
	// An idle position is saved by the committer before it is confirmed.
	rcfg.Idle = func(lsn pglogrepl.LSN) { t.pipe.com.idle(lsn) }
	t.stream = replication.New(rcfg)
	rts, err := r.cfg.routers()
	if err != nil {
		return nil, err
	}
	// pgoutput names a domain column's type by the domain: the routers
	// render it as its base type, as Debezium does.
	bases, err := placement.BaseTypes(ctx, pool)
	if err != nil {
		return nil, err
	}
	for _, rt := range rts {
		rt.SetBaseTypes(bases)
	}
	var x *eos.Session
	if r.cfg.Delivery == DeliveryExactlyOnce {
		x = &eos.Session{Sink: r.sink.(eos.TxnSink), Topic: r.cfg.CheckpointTopic, Slot: slot, Epoch: t.lease.Wait,
			Server: t.lease.Server, Term: o.srv, Log: r.log, Parked: o.rstore, Reload: o.gate.load, Resume: o.start,
			Verify: t.lease.Verify, Timeouts: r.timeouts, TSink: r.sink.(eos.TimeoutSink),
			Hold: func(ctx context.Context, tx pgx.Tx, epoch int64) error {
				return o.store.HoldEpoch(ctx, tx, slot, epoch)
			}}
	}
	t.pipe = newPipeline(r.cfg, ends{
		routers: rts, placers: o.placers, sink: r.sink, gate: o.gate,
		fence: t.lease, saver: t.lease, stream: t.stream, history: o.store, eos: x, buffer: t.appendTo(),
		bases: bases, domains: func(ctx context.Context) (map[uint32]router.BaseType, error) {
			return placement.BaseTypes(ctx, pool)
		},
	}, o.start)
	var committed func() pglogrepl.LSN
	if x != nil {
		committed = x.Committed
	}
	if t.worker, err = r.retryWorker(o.rstore, o.gate, t.lease, committed); err != nil {
		return nil, err
	}
	// Why this slot's relay last stopped before a transaction, if it did:
	// /readyz says so until the checkpoint passes it (the fix applied) or
	// the relay stops there again.
	if t.stopped, err = o.store.Stopped(ctx, slot); err != nil {
		r.log.Warn("cannot read the stop record of the last run", "err", err)
	}
	return t, nil
}

// lead runs term t: the pipeline, from the checkpoint, until ctx is
// cancelled (drain, final checkpoint), a failure, or the loss of the slot
// (leader.ErrStandBy: nothing drained, nothing more delivered or saved).
//
//	stream ─batches→ route ─chunks→ writer ─acks→ committer ─Confirm→ stream
//	                                   └─ gate, retry table ←─ retry worker
func (r *Relay) lead(ctx context.Context, pool *pgxpool.Pool, t *term) error {
	// The pipeline outlives ctx by the drain: it runs on a context of its own
	// that only a failure or the drain deadline cancels.
	pctx, fail := context.WithCancelCause(context.WithoutCancel(ctx))
	defer fail(nil)
	defer context.AfterFunc(ctx, func() {
		r.log.Info("shutdown requested: draining", "timeout", r.cfg.ShutdownTimeout.String())
		t := time.AfterFunc(r.cfg.ShutdownTimeout, func() { fail(ErrDrainTimeout) })
		context.AfterFunc(pctx, func() { t.Stop() })
	})()
	g, gctx := errgroup.WithContext(pctx)
	// The stream and its companions live until the final checkpoint.
	streamCtx, stopStream := context.WithCancel(gctx)
	defer stopStream()
	// Batches in this channel are outside the window (it is taken when a
	// batch is routed): keep it short, it only smooths hand-overs.
	batches := make(chan replication.Batch, 4)

	r.live.Store(t)
	defer r.live.Store(nil)
	defer r.m.SetActive(false)
	if err := r.sampleMetrics(streamCtx, g, pool); err != nil {
		return err
	}
	g.Go(func() error {
		if err := t.lease.Take(streamCtx); err != nil {
			return ignoreCanceled(err)
		}
		epoch, err := t.lease.Wait(streamCtx)
		if err != nil {
			return ignoreCanceled(err)
		}
		r.m.TookOver(epoch)
		return nil
	})
	// The stream, after what the WAL buffer holds; and the buffer's
	// drainer, or the watch that starts buffering.
	g.Go(func() error { return r.runBuffered(streamCtx, gctx, pool, g, t, batches) })
	g.Go(func() error { return ignoreCanceled(t.worker.Run(streamCtx)) })
	g.Go(func() error { r.pumpStats(streamCtx, t); return nil })
	g.Go(func() error { t.pipe.gate.sweep(streamCtx, 30*time.Second); return nil })
	g.Go(func() error { t.pipe.hist.run(streamCtx); return nil })
	if r.cfg.Retention.Retention > 0 {
		for _, o := range r.cfg.outboxes() {
			g.Go(func() error { r.runRetention(streamCtx, pool, o.name); return nil })
		}
	}
	var schemaStop error
	stop := t.stopOn(ctx, streamCtx, g) // also when leaving buffering
	t.pipe.run(gctx, g, stop, batches, func(err error) error {
		if se := (*stopError)(nil); errors.As(err, &se) {
			// Not a failure of the pipeline: drain what came before the
			// change and save its checkpoint, as at a clean stop, so that a
			// restart resends nothing already delivered; then stop with it.
			schemaStop = err
			t := time.AfterFunc(r.cfg.ShutdownTimeout, func() { fail(ErrDrainTimeout) })
			context.AfterFunc(pctx, func() { t.Stop() })
			return nil
		}
		return err
	}, stopStream) // the final checkpoint is confirmed: the stream may close
	return r.leadEnded(ctx, pctx, t, g.Wait(), schemaStop)
}

// leadEnded says why term t's pipeline ended, given what its group returned
// (err) and the stop before a change it drained for (schemaStop), recording
// a stop in the checkpoint table for lag, status and the next run's /readyz.
func (r *Relay) leadEnded(ctx, pctx context.Context, t *term, err, schemaStop error) error {
	if cause := context.Cause(pctx); errors.Is(cause, ErrDrainTimeout) {
		return fmt.Errorf("%w after %s: the events not yet confirmed will be sent again on the next start",
			ErrDrainTimeout, r.cfg.ShutdownTimeout)
	}
	if errors.Is(err, replication.ErrSlotActive) || errors.Is(err, checkpoint.ErrFenced) {
		return fmt.Errorf("%w: %w", leader.ErrStandBy, err)
	}
	if nt := (*replication.NonTransactionalError)(nil); errors.As(err, &nt) {
		// Like a stop before a transaction: lag, status and the next
		// run's /readyz say why until the checkpoint passes it.
		r.recordStop(ctx, t, nt.LSN, err)
	}
	if err != nil {
		return err
	}
	if schemaStop != nil {
		r.log.Info("stopped", "checkpoint", t.pipe.com.saved.String())
		// For lag, status and the next run's /readyz, while the relay is
		// down: a failure to record it loses nothing, the error says all.
		se := (*stopError)(nil)
		errors.As(schemaStop, &se)
		r.recordStop(ctx, t, se.lsn, schemaStop)
		return schemaStop
	}
	if ctx.Err() != nil {
		r.log.Info("stopped", "checkpoint", t.pipe.com.saved.String())
		return ctx.Err()
	}
	if t.leftBuffering() {
		return &switchError{to: modeDrainFirst, why: "the WAL buffer is nearly empty, Kafka takes events and the slot just moved"}
	}
	return errors.New("relay: pipeline stopped without a reason") // unreachable: the stream only returns on error or stop
}

// recordStop records in the checkpoint table that the relay stopped before
// lsn, and why; a failure is logged, as the returned error says it all.
func (r *Relay) recordStop(ctx context.Context, t *term, lsn pglogrepl.LSN, why error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := t.store.RecordStop(rctx, r.cfg.Replication.Slot, lsn, why.Error()); err != nil {
		r.log.Warn("cannot record the stop in the checkpoint table", "err", err)
	}
}

// retryWorker builds the retry worker of a term. It writes to Kafka beside
// the pipeline: a sink (Sinks.Retry) and a router of its own, as neither is
// safe for concurrent use, and only while the term leads (fence).
// Per-aggregate order holds because the pipeline writes no event of a lane
// the worker has rows of (the gate), which the worker releases.
func (r *Relay) retryWorker(rstore *retry.Store, gt *gate, f leader.Fence, committed func() pglogrepl.LSN) (*retry.Worker, error) {
	wrouters, err := r.cfg.routers()
	if err != nil {
		return nil, err
	}
	wcfg := r.cfg.Retry
	wcfg.Store, wcfg.Topic, wcfg.Logger = rstore, wrouters[0].Topic, r.log.With("component", "retry")
	wcfg.Sink = guardedSink{fence: f, sink: r.retrySink}
	wcfg.Headers = wrouters[0].Headers()
	// Each table's rows by its own rules; those of messages (no table)
	// by the first table's, as the route stage routes them.
	wcfg.Tables = map[string]retry.Routing{}
	for i, o := range r.cfg.outboxes() {
		wcfg.Tables[o.name] = retry.Routing{Topic: wrouters[i].Topic, Headers: wrouters[i].Headers()}
	}
	wcfg.Committed = committed // exactly-once: rows of uncommitted Kafka transactions wait
	wcfg.MarkAtLeastOnce = r.cfg.Delivery == DeliveryExactlyOnce
	wcfg.Delivered = func(agg string) {
		// Called from the worker's goroutine while it runs: bounded, as a
		// hung query must not hold up the worker.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gt.release(ctx, []string{agg})
	}
	return retry.NewWorker(wcfg)
}

// runStream runs the replication stream until streamCtx ends; stopped by the
// committer after the final checkpoint (gctx still live), that is no error.
func (r *Relay) runStream(streamCtx, gctx context.Context, t *term, out chan<- replication.Batch) error {
	err := t.stream.Run(streamCtx, t.start, out)
	var de *replication.DecodeError
	if errors.As(err, &de) {
		r.m.DecodeError()
	}
	if errors.Is(err, replication.ErrGap) {
		r.m.SetSlotGap(true)
	}
	if streamCtx.Err() != nil && gctx.Err() == nil {
		return nil
	}
	return err
}

// readingSeen is the transaction pumpStats saw the stream read last at its
// last sample, and since when.
type readingSeen struct {
	commit pglogrepl.LSN
	since  time.Time
}

// publishReading records in the checkpoint table, for lag, the transaction
// the stream began to read before an earlier sample (a second or more ago)
// and has not confirmed: the server decodes a transaction whole before it
// sends it and the relay confirms the positions it reports meanwhile, so the
// slot's byte lag misses it (issue 34). Once a second while it lasts; the
// save of a checkpoint past it clears it. Transactions read and confirmed
// within a second are never written. A failure is logged at debug level:
// the figure is for operators, and the next second tries again.
func (r *Relay) publishReading(ctx context.Context, t *term, cur replication.Reading, confirmed pglogrepl.LSN, now time.Time, seen *readingSeen) {
	if cur.CommitLSN != seen.commit {
		seen.commit, seen.since = cur.CommitLSN, now
		return
	}
	epoch, ok := t.lease.Current()
	if cur.CommitLSN == 0 || confirmed > cur.CommitLSN || !ok {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := t.store.RecordReading(wctx, r.cfg.Replication.Slot, epoch, checkpoint.Reading{
		CommitLSN: cur.CommitLSN, Since: seen.since, Events: cur.Rows, Bytes: cur.Bytes}); err != nil {
		r.log.Debug("cannot record the transaction being read in the checkpoint table (for lag)", "err", err)
	}
}

// sampleMetrics starts the metrics sampler of a term, when metrics are on.
func (r *Relay) sampleMetrics(ctx context.Context, g *errgroup.Group, pool *pgxpool.Pool) error {
	if r.m == nil {
		return nil
	}
	sampler, err := metrics.NewSampler(r.m, pool, metrics.SamplerConfig{
		Slot: r.cfg.Replication.Slot, RetryTable: r.cfg.RetryTable, Logger: r.log})
	if err != nil {
		return fmt.Errorf("metrics sampler: %w", err)
	}
	g.Go(func() error { return ignoreCanceled(sampler.Run(ctx)) })
	return nil
}

// pumpStats turns the stream's and the retry worker's counters into metrics,
// and samples the health checks, once a second.
func (r *Relay) pumpStats(ctx context.Context, t *term) {
	var last replication.Stats
	var lastW retry.WorkerStats
	var rd readingSeen
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if n%5 == 0 {
			r.sampleBuffer(ctx, t)
		}
		st := t.stream.Stats()
		now := time.Now()
		r.publishReading(ctx, t, st.Reading, st.ConfirmedLSN, now, &rd)
		t.pipe.health.sample(st.ConfirmedLSN, st.ServerWALEnd, now)
		since, cause := r.outage(t)
		failing, why := t.pipe.health.failing(now, st, since, cause)
		stalled := t.pipe.health.stalledFor(now)
		if msg, d := r.timeouts.Problem(now); msg != "" {
			// Each attempt is a term of its own, whose chunks are progress:
			// the stall counts from the first aborted attempt.
			failing["stalled"] = true
			stalled = max(stalled, d)
			why = append(why, msg)
		}
		r.m.SetHealth(failing, stalled)
		t.pipe.health.warn(now, why)
		if r.m == nil {
			continue
		}
		for range st.Reconnects - last.Reconnects {
			r.m.Reconnected()
		}
		r.m.ReplicationPaused(st.Pauses - last.Pauses)
		for range st.IgnoredUpdates - last.IgnoredUpdates {
			r.m.IgnoredChange("update")
		}
		for range st.IgnoredDeletes - last.IgnoredDeletes {
			r.m.IgnoredChange("delete")
		}
		for range st.IgnoredTruncates - last.IgnoredTruncates {
			r.m.IgnoredChange("truncate")
		}
		for range st.SkippedNonTransactional - last.SkippedNonTransactional {
			r.m.IgnoredChange("non_transactional_message")
		}
		r.m.UnsolicitedMessages("stream_abort", st.SkippedStreamAborts-last.SkippedStreamAborts)
		r.m.UnsolicitedMessages("unknown", st.SkippedUnknownMessages-last.SkippedUnknownMessages)
		last = st
		ws := t.worker.Stats()
		r.m.RetryWorked(ws.Attempted-lastW.Attempted, ws.Succeeded-lastW.Succeeded, ws.DeadLettered-lastW.DeadLettered)
		lastW = ws
		r.m.SetInFlight(t.pipe.win.usage())
	}
}

// guardedSink lets the retry worker write to Kafka only while this relay
// leads, as the pipeline's writer does.
type guardedSink struct {
	fence leader.Fence
	sink  retry.Sink
}

func (g guardedSink) Write(ctx context.Context, events []event.Event) error {
	if err := g.fence.Check(ctx); err != nil {
		return err
	}
	return g.sink.Write(ctx, events)
}

func (g guardedSink) Ping(ctx context.Context) error { return g.sink.Ping(ctx) }
