// Package relay wires replication, router, sink and checkpoint into the
// streaming pipeline of outbox-relay:
//
//	replication.Stream ─batches→ routeStage ─chunks→ writer (sink.Kafka, gate, retry table) ─acks→ committer (checkpoint.Store, Stream.Confirm)
//
// Each stage is a type that owns its state and runs on its own goroutine, so
// decoding, routing and Kafka writes overlap; they meet only through channels
// and the small interfaces of pipeline.go. Invariants enforced here:
//
//   - Ack after confirm: a transaction's end LSN is saved as the checkpoint and
//     then confirmed to Postgres only after Kafka has acknowledged every event in
//     it and in every earlier transaction. Chunks are written in order by one
//     writer, so the acknowledged prefix is always contiguous.
//   - The checkpoint is saved before the LSN is confirmed to the slot, so the
//     saved checkpoint is never behind the slot's confirmed_flush_lsn and the
//     relay can drop transactions a slot resends after a Postgres crash.
//   - Bounded memory and bounded duplicates: payload bytes read but not yet
//     acknowledged are capped by MaxInFlightBytes; events read but not yet
//     covered by a saved checkpoint (all that a crash can resend) are capped by
//     MaxInFlightEvents, plus the rest of a transaction that is being read (a
//     checkpoint can only fall on a transaction's end).
//   - Per-aggregate order: events keep commit order from the stream to the
//     sink, whose contract keeps per-key order. An event that fails on its own
//     (unroutable, refused by Kafka) goes to the retry table in its place, and
//     while an aggregate has a row there its later events go there too,
//     behind it (the gate).
//   - Nothing is confirmed past an event that is neither acknowledged by
//     Kafka nor stored in the retry table: a retry-table write that fails is
//     retried, and reported by Ready, until it succeeds.
//   - An event's identity is its row's id column and its place in the WAL
//     (commit LSN, position in the transaction), carried in its envelope
//     (event.Event) from the router to the retry table; it is never read back from
//     Kafka headers.
//   - A change of the outbox table that leaves a mapped column missing stops
//     the relay before the first event it affects is confirmed
//     (router.SchemaError): no event is stored or sent incomplete.
//   - An insert under a name other than the outbox's is delivered only when
//     the catalog shows it is the outbox (a partition of it, or the outbox
//     under an earlier name), ignored only when it provably is not, and
//     otherwise stops the relay before it is confirmed (package placement).
//   - The checkpoint history (one row at most every HistoryInterval, for
//     retention and replay) is written by its own goroutine from the latest
//     saved checkpoint: a slow or failing history write never delays a
//     confirmation, and is retried an interval later.
//   - Retention, when on, runs beside the pipeline and never deletes an
//     outbox row whose transaction the saved checkpoint does not cover
//     (package retention); its failures are logged, never fatal.
//   - Know your slot (DESIGN invariant 14): the relay streams only from a slot
//     whose position its checkpoint explains (pgslot.Verify before the stream
//     starts, the stream itself on every reconnection). Every position it
//     confirms to the slot is saved as the checkpoint first, idle advances
//     included, and each takeover records the server's system identifier and
//     timeline; so a slot ahead of the checkpoint, invalidated, or on another
//     system or a forked timeline is refused with the uncovered range and
//     the fix (exit code 4), never streamed on past. With OnSlotLoss refill,
//     a gap a refill can heal (the slot dropped, invalidated, recreated,
//     missing after a failover) is refilled from the outbox table instead
//     (refill.go), at start or when a running stream meets it, and the
//     relay leads again from the new slot.
//   - On shutdown the relay stops reading at a transaction boundary, drains
//     what it has read, saves the final checkpoint, and only then closes the
//     replication connection.
package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// ErrDrainTimeout is the cause of a shutdown whose drain did not finish within
// Config.ShutdownTimeout. Nothing is lost: what was not confirmed is sent again
// on the next start.
var ErrDrainTimeout = errors.New("relay: shutdown drain timed out")

