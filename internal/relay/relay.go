// Package relay wires replication, router, sink and checkpoint into the
// streaming pipeline of outbox-relay:
//
//	replication.Stream ─batches→ route ─chunks→ write (sink.Kafka) ─acks→ commit (checkpoint.Store, Stream.Confirm)
//
// Each stage runs on its own goroutine, so decoding, routing and Kafka writes
// overlap. Invariants enforced here:
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
//     (event) from the router to the retry table; it is never read back from
//     Kafka headers.
//   - A change of the outbox table that leaves a mapped column missing stops
//     the relay before the first event it affects is confirmed
//     (router.SchemaError): no event is stored or sent incomplete.
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
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
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
	return fmt.Sprintf("--start-lsn %s is beyond the server's current WAL position %s: every event committed before the WAL reaches it would be skipped; give a position at or before %s, or add --force if that is really meant",
		e.Requested, e.Current, e.Current)
}

// Relay streams outbox inserts from a replication slot to Kafka.
type Relay struct {
	cfg    Config
	log    *slog.Logger
	router *router.Router
	sink   *sink.Kafka
	stream *replication.Stream
	win    *window
	schema string // outbox table, split
	table  string

	isOutbox       map[*replication.Relation]bool // route stage only
	lastBadHeaders time.Time                      // route stage only

	m      *metrics.Metrics // nil records nothing
	tableM *metrics.Table
	gate   *gate
	health *health
}

