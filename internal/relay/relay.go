// Package relay wires replication, router, sink and checkpoint into the
// streaming pipeline of outbox-relay:
//
//	replication.Stream ─batches→ routeStage ─chunks→ writer (Sink, gate, retry table) ─acks→ committer (lease: fenced checkpoint save, Stream.Confirm)
//
// Each stage is a type that owns its state and runs on its own goroutine, so
// decoding, routing and Kafka writes overlap; they meet only through channels
// and the small interfaces of pipeline.go and package leader, wired by newPipeline.
// What lives for one term of leadership is one value (term.go), built once
// and dropped whole when the term ends. Invariants enforced here:
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
//     behind it (the gate). The gate holds at most 10,000 such aggregates in
//     memory and asks the retry table about the others, so its memory is
//     bounded however many wait and none is ever overtaken.
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
//   - Every outbox table (Config.Table, then Config.Tables) is read on the
//     one slot, its rows routed by its own router; an insert is the table's
//     whose name it arrives under, and per-aggregate order holds per table.
//     With Config.Source messages or both, a transactional logical decoding
//     message is an event in its place in its transaction, under every rule
//     above (its content that is no event goes to the retry table, dead);
//     with messages only, an insert the publication delivers stops the relay
//     before it.
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
//   - With exactly-once delivery (package eos) a chunk's complete transactions
//     are written in one Kafka transaction with their checkpoint record, and
//     the chunk reaches the committer only after the Kafka commit: the
//     Kafka checkpoint is never behind the Postgres one, and a term drops
//     what it covers. A term takes the slot's transactional id only once it
//     leads, which fences every former leader's producer in Kafka.
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

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/eos"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
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
	return fmt.Sprintf("start position: %v; give a position at or before %s, or force it if that is really meant",
		&pgslot.BeyondWALError{LSN: e.Requested, Current: e.Current}, e.Current)
}

// Relay streams outbox inserts from a replication slot to Kafka. What lives
// for one term of leadership is a term (term.go), built by each term and
// passed to lead; a Relay holds only what outlives terms.
type Relay struct {
	cfg       Config
	log       *slog.Logger
	routers   []*router.Router // per outbox table (Config.outboxes), validated; each term routes with its own
	sink      Sink
	retrySink Sink
	// bufferSink is the WAL buffer's drain's with exactly-once delivery
	// (eosbuffer.go); nil at least once, where the drain uses sink.
	bufferSink Sink
	m          *metrics.Metrics             // nil records nothing
	pool       atomic.Pointer[pgxpool.Pool] // set by Run; Ready reads it from any goroutine

	// timeouts watches exactly-once transactions that outlive their
	// timeout, across terms (eos.Timeouts); nil at least once.
	timeouts *eos.Timeouts

	// live is the term that leads, for Ready; nil while standing by.
	live    atomic.Pointer[term]
	standby atomic.Pointer[string] // who holds the slot, while standing by
	stopped atomic.Pointer[string] // why Run stopped, while it lingers (linger)
	// leadProblem is why this standby could not take over (couldLead),
	// nil when it could or has not looked yet.
	leadProblem atomic.Pointer[string]

	// next is the mode the next term asked for (walbuffer.go); Run's
	// goroutine only.
	next termMode
}

// Sinks are the sinks a Relay writes with. A sink is not safe for
// concurrent Writes, so the pipeline and the retry worker have one each. The
// caller builds them, and closes them once Run or Recover returned.
type Sinks struct {
	Stream Sink // the pipeline's, and a refill's
	Retry  Sink // the retry worker's
	// Drain is the WAL buffer's drain's with exactly-once delivery
	// (Config.MaxRetainedWAL): never transactional, it delivers the
	// buffered range at least once beside the retry worker. Required then;
	// unused at least once, where the drain writes with Stream.
	Drain Sink
}

// An authChecker is a Sink that can tell, before anything streams, whether
// the broker refuses its credentials or TLS settings: sink.Kafka's CheckAuth
// (an error naming the setting to fix; nil when they are accepted, and also
// when no broker answers, which is an outage for Write to wait out).
type authChecker interface {
	CheckAuth(ctx context.Context) error
}

// checkAuth asks the stream's sink, when it can tell: settings Kafka refuses
// need an operator, so the relay stops before streaming rather than hold
// every event as a Kafka outage.
func (r *Relay) checkAuth(ctx context.Context) error {
	if a, ok := r.sink.(authChecker); ok {
		return a.CheckAuth(ctx)
	}
	return nil
}