// FutureStartError refuses a StartLSN beyond the server's current WAL
// position without StartLSNForce.
type FutureStartError struct {
	Requested, Current pglogrepl.LSN
}

func (e *FutureStartError) Error() string {
	return fmt.Sprintf("start LSN %s is beyond the server's current WAL position %s: every event committed before the WAL reaches it would be skipped; give a position at or before %s, or force it if that is really meant",
		e.Requested, e.Current, e.Current)
}

// Relay streams outbox inserts from a replication slot to Kafka.
type Relay struct {
	cfg    Config
	log    *slog.Logger
	router *router.Router // validated config; each term routes with its own
	sink   *sink.Kafka
	m      *metrics.Metrics             // nil records nothing
	pool   atomic.Pointer[pgxpool.Pool] // set by Run; Ready reads it from any goroutine
	placer *placement.Placer            // set by open, for the term's route stage

	// Per term of leadership (see lead), built afresh by newTerm: the
	// pipeline of a term that lost the slot is discarded whole.
	route  *routeStage
	rcfg   replication.Config  // the stream's, built by lead once the server is known
	stream *replication.Stream // set by lead
	idle   *idleAdvance
	win    *window
	health *health
	lease  *lease

	// live is what Ready reads: the current term's stream and health, nil
	// while standing by.
	live    atomic.Pointer[liveTerm]
	standby atomic.Pointer[string] // who holds the slot, while standing by
}

type liveTerm struct {
	stream  *replication.Stream
	health  *health
	stopped *checkpoint.Stop // the last run's stop record, nil when none
}

// New validates cfg and fills defaults. It neither dials nor starts goroutines.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	sk, err := sink.New(cfg.Sink)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, router: rt, sink: sk, m: cfg.Metrics}
	r.m.SetRole(r.Role)
	r.newTerm()
	return r, nil
}

// newTerm builds the state of one term of leadership.
func (r *Relay) newTerm() {
	cfg := r.cfg
	rt, _ := router.New(cfg.Router) // validated by New
	r.win = newWindow(cfg.MaxInFlightEvents, cfg.MaxInFlightBytes)
	r.health = newHealth(cfg.StallAfter, cfg.Logger)
	r.lease = newLease(cfg.Replication.Slot, cfg.Identity, cfg.LeaseDuration, cfg.Logger)
	r.idle = &idleAdvance{}
	rcfg := cfg.Replication
	rcfg.Started = r.lease.started
	rcfg.Idle = r.idle.offer
	r.rcfg = rcfg
	r.lease.server = func() checkpoint.Server {
		if srv := r.stream.Server(); srv != nil {
			return srv.Server
		}
		return checkpoint.Server{}
	}
	r.route = &routeStage{
		router: rt, win: r.win,
		maxMsgs: cfg.Sink.BatchSize, maxBytes: 4 * int(cfg.Sink.BatchBytes),
		log: cfg.Logger, m: cfg.Metrics, tableM: cfg.Metrics.Table(cfg.Table),
		isOutbox: make(map[*replication.Relation]bool),
	}
}