// New validates cfg and fills defaults. It neither dials nor starts goroutines.
func New(cfg Config) (*Relay, error) {
	if err := cfg.validate(); err != nil {
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
	schema, table, _ := strings.Cut(cfg.Table, ".")
	return &Relay{
		cfg:      cfg,
		log:      cfg.Logger,
		router:   rt,
		sink:     sk,
		stream:   replication.New(cfg.Replication),
		win:      newWindow(cfg.MaxInFlightEvents, cfg.MaxInFlightBytes),
		schema:   schema,
		table:    table,
		isOutbox: make(map[*replication.Relation]bool),
		m:        cfg.Metrics,
		tableM:   cfg.Metrics.Table(cfg.Table),
		health:   newHealth(cfg.StallAfter, cfg.Logger),
	}, nil
}

// Run streams until ctx is cancelled or a non-retryable error occurs. Lost
// connections to Postgres and Kafka outages are retried inside; Run returns
// for what needs an operator (a missing slot, an unroutable event, bad
// credentials). After ctx is cancelled it drains and saves the final
// checkpoint, then returns an error that wraps context.Canceled, or one that
// wraps ErrDrainTimeout if the drain took longer than ShutdownTimeout.
func (r *Relay) Run(ctx context.Context) error {
	defer r.sink.Close()
	pool, err := pgxpool.New(ctx, r.cfg.Replication.DSN)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()
	store := checkpoint.New(pool, r.cfg.CheckpointTable)

	rstore, err := retry.NewStore(pool, r.cfg.RetryTable)
	if err != nil {
		return fmt.Errorf("retry table: %w", err)
	}
	r.gate = &gate{store: rstore, log: r.log}
	// Postgres may be down or restarting when the relay starts (a host
	// reboot starts both): wait for it, as the stream does later. What needs
	// an operator (no slot, no table, a bad password) fails at once.
	var start pglogrepl.LSN
	err = retryIf(ctx, r.log, "postgres unreachable at start-up", unreachable, func() error {
		var err error
		if start, err = r.resolveStart(ctx, pool, store); err != nil {
			return err
		}
		// A retry table made by an earlier version lacks what lets it
		// store every event: upgrade it (a no-op, without locks, when
		// current). Without the rights to, say so; setup can do it.
		if err := rstore.Migrate(ctx); err != nil {
			if unreachable(err) {
				return err
			}
			r.log.Warn("cannot upgrade the retry table: run \"outbox-relay setup\" as its owner", "table", r.cfg.RetryTable, "err", err)
		}
		return r.gate.load(ctx)
	})
	if err != nil {
		return err
	}
	// The worker writes to Kafka beside the pipeline: a sink and a router of
	// its own, as neither is safe for concurrent use. Per-aggregate order
	// holds because the pipeline writes no event of an aggregate the worker
	// has rows of (the gate).
	wsink, err := sink.New(r.cfg.Sink)
	if err != nil {
		return err
	}
	defer wsink.Close()
	wrouter, err := router.New(r.cfg.Router)
	if err != nil {
		return err
	}

	// The pipeline outlives ctx by the drain: it runs on a context of its own
	// that only a failure or the drain deadline cancels.
	pctx, fail := context.WithCancelCause(context.WithoutCancel(ctx))
	defer fail(nil)
	stopDeadline := context.AfterFunc(ctx, func() {
		r.log.Info("shutdown requested: draining", "timeout", r.cfg.ShutdownTimeout.String())
		t := time.AfterFunc(r.cfg.ShutdownTimeout, func() { fail(ErrDrainTimeout) })
		context.AfterFunc(pctx, func() { t.Stop() })
	})
	defer stopDeadline()

	g, gctx := errgroup.WithContext(pctx)
	streamCtx, stopStream := context.WithCancel(gctx)
	defer stopStream()
	// Batches in these channels are outside the window (it is taken when a
	// batch is routed): keep them short, they only smooth hand-overs.
	batches := make(chan replication.Batch, 4)
	chunks := make(chan *chunk, 4)
	com := &committer{
		store: store, stream: r.stream, win: r.win, log: r.log, m: r.m,
		slot: r.cfg.Replication.Slot, interval: r.cfg.CheckpointInterval,
		urgent: r.cfg.MaxInFlightEvents / 2, saved: start,
		notify: make(chan struct{}, 1), health: r.health,
	}

	if r.m != nil {
		sampler, err := metrics.NewSampler(r.m, pool, metrics.SamplerConfig{
			Slot: r.cfg.Replication.Slot, RetryTable: r.cfg.RetryTable, Logger: r.log})
		if err != nil {
			return fmt.Errorf("metrics sampler: %w", err)
		}
		// These live as long as the stream: until the final checkpoint.
		g.Go(func() error { return ignoreCanceled(sampler.Run(streamCtx)) })
		g.Go(func() error { return ignoreCanceled(r.m.Serve(streamCtx, r.cfg.MetricsListen, r.Ready)) })
	}
	g.Go(func() error {
		err := r.stream.Run(streamCtx, start, batches)
		var de *replication.DecodeError
		if errors.As(err, &de) {
			r.m.DecodeError()
		}
		if streamCtx.Err() != nil && gctx.Err() == nil {
			return nil // stopped by us after the final checkpoint
		}
		return err
	})
	wcfg := r.cfg.Retry
	wcfg.Store, wcfg.Sink, wcfg.Topic, wcfg.Logger = rstore, wsink, wrouter.Topic, r.log.With("component", "retry")
	wcfg.Delivered = func(agg string) { r.gate.release(streamCtx, []string{agg}) }
	worker, err := retry.NewWorker(wcfg)
	if err != nil {
		return err
	}
	g.Go(func() error { return ignoreCanceled(worker.Run(streamCtx)) })
	g.Go(func() error { r.pumpStats(streamCtx, worker); return nil })
	g.Go(func() error { r.gate.sweep(streamCtx, 30*time.Second); return nil })
	g.Go(func() error { return r.route(ctx.Done(), gctx, batches, chunks) })
	g.Go(func() error { return r.write(gctx, chunks, com) })
	g.Go(func() error {
		err := com.run(gctx)
		// The final checkpoint is saved and confirmed: now the stream may send
		// its last status update and close.
		stopStream()
		return err
	})
	err = g.Wait()
	if cause := context.Cause(pctx); errors.Is(cause, ErrDrainTimeout) {
		return fmt.Errorf("%w after %s: the events not yet confirmed will be sent again on the next start",
			ErrDrainTimeout, r.cfg.ShutdownTimeout)
	}
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		r.log.Info("stopped", "checkpoint", com.saved.String())
		return ctx.Err()
	}
	return errors.New("relay: pipeline stopped without a reason") // unreachable: the stream only returns on error or stop
}