// New validates cfg and fills defaults. It neither dials nor starts goroutines.
func New(cfg Config, sinks Sinks) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if sinks.Stream == nil || sinks.Retry == nil {
		return nil, errors.New("relay: a sink for the stream and one for the retry worker are required")
	}
	if _, ok := sinks.Stream.(interface {
		eos.TxnSink
		eos.TimeoutSink
	}); !ok && cfg.Delivery == DeliveryExactlyOnce {
		return nil, errors.New("relay: exactly-once delivery needs a transactional stream sink (sink.Kafka with a TransactionalID)")
	}
	if cfg.Delivery == DeliveryExactlyOnce && cfg.MaxRetainedWAL > 0 && sinks.Drain == nil {
		return nil, errors.New("relay: exactly-once delivery with a WAL bound (MaxRetainedWAL) needs a third, non-transactional sink for the WAL buffer's drain (Sinks.Drain)")
	}
	rts, err := cfg.routers()
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, log: cfg.Logger, routers: rts, sink: sinks.Stream, retrySink: sinks.Retry, m: cfg.Metrics}
	if cfg.Delivery == DeliveryExactlyOnce {
		r.bufferSink = sinks.Drain
	}
	if cfg.Delivery == DeliveryExactlyOnce {
		r.timeouts = eos.NewTimeouts(cfg.Sink.TransactionTimeout, r.log)
	}
	r.m.SetRole(r.Role)
	if cfg.Metrics != nil {
		// The producers' figures (per broker: latency, requests in flight).
		for _, s := range []any{sinks.Stream, sinks.Retry, sinks.Drain} {
			if o, ok := s.(interface{ SetObserver(sink.Observer) }); ok {
				o.SetObserver(cfg.Metrics)
			}
		}
	}
	// The counters of the topics the configuration names exist at 0 from
	// start-up, so that increase() counts their first delivery; a topic the
	// template makes from the data appears with its first event.
	for _, o := range cfg.outboxes() {
		for _, topic := range namedTopics(o.router) {
			r.m.Topic(topic)
		}
	}
	return r, nil
}