// Run streams until ctx is cancelled or a non-retryable error occurs. Lost
// connections to Postgres and Kafka outages are retried inside; Run returns
// for what needs an operator (a missing slot, a changed outbox table, bad
// credentials). After ctx is cancelled it drains and saves the final
// checkpoint, then returns an error that wraps context.Canceled, or one that
// wraps ErrDrainTimeout if the drain took longer than ShutdownTimeout.
//
// Any number of relays may Run on one slot: the one whose walsender holds
// the slot leads (streams and delivers), the others stand by until the slot
// is free and then race for it (see lead and standBy). A leader that finds
// the slot taken or its epoch fenced (package checkpoint) drops its
// pipeline, delivering and saving nothing more, and stands by again.
func (r *Relay) Run(ctx context.Context) (err error) {
	defer r.sink.Close()
	// A TLS failure says what to change in postgres.dsn (see secure.go).
	defer func() { err = explainTLS(err) }()
	// Credentials or TLS settings Kafka refuses need an operator: stop before
	// streaming (a *sink.AuthError names the field), rather than hold every event
	// as a Kafka outage. An unreachable Kafka is no reason: the writer waits.
	if err := r.sink.CheckAuth(ctx); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, r.cfg.Replication.DSN)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()
	r.pool.Store(pool)

	// The metrics server serves both roles for the life of the process; a
	// failure of it (the port taken) ends Run as a failure of the pipeline
	// would.
	rctx, failRun := context.WithCancelCause(ctx)
	defer failRun(nil)
	var served errgroup.Group
	sctx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stopServing(); served.Wait() }()
	if r.m != nil {
		served.Go(func() error {
			if err := ignoreCanceled(r.m.Serve(sctx, r.cfg.MetricsListen, r.Ready)); err != nil {
				failRun(err)
			}
			return nil
		})
	}
	for term := 0; ; term++ {
		if term > 0 {
			r.newTerm()
		}
		if err := r.standBy(rctx, pool); err != nil {
			return runCause(rctx, err)
		}
		err := r.lead(rctx, sctx, pool)
		if errors.Is(err, errStandBy) && rctx.Err() == nil {
			r.log.Warn("no longer leading: standing by", "slot", r.cfg.Replication.Slot, "reason", err)
			continue
		}
		// A slot lost at start or while streaming: with refill on, heal
		// it from the outbox table and lead again from the new slot.
		// The term's pipeline is gone: what it had not saved is refilled.
		var gap *pgslot.GapError
		if errors.As(err, &gap) && r.cfg.OnSlotLoss == OnSlotLossRefill && gap.Cause.Refillable() && rctx.Err() == nil {
			if _, rerr := r.refill(rctx, pool, gap, false); rerr != nil && !errors.Is(rerr, ErrNoGap) && !errors.Is(rerr, errRefillAgain) {
				if errors.Is(rerr, checkpoint.ErrFenced) {
					r.log.Warn("refill fenced by another relay of this group: standing by", "reason", rerr)
					continue
				}
				if unreachable(rerr) {
					// Postgres went away mid-refill (another failover, a
					// restart): nothing was confirmed, so the next term
					// meets the gap again and refills from the start.
					r.log.Warn("refill interrupted: Postgres is unreachable; trying again", "err", rerr, "retry_in", refillRetry)
					t := time.NewTimer(refillRetry)
					select {
					case <-rctx.Done():
						t.Stop()
						return runCause(rctx, rctx.Err())
					case <-t.C:
					}
					continue
				}
				return runCause(rctx, rerr)
			}
			continue
		}
		return runCause(rctx, err)
	}
}

// refillRetry is the wait before a refill that lost Postgres is tried again.
const refillRetry = time.Second

// runCause prefers the reason Run was failed (the metrics server) to the
// cancellation it caused.
func runCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && errors.Is(err, context.Canceled) {
		return cause
	}
	return err
}