// Ready reports whether the relay is streaming and delivering: what /readyz
// serves. It fails while the replication connection is down, while Kafka is
// unreachable (the writer is retrying a broker-wide failure, or a fresh ping
// gets no answer), while the retry table or the checkpoint table refuses
// writes, and while the pipeline is stalled (see health). The error lists
// every failing check.
func (r *Relay) Ready(ctx context.Context) error {
	since, cause := r.sink.Outage()
	_, why := r.health.failing(time.Now(), r.stream.Stats().Streaming, since, cause)
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
// slot's confirmed_flush_lsn), or the operator's StartLSN if it is ahead.
func (r *Relay) resolveStart(ctx context.Context, pool *pgxpool.Pool, store *checkpoint.Store) (pglogrepl.LSN, error) {
	slot := r.cfg.Replication.Slot
	var plugin, confirmed string
	err := pool.QueryRow(ctx, `SELECT coalesce(plugin, ''), coalesce(confirmed_flush_lsn::text, '0/0')
		FROM pg_replication_slots WHERE slot_name = $1 AND database = current_database()`, slot).Scan(&plugin, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("replication slot %q does not exist in this database: run \"outbox-relay setup\" to create it", slot)
	}
	if err != nil {
		return 0, fmt.Errorf("read replication slot %q: %w", slot, err)
	}
	if plugin != "pgoutput" {
		return 0, fmt.Errorf("replication slot %q uses plugin %q, not pgoutput: drop it and run \"outbox-relay setup\", or set postgres.slot to a pgoutput slot", slot, plugin)
	}
	slotLSN, err := pglogrepl.ParseLSN(confirmed)
	if err != nil {
		return 0, fmt.Errorf("parse confirmed_flush_lsn %q of slot %q: %w", confirmed, slot, err)
	}
	cp, err := store.Load(ctx, slot)
	if err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return 0, fmt.Errorf("load checkpoint (run \"outbox-relay setup\" if the table %q is missing): %w", r.cfg.CheckpointTable, err)
	}
	start, err := checkpoint.Start(cp.LSN, slotLSN, r.cfg.StartLSN)
	if err != nil {
		return 0, err
	}
	if r.cfg.StartLSN != 0 {
		// A position the WAL has not reached yet would skip every event
		// committed until it does, silently: refuse it unless forced.
		var current string
		if err := pool.QueryRow(ctx, `SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text`).Scan(&current); err != nil {
			return 0, fmt.Errorf("read the current WAL position: %w", err)
		}
		cur, err := pglogrepl.ParseLSN(current)
		if err != nil {
			return 0, fmt.Errorf("parse the current WAL position %q: %w", current, err)
		}
		if r.cfg.StartLSN > cur {
			if !r.cfg.StartLSNForce {
				return 0, &FutureStartError{Requested: r.cfg.StartLSN, Current: cur}
			}
			r.log.Warn("--start-lsn is AHEAD of the server's WAL, as forced: every event committed before the WAL reaches it is skipped for good",
				"start_lsn", r.cfg.StartLSN.String(), "current_wal_lsn", cur.String())
		}
		r.log.Warn("starting at the operator's --start-lsn: transactions committed before it are NOT delivered",
			"start_lsn", start.String(), "checkpoint", cp.LSN.String(), "slot_confirmed_flush_lsn", slotLSN.String())
	}
	r.log.Info("resuming", "start_lsn", start.String(), "checkpoint", cp.LSN.String(),
		"slot_confirmed_flush_lsn", slotLSN.String())
	return start, nil
}

// A chunk is what the route stage hands the writer: messages in commit order
// and what their acknowledgement allows to confirm.
type chunk struct {
	msgs  []kafka.Message // what the sink writes
	evs   []event         // the envelope of each of msgs, same index
	bytes int             // window bytes held by these messages

	endLSN     pglogrepl.LSN // end of the last transaction completed in this chunk, 0 if none
	commitTime time.Time     // its commit time
	covered    int           // events up to and including that transaction
	trailing   int           // events after it (a transaction still open at the end of the chunk)

	commits []commitRun    // commit of each run of msgs: latency histogram
	fails   []routeFailure // events the router refused, in order
}

// An event is what the pipeline knows of a routed event beyond its Kafka
// message: its identity from its row and its place in the WAL. The retry
// table is written from it, never from the message's headers.
type event struct {
	msg router.Message
	lsn pglogrepl.LSN // commit LSN of its transaction
	at  time.Time     // commit time
	n   int           // its position in the transaction: with lsn, its unique key
}

// A commitRun is n consecutive messages of one transaction.
type commitRun struct {
	at  time.Time
	lsn pglogrepl.LSN
	n   int
}

func (c *chunk) addCommit(lsn pglogrepl.LSN, at time.Time) {
	if n := len(c.commits); n > 0 && c.commits[n-1].lsn == lsn {
		c.commits[n-1].n++
		return
	}
	c.commits = append(c.commits, commitRun{at: at, lsn: lsn, n: 1})
}

func (c *chunk) empty() bool {
	return len(c.msgs) == 0 && len(c.fails) == 0 && c.endLSN == 0 && c.covered+c.trailing == 0
}