// namedTopics are the topics rc names literally: its overrides' and a
// template without placeholders.
func namedTopics(rc router.Config) []string {
	var out []string
	for _, topic := range rc.Overrides {
		out = append(out, topic)
	}
	if rc.TopicRegex == "" && rc.Topic != "" && !strings.Contains(rc.Topic, "{") {
		out = append(out, rc.Topic)
	}
	return out
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
	// A TLS failure says what to change in postgres.dsn (see secure.go).
	defer func() { err = explainTLS(err) }()
	// Stopped while writing again a transaction the broker aborted on its
	// timeout: say so, with its exit code.
	defer func() {
		err = r.timeouts.Stopped(err, errors.Is(err, context.Canceled) || errors.Is(err, ErrDrainTimeout))
	}()
	if err := r.checkAuth(ctx); err != nil {
		return err
	}
	pool, pooled, err := sqlconn.NewHotPool(ctx, r.cfg.Replication.DSN)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	if pooled {
		r.log.Info("postgres.dsn leads to a connection pooler: SQL uses unnamed statements (works in transaction mode); the replication connection goes to postgres.replication_dsn")
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
				// Under its field, so that the operator reads the key (and
				// the command line's hint the flag) that chose the address.
				failRun(&field.Error{Field: "MetricsListen", Reason: err.Error(), Err: err})
			}
			return nil
		})
		// Runs before the server stops (defers run last first).
		defer func() { r.linger(ctx, rctx, err) }()
	}
	for {
		if err := r.standBy(rctx, pool); err != nil {
			return runCause(rctx, err)
		}
		t, err := r.newTerm(rctx, pool)
		if err == nil {
			err = r.lead(rctx, pool, t)
		}
		if errors.Is(err, leader.ErrStandBy) && rctx.Err() == nil {
			r.log.Warn("no longer leading: standing by", "slot", r.cfg.Replication.Slot, "reason", err)
			continue
		}
		if sw := (*switchError)(nil); errors.As(err, &sw) && rctx.Err() == nil {
			r.log.Warn("WAL buffer: leading again from the checkpoint, "+sw.to.String(), "slot", r.cfg.Replication.Slot, "reason", sw.why)
			r.next = sw.to
			continue
		}
		if errors.Is(err, eos.ErrRestart) && rctx.Err() == nil {
			if te := (*TxnTimeoutError)(nil); errors.As(err, &te) {
				// Not a routine restart: the operator should raise a setting.
				r.log.Error(te.Error(), "slot", r.cfg.Replication.Slot, "kafka.transaction_timeout", te.Configured.String(),
					"transaction.max.timeout.ms", te.Max.Milliseconds(), "retry_timeout", te.Retrying.String())
				continue
			}
			r.log.Warn("leading again from the checkpoint", "slot", r.cfg.Replication.Slot, "reason", err)
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

// linger keeps the process observable after Run stopped for an operator
// (Config.StopLinger): /readyz answers 503 with the cause, ready and active
// are 0, slot_gap and the stop counters stay as set, the slot and retry
// gauges are sampled on, until ctx ends or the linger is over. Other errors
// (the metrics server failing, ctx cancelled) return at once.
func (r *Relay) linger(ctx, rctx context.Context, err error) {
	if r.cfg.StopLinger <= 0 || r.cfg.MetricsListen == "" || err == nil || ctx.Err() != nil || context.Cause(rctx) != nil {
		return
	}
	// A pgoutput message the relay cannot decode is such a stop too: it is
	// not retried (the same bytes would arrive again), and exiting at once
	// would end the process before decode_errors_total 1 was scraped.
	var se *stopError
	var de *replication.DecodeError
	if !errors.Is(err, pgslot.ErrGap) && !errors.As(err, &se) && !errors.As(err, &de) {
		return
	}
	why := "stopped: " + err.Error()
	r.stopped.Store(&why)
	r.m.SetStopped()
	r.log.Error("stopped until an operator acts: /readyz answers 503 and /metrics stays up so that monitoring sees why; exiting after health.stop_linger, or at once on SIGTERM",
		"health.stop_linger", r.cfg.StopLinger.String(), "err", err)
	// The slot and retry gauges go on being sampled while the relay lingers:
	// the term's sampler ended with the term, often before it saw what
	// stopped it (a slot invalidated by max_slot_wal_keep_size ends the term
	// within milliseconds of the checkpoint that removed its WAL, so
	// wal_status lost was never exported and OutboxRelaySlotLost could not
	// fire, issue 37), and an operator's repair shows while it lingers.
	var sampling errgroup.Group
	sctx, stopSampling := context.WithCancel(ctx)
	defer func() { stopSampling(); sampling.Wait() }()
	if pool := r.pool.Load(); pool != nil {
		if err := r.sampleMetrics(sctx, &sampling, pool); err != nil {
			r.log.Warn("cannot sample the slot's metrics while stopped", "err", err)
		}
	}
	t := time.NewTimer(r.cfg.StopLinger)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
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

// Ready reports whether the relay is streaming and delivering: what /readyz
// serves. It fails while the replication connection is down, while Kafka is
// unreachable (the writer is retrying a broker-wide failure, or a fresh ping
// gets no answer), while the retry table or the checkpoint table refuses
// writes, while the pipeline is stalled (see health), and, with
// exactly-once, while a transaction the broker aborted on its timeout is not
// yet delivered (eos.Timeouts). The error lists every failing check.
//
// A standby is ready while it reaches Postgres and could lead (couldLead:
// a replication connection, the privileges leading needs): it is doing its
// job, which is to wait and to be able to take over. (A probe that failed a standby would
// have Kubernetes restart the very replica meant to take over.)
func (r *Relay) Ready(ctx context.Context) error {
	if why := r.stopped.Load(); why != nil {
		return errors.New(*why)
	}
	// A transaction the broker aborted on its timeout fails it until it is
	// delivered, between the terms of its attempts too.
	stuck, _ := r.timeouts.Problem(time.Now())
	t := r.live.Load()
	if t == nil && stuck != "" {
		return errors.New(stuck)
	}
	if t == nil {
		pool := r.pool.Load()
		if pool == nil {
			return errors.New("starting")
		}
		if err := pool.Ping(ctx); err != nil {
			return fmt.Errorf("standby: postgres unreachable, so this relay could not take over: %w", err)
		}
		if p := r.leadProblem.Load(); p != nil {
			return errors.New("standby: " + *p)
		}
		return nil
	}
	since, cause := r.outage(t)
	st := t.stream.Stats()
	_, why := t.pipe.health.failing(time.Now(), st, since, cause)
	if t.stopped != nil && st.ConfirmedLSN <= t.stopped.Before {
		why = append(why, fmt.Sprintf("the last run stopped before the transaction committed at %s and this one has not passed it yet (it stops there again unless the fix was applied): %s",
			t.stopped.Before, t.stopped.Reason))
	}
	if stuck != "" {
		why = append(why, stuck)
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

func ignoreCanceled(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
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