// lead runs one term of leadership: the pipeline, from the checkpoint, until
// ctx is cancelled (drain, final checkpoint), a failure, or the loss of the
// slot (errStandBy: nothing drained, nothing more delivered or saved).
//
//	stream ─batches→ route ─chunks→ writer ─acks→ committer ─Confirm→ stream
//	                                   └─ gate, retry table ←─ retry worker
func (r *Relay) lead(ctx, sctx context.Context, pool *pgxpool.Pool) error {
	start, srv, store, rstore, gt, err := r.open(ctx, pool)
	if err != nil {
		return err
	}
	r.route.placer = r.placer
	// The stream's connections must reach the server the checkpoint was
	// checked against (a failover while running is refused the same way).
	rcfg := r.rcfg
	rcfg.Server = &srv
	r.stream = replication.New(rcfg)
	r.lease.store = store
	worker, wsink, err := r.retryWorker(rstore, gt)
	if err != nil {
		return err
	}
	defer wsink.Close()

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
	// Batches in these channels are outside the window (it is taken when a
	// batch is routed): keep them short, they only smooth hand-overs.
	// chunks is unbuffered: the route stage grows its chunk while the
	// writer is busy (see routeStage.run).
	batches, chunks := make(chan replication.Batch, 4), make(chan *chunk)
	w := &writer{sink: r.sink, gate: gt, win: r.win, health: r.health, log: r.log, m: r.m, lease: r.lease, spans: r.cfg.Spans}
	com := newCommitter(store, r.stream, r.win, r.health, r.m, r.log, r.cfg, start)
	com.lease = r.lease
	r.idle.com.Store(com)
	hist := newHistorian(store, r.log, r.cfg)
	com.history = hist

	// Why this slot's relay last stopped before a transaction, if it did:
	// /readyz says so until the checkpoint passes it (the fix applied) or
	// the relay stops there again.
	stopped, err := store.Stopped(ctx, r.cfg.Replication.Slot)
	if err != nil {
		r.log.Warn("cannot read the stop record of the last run", "err", err)
	}
	r.live.Store(&liveTerm{stream: r.stream, health: r.health, stopped: stopped})
	defer r.live.Store(nil)
	defer r.m.SetActive(false)
	if err := r.sampleMetrics(streamCtx, g, pool); err != nil {
		return err
	}
	g.Go(func() error {
		if err := r.lease.take(streamCtx); err != nil {
			return ignoreCanceled(err)
		}
		epoch, err := r.lease.wait(streamCtx)
		if err != nil {
			return ignoreCanceled(err)
		}
		r.m.TookOver(epoch)
		return nil
	})
	g.Go(func() error { return r.runStream(streamCtx, gctx, start, batches) })
	g.Go(func() error { return ignoreCanceled(worker.Run(streamCtx)) })
	g.Go(func() error { r.pumpStats(streamCtx, worker); return nil })
	g.Go(func() error { gt.sweep(streamCtx, 30*time.Second); return nil })
	g.Go(func() error { hist.run(streamCtx); return nil })
	if r.cfg.Retention.Retention > 0 {
		g.Go(func() error { r.runRetention(streamCtx, pool); return nil })
	}
	var schemaStop error
	g.Go(func() error {
		err := r.route.run(gctx, ctx.Done(), batches, chunks)
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
	})
	g.Go(func() error { return w.run(gctx, chunks, com) })
	g.Go(func() error {
		defer stopStream() // the final checkpoint is confirmed: the stream may close
		return com.run(gctx)
	})
	err = g.Wait()
	if cause := context.Cause(pctx); errors.Is(cause, ErrDrainTimeout) {
		return fmt.Errorf("%w after %s: the events not yet confirmed will be sent again on the next start",
			ErrDrainTimeout, r.cfg.ShutdownTimeout)
	}
	if errors.Is(err, replication.ErrSlotActive) || errors.Is(err, checkpoint.ErrFenced) {
		return fmt.Errorf("%w: %w", errStandBy, err)
	}
	if err != nil {
		return err
	}
	if schemaStop != nil {
		r.log.Info("stopped", "checkpoint", com.saved.String())
		// For lag, status and the next run's /readyz, while the relay is
		// down: a failure to record it loses nothing, the error says all.
		se := (*stopError)(nil)
		errors.As(schemaStop, &se)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := store.RecordStop(rctx, r.cfg.Replication.Slot, se.lsn, schemaStop.Error()); err != nil {
			r.log.Warn("cannot record the stop in the checkpoint table", "err", err)
		}
		return schemaStop
	}
	if ctx.Err() != nil {
		r.log.Info("stopped", "checkpoint", com.saved.String())
		return ctx.Err()
	}
	return errors.New("relay: pipeline stopped without a reason") // unreachable: the stream only returns on error or stop
}