// route turns batches into chunks of Kafka messages. It stops reading when stop
// is closed, but only at a transaction boundary, so a clean shutdown leaves no
// transaction half-delivered.
func (r *Relay) route(stop <-chan struct{}, ctx context.Context, in <-chan replication.Batch, out chan<- *chunk) error {
	defer close(out)
	maxMsgs := r.cfg.Sink.BatchSize
	maxBytes := 4 * int(r.cfg.Sink.BatchBytes)
	newChunk := func() *chunk {
		n := min(maxMsgs, 1024)
		return &chunk{msgs: make([]kafka.Message, 0, n), evs: make([]event, 0, n)}
	}
	cur := newChunk()
	flush := func() error {
		if cur.empty() {
			return nil
		}
		select {
		case out <- cur:
			cur = newChunk()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	inTxn := false
	var txnRow int // position of the next row in its transaction, for retry keys
	for {
		stopCh := stop
		if inTxn {
			stopCh = nil // finish the open transaction first
		}
		var b replication.Batch
		select {
		case b = <-in:
		case <-stopCh:
			return flush()
		case <-ctx.Done():
			return ctx.Err()
		default:
			// Nothing is waiting: hand on what we have rather than sit on it.
			if err := flush(); err != nil {
				return err
			}
			select {
			case b = <-in:
			case <-stopCh:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}

		if !r.win.tryTake(len(b.Rows), b.Bytes, inTxn) {
			// What we hold counts against the window: hand it on before waiting.
			if err := flush(); err != nil {
				return err
			}
			if err := r.win.take(ctx, len(b.Rows), b.Bytes, inTxn); err != nil {
				return err
			}
		}
		if !inTxn {
			txnRow = 0
		}
		routed := 0
		for i := range b.Rows {
			row := &b.Rows[i]
			cur.trailing++
			cur.bytes += rowBytes(row)
			txnRow++
			if !r.outbox(row.Relation) {
				continue
			}
			routed++
			m, err := r.router.Route(*row)
			r.headerTrouble(&m)
			if err != nil {
				var re *router.RouteError
				if !errors.As(err, &re) {
					var se *router.SchemaError
					if errors.As(err, &se) {
						r.m.SchemaStop()
						return fmt.Errorf("stopped before the event at position %d of the transaction committed at %s, so that nothing from it on is confirmed: %w",
							txnRow, b.CommitLSN, err)
					}
					return fmt.Errorf("route event of transaction %d committed at %s: %w", b.Xid, b.CommitLSN, err)
				}
				// Not this relay's to drop nor to stop for: the event goes
				// to the retry table, in its place.
				cur.fails = append(cur.fails, routeFailure{before: len(cur.msgs), ev: event{msg: m, lsn: b.CommitLSN, at: b.CommitTime, n: txnRow}, err: err})
				continue
			}
			cur.msgs = append(cur.msgs, toKafka(m))
			cur.evs = append(cur.evs, event{msg: m, lsn: b.CommitLSN, at: b.CommitTime, n: txnRow})
			cur.addCommit(b.CommitLSN, b.CommitTime)
			if len(cur.msgs) >= maxMsgs || cur.bytes >= maxBytes {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		r.tableM.Received(routed)
		inTxn = !b.Last
		if b.Last {
			cur.endLSN = b.EndLSN
			cur.commitTime = b.CommitTime
			cur.covered += cur.trailing
			cur.trailing = 0
		}
	}
}

// outbox reports whether rel is the configured outbox table. The publication
// should cover only that table; inserts into any other are not events.
func (r *Relay) outbox(rel *replication.Relation) bool {
	is, ok := r.isOutbox[rel]
	if !ok {
		is = rel.Namespace == r.schema && rel.Name == r.table
		r.isOutbox[rel] = is
		if !is {
			r.log.Warn("publication covers a table that is not the outbox: its inserts are ignored",
				"table", rel.Namespace+"."+rel.Name, "outbox_table", r.cfg.Table)
		}
	}
	return is
}

// headerTrouble counts what the router left out of an event's headers and
// warns about a headers value it ignored, at most once every ten seconds:
// the event is delivered all the same, so a line per event would only flood
// the log.
func (r *Relay) headerTrouble(m *router.Message) {
	if m.DroppedHeaders > 0 {
		r.m.HeadersDropped(m.DroppedHeaders)
	}
	if m.BadHeaders == "" {
		return
	}
	r.m.HeadersInvalid()
	if now := time.Now(); now.Sub(r.lastBadHeaders) >= 10*time.Second {
		r.lastBadHeaders = now
		r.log.Warn("headers column ignored: event delivered without its extra headers",
			"event_id", m.EventID, "aggregate_type", m.AggregateType, "reason", m.BadHeaders)
	}
}

func rowBytes(row *replication.Row) int {
	n := 0
	for _, v := range row.Values {
		n += len(v)
	}
	return n
}

func toKafka(m router.Message) kafka.Message {
	hs := make([]kafka.Header, len(m.Headers))
	for i, h := range m.Headers {
		hs[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: hs}
}

// write sends chunks to Kafka in order and reports what was acknowledged.
func (r *Relay) write(ctx context.Context, in <-chan *chunk, com *committer) error {
	for c := range in {
		send, sendAt := c.msgs, []int(nil) // sendAt nil: send is c.msgs
		var parked []diverted
		r.gate.mu.Lock()
		anyBlocked := len(r.gate.blocked) > 0
		r.gate.mu.Unlock()
		if anyBlocked || len(c.fails) > 0 {
			send, sendAt, parked = r.divert(c)
		}
		if len(send) > 0 {
			r.health.waitFor(fmt.Sprintf("Kafka to acknowledge %d events", len(send)))
			if err := r.sink.Write(ctx, send); err != nil {
				var we *sink.WriteError
				if !errors.As(err, &we) {
					return fmt.Errorf("write to kafka: %w", err)
				}
				parked = append(parked, refused(we, c, send, sendAt)...)
				send = acknowledged(send, we)
			}
		}
		if len(parked) > 0 {
			// Durable in the retry table before the chunk's LSN can be
			// confirmed: the table is where these events now live.
			r.health.waitFor(fmt.Sprintf("the retry table to store %d events (first: %s)", len(parked), parked[0].ev.EventKey))
			if err := r.park(ctx, parked); err != nil {
				return err
			}
		}
		r.health.waitFor("")
		r.win.giveBytes(c.bytes)
		com.ack(c)
		r.health.progress()
		if r.m != nil && len(send) > 0 {
			r.observe(c, send, len(parked))
		}
	}
	com.close()
	return nil
}

// observe records an acknowledged chunk: per-topic counts, batch size and
// commit-to-ack latency. Per chunk, not per event, except for counting.
// acknowledged returns the messages of send that we does not list.
func acknowledged(send []kafka.Message, we *sink.WriteError) []kafka.Message {
	out := make([]kafka.Message, 0, len(send)-len(we.Failures))
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

func (r *Relay) observe(c *chunk, sent []kafka.Message, parked int) {
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

// committer saves the highest acknowledged transaction end LSN as the
// checkpoint and then confirms it to the stream. Saves are paced by interval,
// unless the events waiting for one pass urgent (half the window).
type committer struct {
	store    *checkpoint.Store
	stream   *replication.Stream
	m        *metrics.Metrics
	win      *window
	log      *slog.Logger
	slot     string
	interval time.Duration
	urgent   int
	health   *health

	mu         sync.Mutex
	acked      pglogrepl.LSN
	commitTime time.Time
	covered    int // acknowledged events covered by acked, not yet saved
	trailing   int // acknowledged events of a transaction not yet complete
	closed     bool
	notify     chan struct{}

	saved pglogrepl.LSN // run's goroutine only (read after run returns)
}

func (c *committer) ack(ch *chunk) {
	c.mu.Lock()
	if ch.endLSN != 0 {
		c.acked, c.commitTime = ch.endLSN, ch.commitTime
		c.covered += c.trailing + ch.covered
		c.trailing = 0
	}
	c.trailing += ch.trailing
	c.mu.Unlock()
	c.poke()
}

func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.poke()
}

func (c *committer) poke() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *committer) run(ctx context.Context) error {
	var lastSave time.Time
	for {
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
		closed, covered := c.closed, c.covered
		c.mu.Unlock()
		if wait := c.interval - time.Since(lastSave); wait > 0 && !closed && covered < c.urgent {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
		}
		c.mu.Lock()
		lsn, commitTime, events := c.acked, c.commitTime, c.covered
		c.covered = 0
		closed = c.closed
		c.mu.Unlock()
		if lsn > c.saved {
			if err := c.save(ctx, lsn, commitTime); err != nil {
				return err
			}
			c.saved = lsn
			lastSave = time.Now()
			c.stream.Confirm(lsn)
			c.health.progress()
			c.m.SetConfirmedLSN(lsn)
		}
		c.win.giveEvents(events)
		if closed {
			return nil
		}
	}
}

// save retries until the checkpoint is durable or ctx is done: Postgres may be
// restarting, and the stream will be waiting for it too.
func (c *committer) save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error {
	return persist(ctx, c.log, "save checkpoint "+lsn.String(), c.health.watch("checkpoint", func() error {
		return c.store.Save(ctx, c.slot, lsn, commitTime)
	}))
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
	backoff := 100 * time.Millisecond
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
		t := time.NewTimer(backoff/2 + rand.N(backoff/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}