// open resolves where to start and loads the gate, waiting for Postgres if it
// is down or restarting (a host reboot starts both). What needs an operator
// (no slot, no table, a bad password) fails at once.
func (r *Relay) open(ctx context.Context, pool *pgxpool.Pool) (pglogrepl.LSN, pgslot.Server, *checkpoint.Store, *retry.Store, *gate, error) {
	store := checkpoint.New(pool, r.cfg.CheckpointTable)
	rstore, err := retry.NewStore(pool, r.cfg.RetryTable)
	if err != nil {
		return 0, pgslot.Server{}, nil, nil, nil, fmt.Errorf("retry table: %w", err)
	}
	gt := &gate{store: rstore, log: r.log}
	var start pglogrepl.LSN
	var srv pgslot.Server
	err = retryIf(ctx, r.log, "postgres unreachable at start-up", unreachable, func() error {
		var err error
		if start, srv, err = r.resolveStart(ctx, pool, store); err != nil {
			return err
		}
		// A retry table made by an earlier version lacks what lets it
		// store every event: upgrade it (a no-op, without locks, when
		// current). Without the rights to, say so; setup can do it.
		if err := rstore.Migrate(ctx); err != nil {
			if unreachable(err) {
				return err
			}
			r.log.Warn("cannot upgrade the retry table: its owner must (sql/004_retry.sql does)", "table", r.cfg.RetryTable, "err", err)
		}
		// Likewise the checkpoint history, new in a later version than the
		// checkpoint table: delivery does not need it, retention does.
		if err := store.MigrateHistory(ctx); err != nil {
			if unreachable(err) {
				return err
			}
			r.log.Warn("cannot create the checkpoint history table: the checkpoint table's owner must (sql/002_relay.sql does); until then no history is recorded and retention deletes nothing",
				"table", store.HistoryTable(), "err", err)
		}
		// Fencing needs the epoch column: a table from before it gets it
		// (a no-op when current), and one this role cannot upgrade stops
		// the relay, saying how to fix it.
		if err := store.MigrateLeader(ctx); err != nil {
			return err
		}
		// What the outbox is (its OID, whether partitioned): inserts under
		// other names are placed against it.
		outbox, _ := sql.ParseTable(r.cfg.Table) // validated by New
		r.placer = placement.New(pool, placement.Config{Outbox: outbox, Publication: r.cfg.Replication.Publication,
			Others: r.cfg.OtherTables, OthersKey: r.cfg.OtherTablesKey})
		if err := r.placer.Init(ctx); err != nil {
			return err
		}
		// A mapping that cannot work fails now, in check's words, not at
		// the first event as if the table had changed while running.
		if r.placer.OID() == 0 {
			return fmt.Errorf("%w: %s: create it, or point the relay at your outbox table", ErrOutboxMissing, r.cfg.Table)
		}
		if err := placement.CheckColumns(ctx, pool, r.placer.OID(), r.placer.Outbox(), r.router.Needs()); err != nil {
			return err
		}
		// Retention that cannot work says so at start, not once a minute.
		if r.cfg.Retention.Retention > 0 {
			if err := retention.CheckTable(ctx, pool, r.cfg.Table); err != nil {
				return field.Within("Retention", err)
			}
			if err := retention.CheckPartitions(ctx, pool, r.cfg.Table, r.cfg.Retention.Partitions); err != nil {
				return field.Within("Retention", err)
			}
		}
		return gt.load(ctx)
	})
	return start, srv, store, rstore, gt, err
}

// retryWorker builds the retry worker. It writes to Kafka beside the
// pipeline: a sink and a router of its own, as neither is safe for concurrent
// use. Per-aggregate order holds because the pipeline writes no event of a
// lane the worker has rows of (the gate), which the worker releases.
func (r *Relay) retryWorker(rstore *retry.Store, gt *gate) (*retry.Worker, *sink.Kafka, error) {
	wsink, err := sink.New(r.cfg.Sink)
	if err != nil {
		return nil, nil, err
	}
	wrouter, err := router.New(r.cfg.Router)
	if err != nil {
		wsink.Close()
		return nil, nil, err
	}
	wcfg := r.cfg.Retry
	wcfg.Store, wcfg.Topic, wcfg.Logger = rstore, wrouter.Topic, r.log.With("component", "retry")
	wcfg.Sink = guardedSink{lease: r.lease, sink: wsink}
	wcfg.Headers = wrouter.Headers()
	wcfg.Delivered = func(agg string) {
		// Called from the worker's goroutine while it runs: bounded, as a
		// hung query must not hold up the worker.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		gt.release(ctx, []string{agg})
	}
	worker, err := retry.NewWorker(wcfg)
	if err != nil {
		wsink.Close()
		return nil, nil, err
	}
	return worker, wsink, nil
}

// runStream runs the replication stream until streamCtx ends; stopped by the
// committer after the final checkpoint (gctx still live), that is no error.
func (r *Relay) runStream(streamCtx, gctx context.Context, start pglogrepl.LSN, out chan<- replication.Batch) error {
	err := r.stream.Run(streamCtx, start, out)
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

// Ready reports whether the relay is streaming and delivering: what /readyz
// serves. It fails while the replication connection is down, while Kafka is
// unreachable (the writer is retrying a broker-wide failure, or a fresh ping
// gets no answer), while the retry table or the checkpoint table refuses
// writes, and while the pipeline is stalled (see health). The error lists
// every failing check.
//
// A standby is ready while it reaches Postgres: it is doing its job, which is
// to wait and to be able to take over. (A probe that failed a standby would
// have Kubernetes restart the very replica meant to take over.)
func (r *Relay) Ready(ctx context.Context) error {
	t := r.live.Load()
	if t == nil {
		pool := r.pool.Load()
		if pool == nil {
			return errors.New("starting")
		}
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("standby: postgres unreachable, so this relay could not take over: %w", err)
		}
		return nil
	}
	since, cause := r.sink.Outage()
	st := t.stream.Stats()
	_, why := t.health.failing(time.Now(), st.Streaming, since, cause)
	if t.stopped != nil && st.ConfirmedLSN <= t.stopped.Before {
		why = append(why, fmt.Sprintf("the last run stopped before the transaction committed at %s and this one has not passed it yet (it stops there again unless the fix was applied): %s",
			t.stopped.Before, t.stopped.Reason))
	}
	if since.IsZero() {
		if err := r.sink.Ping(ctx); err != nil {
			why = append(why, fmt.Sprintf("kafka unreachable: %v", err))
		}
	}
	if len(why) > 0 {
		return errors.New(strings.Join(why, "; "))
	}
	return nil
}

// Role returns "leader" while this relay streams the slot, else "standby"
// with who holds the slot.
func (r *Relay) Role() string {
	if r.live.Load() != nil {
		return "leader"
	}
	if who := r.standby.Load(); who != nil {
		return "standby: " + *who
	}
	return "standby"
}

// pumpStats turns the stream's and the retry worker's counters into metrics,
// and samples the health checks, once a second.
func (r *Relay) pumpStats(ctx context.Context, worker *retry.Worker) {
	var last replication.Stats
	var lastW retry.WorkerStats
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := r.stream.Stats()
		now := time.Now()
		r.health.sample(st.ConfirmedLSN, st.ServerWALEnd, now)
		since, cause := r.sink.Outage()
		failing, why := r.health.failing(now, st.Streaming, since, cause)
		r.m.SetHealth(failing, r.health.stalledFor(now))
		r.health.warn(now, why)
		if r.m == nil {
			continue
		}
		for range st.Reconnects - last.Reconnects {
			r.m.Reconnected()
		}
		for range st.IgnoredUpdates - last.IgnoredUpdates {
			r.m.IgnoredChange("update")
		}
		for range st.IgnoredDeletes - last.IgnoredDeletes {
			r.m.IgnoredChange("delete")
		}
		for range st.IgnoredTruncates - last.IgnoredTruncates {
			r.m.IgnoredChange("truncate")
		}
		r.m.UnsolicitedMessages("stream_abort", st.SkippedStreamAborts-last.SkippedStreamAborts)
		r.m.UnsolicitedMessages("unknown", st.SkippedUnknownMessages-last.SkippedUnknownMessages)
		last = st
		ws := worker.Stats()
		r.m.RetryWorked(ws.Attempted-lastW.Attempted, ws.Succeeded-lastW.Succeeded, ws.DeadLettered-lastW.DeadLettered)
		lastW = ws
		r.m.SetInFlight(r.win.usage())
	}
}

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// resolveStart decides where streaming starts: max(saved checkpoint, the
// slot's confirmed_flush_lsn), or the operator's StartLSN if it is ahead. It
// refuses a slot the checkpoint does not explain (pgslot.Verify, DESIGN
// invariant 14) with a *pgslot.GapError, and returns the server it checked.
func (r *Relay) resolveStart(ctx context.Context, pool *pgxpool.Pool, store *checkpoint.Store) (pglogrepl.LSN, pgslot.Server, error) {
	slot := r.cfg.Replication.Slot
	sl, err := pgslot.Read(ctx, pool, slot)
	if errors.Is(err, pgslot.ErrNotFound) {
		// With a checkpoint, a gap (the slot was dropped, or lost in a
		// failover); without one, setup has not been run.
		cp, lerr := store.Load(ctx, slot)
		if lerr != nil || cp.LSN == 0 {
			return 0, pgslot.Server{}, err
		}
		srv, ierr := r.identify(ctx)
		if ierr != nil {
			return 0, pgslot.Server{}, ierr
		}
		r.m.SetSlotGap(true)
		return 0, pgslot.Server{}, pgslot.Verify(cp, pgslot.Slot{Name: slot, Missing: true}, srv)
	}
	if err != nil {
		return 0, pgslot.Server{}, err
	}
	if sl.Plugin != "pgoutput" {
		return 0, pgslot.Server{}, fmt.Errorf("%w: slot %q uses plugin %q: drop it and create it with pgoutput, or use a pgoutput slot", replication.ErrSlotPlugin, slot, sl.Plugin)
	}
	if sl.Database != sl.CurrentDatabase {
		return 0, pgslot.Server{}, fmt.Errorf("%w: slot %q belongs to database %q, not %q: connect to that database, or use a slot of this one", replication.ErrSlotDatabase, slot, sl.Database, sl.CurrentDatabase)
	}
	slotLSN, err := sl.Confirmed()
	if err != nil {
		return 0, pgslot.Server{}, err
	}
	cp, err := store.Load(ctx, slot)
	if err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return 0, pgslot.Server{}, fmt.Errorf("load checkpoint from %s: %w", r.cfg.CheckpointTable, err)
	}
	srv, err := r.identify(ctx)
	if err != nil {
		return 0, pgslot.Server{}, err
	}
	if err := r.checkFailover(ctx, pool); err != nil {
		return 0, pgslot.Server{}, err
	}
	if err := r.fenceSuperseded(ctx, srv, cp.LSN); err != nil {
		r.m.SetSlotGap(true)
		return 0, pgslot.Server{}, err
	}
	if err := pgslot.Verify(cp, sl, srv); err != nil {
		var gap *pgslot.GapError
		// An operator's --start-lsn at or past the slot is an explicit
		// skip of what lies before it (logged below): a slot ahead of the
		// checkpoint is then expected. Nothing else is waived.
		if !errors.As(err, &gap) || gap.Cause != pgslot.CauseSlotAhead || r.cfg.StartLSN < slotLSN {
			r.m.SetSlotGap(true)
			return 0, pgslot.Server{}, err
		}
	}
	r.m.SetSlotGap(false)
	if cp.LSN != 0 && cp.Server.SystemID == "" && slotLSN > cp.LSN {
		r.log.Warn("the slot is ahead of the checkpoint, which an earlier version saved without recording idle advances: "+
			"this start cannot tell an idle slot from one recreated since; from now on it can",
			"slot", slot, "checkpoint", cp.LSN.String(), "slot_confirmed_flush_lsn", slotLSN.String())
	}
	start, err := checkpoint.Start(cp.LSN, slotLSN, r.cfg.StartLSN)
	if err != nil {
		return 0, pgslot.Server{}, err
	}
	if r.cfg.StartLSN != 0 {
		// A position the WAL has not reached yet would skip every event
		// committed until it does, silently: refuse it unless forced.
		cur, err := pglogrepl.ParseLSN(sl.CurrentWALLSN)
		if err != nil {
			return 0, pgslot.Server{}, fmt.Errorf("parse the current WAL position %q: %w", sl.CurrentWALLSN, err)
		}
		if r.cfg.StartLSN > cur {
			if !r.cfg.StartLSNForce {
				return 0, pgslot.Server{}, &FutureStartError{Requested: r.cfg.StartLSN, Current: cur}
			}
			r.log.Warn("the start LSN is AHEAD of the server's WAL, as forced: every event committed before the WAL reaches it is skipped for good",
				"start_lsn", r.cfg.StartLSN.String(), "current_wal_lsn", cur.String())
		}
		r.log.Warn("starting at the operator's start LSN: transactions committed before it are NOT delivered",
			"start_lsn", start.String(), "checkpoint", cp.LSN.String(), "slot_confirmed_flush_lsn", slotLSN.String())
	}
	if start > cp.LSN {
		// The stream confirms its start position to the slot at once: the
		// checkpoint must explain it first, or the next start would take
		// the slot for one moved by something else.
		if err := store.Save(ctx, slot, start, time.Time{}); err != nil {
			return 0, pgslot.Server{}, err
		}
	}
	r.log.Info("resuming", "start_lsn", start.String(), "checkpoint", cp.LSN.String(),
		"slot_confirmed_flush_lsn", slotLSN.String(), "system_identifier", srv.SystemID, "timeline", srv.Timeline)
	return start, srv, nil
}

// identify asks the server, over a replication connection of its own, for
// its system identifier, timeline and timeline history (pgslot.Identify).
func (r *Relay) identify(ctx context.Context) (pgslot.Server, error) {
	// The stream connects the same way: without the REPLICATION attribute
	// neither can.
	conn, err := r.replicationConn(ctx, "outbox-relay identify")
	if err != nil {
		return pgslot.Server{}, fmt.Errorf("identify the server: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pgslot.Identify(ctx, conn)
}

// idleAdvance passes the stream's idle positions (replication.Config.Idle)
// to the term's committer, which saves one as the checkpoint before
// confirming it. Offers before the committer exists are dropped: the next
// keepalive offers again.
type idleAdvance struct{ com atomic.Pointer[committer] }

func (a *idleAdvance) offer(lsn pglogrepl.LSN) {
	if c := a.com.Load(); c != nil {
		c.idle(lsn)
	}
}

// persist runs write until it succeeds or ctx is done, with capped
// exponential backoff and jitter, logging the first failure and every tenth.
// It is for writes to Postgres that must be durable before an LSN may be
// confirmed: giving up is not an option, waiting is.
func persist(ctx context.Context, log *slog.Logger, what string, write func() error) error {
	return retryIf(ctx, log, what, nil, write)
}

// unreachable reports whether err means Postgres cannot be reached now but
// may be soon: no connection, a connection lost, or the server shutting down
// or starting up. Authentication and permission failures are not.
func unreachable(err error) bool {
	if tlsRefused(err) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "57P01", "57P02", "57P03": // admin shutdown, crash shutdown, cannot connect now
			return true
		}
		return false
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) || errors.As(err, &netErr) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// retryIf runs fn until it succeeds, ctx is done, or it fails with an error
// retryable does not accept (nil accepts all), with capped exponential
// backoff and jitter, logging the first failure and every tenth.
func retryIf(ctx context.Context, log *slog.Logger, what string, retryable func(error) bool, fn func() error) error {
	bo := backoff.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			if attempt > 1 {
				log.Info(what+": done after retrying", "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if retryable != nil && !retryable(err) {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			log.Warn(what+": failed, retrying", "attempt", attempt, "err", err)
		}
		t := time.NewTimer(bo.Next())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}
