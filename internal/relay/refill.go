package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/replay"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// # Refill: healing a lost slot from the outbox table (DESIGN invariant 14)
//
// When the slot does not continue from the checkpoint (dropped, invalidated,
// recreated ahead of it, or missing after a failover), the events committed
// since the checkpoint are not in any WAL the relay can read, but their rows
// are still in the outbox table. A refill:
//
//  1. takes over the checkpoint's epoch (fencing every other relay of the
//     group, as a leader does) and waits out their leases;
//  2. drops the slot (refusing one that a process streams) and creates it
//     again on a replication connection, exporting its snapshot: every
//     transaction committed before the slot's consistent point is visible in
//     that snapshot, every later one is decoded by the new slot;
//  3. reads in that snapshot the rows of every transaction the checkpoint may
//     not cover, by the checkpoint history's rule (replay.Selection.FromLSN:
//     not older than the snapshot_xmin of the newest history row at or
//     before the checkpoint), in the table's order (created_at, ctid);
//  4. delivers them through the live pipeline's writer: same router, plus
//     the header refill_id, the same gate (an aggregate with rows in the
//     retry table gets its refilled events parked behind them), the retry
//     table for events Kafka refuses, the lease before each write; an event
//     the retry table already holds (retry.Store.Held: the stream stored it,
//     dead or pending) is left there, neither sent nor stored again;
//  5. once each is acknowledged or stored, saves the checkpoint at the
//     consistent point (fenced by the epoch) and a history row whose
//     snapshot is the exported one (snapshot_lsn = consistent point,
//     snapshot_xmin = its xmin), which keeps retention's rule true: a
//     transaction older than that xmin had finished when the snapshot was
//     taken, so if it committed it is visible in it, and was refilled.
//
// Nothing is lost: a row is visible in the snapshot or decoded by the slot.
// Duplicates: the rows of transactions that committed between the history
// row and the checkpoint (at most one checkpoint.history_interval of
// events, plus those of transactions open across that row), and in a
// running relay the events in flight when the gap was met. A crash before
// step 5 leaves the checkpoint where it was: the next start meets a slot
// ahead of it, and refills again. Not from the start: after each chunk the
// writer finished, step 4 records in the checkpoint row how far it got (the
// last row's position in the order, and the snapshot's xmin), and a refill
// from the same checkpoint skips the rows of transactions older than that
// xmin up to that position (replay.Selected.SkipSent: each was in the killed
// refill's snapshot, before a row it had handled). It sends again what the
// killed one sent after its last record, and the rows of transactions open
// when the killed one began.
//
// A range whose rows retention may have deleted (some slot's retention
// recorded a horizon younger than the history row the checkpoint maps to:
// checkpoint.FindPruned) is refilled with what is left and reported
// (RefillResult.Pruned): recover exits 5, a running relay logs an error.

// HeaderRefillID is the header every refilled message carries: the refill's id.
const HeaderRefillID = "refill_id"

// SlotLoss values: what the relay does when its slot does not continue from
// the checkpoint with a cause a refill can heal (pgslot.Cause.Refillable).
const (
	OnSlotLossFail   = "fail"   // stop with the *pgslot.GapError (exit code 4)
	OnSlotLossRefill = "refill" // refill from the outbox table, then stream on
)

// A RefillResult says what a refill did, or with DryRun what it would do.
type RefillResult struct {
	ID     string
	Cause  pgslot.Cause
	From   pglogrepl.LSN // the checkpoint before
	To     pglogrepl.LSN // the new slot's consistent point: the checkpoint after
	Events int64         // rows read from the outbox table (dry run: counted now)
	Parked int64         // of them, stored in the retry table (refused, or behind an aggregate's earlier rows)
	Held   int64         // of them, neither sent nor stored: the retry table held them already (Store.Held)
	// Resumed: events a refill from the same checkpoint before this one
	// (killed) had handled, by its recorded progress; this one skipped them.
	Resumed int64
	Note    string // how the checkpoint was mapped to rows
	// Pruned, when not nil, says that retention may have deleted rows of
	// the range (see replay.PrunedError): the refill sent what was left.
	// Recover returns it as its error, beside the result.
	Pruned   *replay.PrunedError
	Duration time.Duration
	DryRun   bool
}

// errRefillAgain: the checkpoint moved while the refill waited for the
// lock; the gap, if any, is judged again from the new one.
var errRefillAgain = errors.New("refill: the checkpoint moved meanwhile")

// ErrNoGap says that Recover found the slot continuing from the checkpoint:
// nothing to refill.
var ErrNoGap = errors.New("the slot continues from the checkpoint: nothing to refill")

// Recover refills once (outbox-relay recover): it returns the refill done,
// a *pgslot.GapError when the gap cannot be refilled (another system, a
// forked timeline), or ErrNoGap. With dryRun it changes nothing and counts
// what it would send.
func (r *Relay) Recover(ctx context.Context, dryRun bool) (*RefillResult, error) {
	pool, err := sqlconn.NewPool(ctx, r.cfg.Replication.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()
	gap, err := r.findGap(ctx, pool)
	if err != nil {
		return nil, err
	}
	if gap == nil {
		return nil, ErrNoGap
	}
	if !dryRun {
		if err := r.checkAuth(ctx); err != nil {
			return nil, err
		}
	}
	for {
		res, err := r.refill(ctx, pool, gap, dryRun)
		if !errors.Is(err, errRefillAgain) {
			return res, err
		}
		if gap, err = r.findGap(ctx, pool); err != nil {
			return nil, err
		} else if gap == nil {
			return nil, ErrNoGap
		}
	}
}

// findGap reads the checkpoint, the slot and the server as resolveStart
// does, and returns the gap, nil when there is none.
func (r *Relay) findGap(ctx context.Context, pool *pgxpool.Pool) (*pgslot.GapError, error) {
	slot := r.cfg.Replication.Slot
	sl, err := pgslot.Read(ctx, pool, slot)
	if errors.Is(err, pgslot.ErrNotFound) {
		sl, err = pgslot.Slot{Name: slot, Missing: true}, nil
	}
	if err != nil {
		return nil, err
	}
	cp, err := checkpoint.New(pool, r.cfg.CheckpointTable).Load(ctx, slot)
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load checkpoint from %s: %w", r.cfg.CheckpointTable, err)
	}
	srv, err := r.identify(ctx)
	if err != nil {
		return nil, err
	}
	var gap *pgslot.GapError
	if err := pgslot.Verify(cp, sl, srv); errors.As(err, &gap) {
		return gap, nil
	} else if err != nil {
		return nil, err
	}
	return nil, nil
}

// refill heals gap (see the top of this file). It returns gap itself when
// its cause cannot be refilled.
func (r *Relay) refill(ctx context.Context, pool *pgxpool.Pool, gap *pgslot.GapError, dryRun bool) (*RefillResult, error) {
	if !gap.Cause.Refillable() {
		return nil, gap
	}
	began := time.Now()
	slot := r.cfg.Replication.Slot
	store := checkpoint.New(pool, r.cfg.CheckpointTable)
	cp, err := store.Load(ctx, slot)
	if err != nil {
		return nil, fmt.Errorf("refill: load the checkpoint: %w", err)
	}
	res := &RefillResult{ID: newRefillID(), Cause: gap.Cause, From: cp.LSN, DryRun: dryRun}
	if err := r.canRefill(ctx, store, gap, cp); err != nil {
		return nil, err
	}
	sels, err := r.selectRefill(ctx, pool, cp.LSN)
	if err != nil {
		return nil, err
	}
	res.Note = sels[0].sel.Note()
	if err := r.skipRefilled(ctx, store, sels, res); err != nil {
		return nil, err
	}
	for _, s := range sels {
		if p := s.sel.Pruned(); p != nil && res.Pruned == nil {
			pe := *p
			pe.What = "refill of slot " + strconv.Quote(slot)
			res.Pruned = &pe
		}
	}
	if dryRun {
		if err := countRefill(ctx, pool, sels, res); err != nil {
			return nil, err
		}
		return res, nil
	}
	log := r.log.With("refill_id", res.ID)
	log.Warn("refilling from the outbox table: the slot does not continue from the checkpoint",
		"slot", slot, "cause", gap.Cause, "checkpoint", cp.LSN.String(), "reason", gap.Reason())

	lock, again, err := r.lockRefill(ctx, pool, store, cp, log)
	if err != nil {
		return nil, err
	}
	defer lock.Close(context.WithoutCancel(ctx)) // ends the session, and with it the lock
	gap = again
	srv, err := r.identify(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.MigrateLeader(ctx); err != nil {
		return nil, err
	}
	// 1. Fence every other relay of the group, and wait out their leases.
	epoch, err := store.TakeOver(ctx, slot, r.cfg.Identity+" (refill "+res.ID+")", srv.Server)
	if err != nil {
		return nil, err
	}
	ls := leader.New(slot, r.cfg.Identity, r.cfg.LeaseDuration, log, store, store, func() checkpoint.Server { return srv.Server })
	if err := backoff.Sleep(ctx, r.cfg.LeaseDuration); err != nil {
		return nil, err
	}
	ls.Taken(epoch)

	// 2. The slot again, with its snapshot.
	if err := r.dropSlot(ctx, pool); err != nil {
		return nil, err
	}
	rconn, err := r.replicationConn(ctx, "outbox-relay refill")
	if err != nil {
		return nil, err
	}
	defer rconn.Close(context.WithoutCancel(ctx))
	created, err := pgslot.CreateExporting(ctx, rconn, slot)
	if err != nil {
		return nil, fmt.Errorf("refill: create replication slot %q: %w", slot, err)
	}
	if res.To, err = pglogrepl.ParseLSN(created.ConsistentPoint); err != nil {
		return nil, fmt.Errorf("refill: the new slot's consistent point %q: %w", created.ConsistentPoint, err)
	}
	log.Info("refill: slot created; reading the outbox in its snapshot", "slot", slot, "consistent_point", res.To.String(), "snapshot", created.SnapshotName)

	// 3. and 4. Read in the snapshot, deliver as the live relay does. The
	// replication connection stays open and idle meanwhile: the snapshot
	// lives as long as it does nothing else.
	progress := refillProgress(ctx, store, slot, epoch, log)
	xmin, at, err := r.deliverRefill(ctx, pool, sels, created.SnapshotName, ls, res, progress)
	if err != nil {
		return nil, fmt.Errorf("refill %s stopped (the checkpoint is unchanged: the next start refills again): %w", res.ID, err)
	}

	// 5. The checkpoint at the consistent point, fenced, and its history.
	if err := r.finishRefill(ctx, store, epoch, gap, res, at, xmin, began, log); err != nil {
		return nil, err
	}
	return res, nil
}

// refillProgress returns what records a refill's progress in the checkpoint
// row (so that a refill killed and started again skips what was sent) and
// logs it now and then.
func refillProgress(ctx context.Context, store *checkpoint.Store, slot string, epoch int64, log *slog.Logger) func(checkpoint.RefillProgress) {
	lastLogged := time.Now()
	return func(p checkpoint.RefillProgress) {
		if err := store.SaveRefillProgress(ctx, slot, epoch, p); err != nil {
			log.Warn("refill: cannot record its progress; if it is killed, the next refill sends again what it sent", "err", err)
		}
		// What replay logs off a terminal: a refill of millions of rows
		// (recover, or run with refill) must not look hung.
		if time.Since(lastLogged) >= refillProgressEvery {
			lastLogged = time.Now()
			log.Info("refill progress", "sent", p.Sent)
		}
	}
}

// countRefill counts, for a dry run, the events a refill would re-send.
func countRefill(ctx context.Context, pool *pgxpool.Pool, sels []refillSource, res *RefillResult) error {
	for _, s := range sels {
		n, err := s.sel.Count(ctx, pool)
		if err != nil {
			return fmt.Errorf("refill (dry run): count the rows of %s: %w", s.name, err)
		}
		res.Events += n
	}
	if res.Pruned != nil {
		res.Pruned.Found = res.Events
	}
	return nil
}

// lockRefill takes the slot's refill lock and judges the gap again under
// it. One refill of a slot at a time: the relays of an HA group all meet
// the gap. The one that waited finds it healed (ErrNoGap), or refills what
// is left. The lock is session-level, so on a direct connection, which the
// caller closes to release it: through a pooler in transaction mode it
// would stay on a server connection the pooler hands to others, and the
// unlock might go to another one.
func (r *Relay) lockRefill(ctx context.Context, pool *pgxpool.Pool, store *checkpoint.Store, cp checkpoint.Checkpoint, log *slog.Logger) (_ *pgx.Conn, _ *pgslot.GapError, err error) {
	slot := r.cfg.Replication.Slot
	lock, err := r.directConn(ctx, "outbox-relay refill lock")
	if err != nil {
		return nil, nil, fmt.Errorf("refill: connect for the refill lock: %w", err)
	}
	defer func() {
		if err != nil {
			lock.Close(context.WithoutCancel(ctx))
		}
	}()
	key := "outbox-relay refill " + slot
	if _, err := lock.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, key); err != nil {
		return nil, nil, fmt.Errorf("refill: take the refill lock: %w", err)
	}
	// Judged again, under the lock and on a connection of its own: the
	// gap a running stream met is judged from what it saw (a missing slot
	// on a new timeline may be a fork as well).
	again, err := r.findGap(ctx, pool)
	switch {
	case err != nil:
		return nil, nil, err
	case again == nil:
		log.Info("refill: another relay healed the slot meanwhile", "slot", slot)
		return nil, nil, ErrNoGap
	case !again.Cause.Refillable():
		return nil, nil, again
	}
	if cp2, err := store.Load(ctx, slot); err != nil {
		return nil, nil, err
	} else if cp2.LSN != cp.LSN {
		return nil, nil, errRefillAgain // another relay refilled, and the slot was lost again since
	}
	return lock, again, nil
}

// finishRefill saves the checkpoint at the new slot's consistent point
// (fenced), records the refill and its history row, and says it is done.
func (r *Relay) finishRefill(ctx context.Context, store *checkpoint.Store, epoch int64, gap *pgslot.GapError, res *RefillResult, at time.Time, xmin uint64, began time.Time, log *slog.Logger) error {
	slot := r.cfg.Replication.Slot
	notFenced := func(err error) bool { return !errors.Is(err, checkpoint.ErrFenced) }
	if err := backoff.RetryIf(ctx, log, "save the checkpoint after the refill", notFenced, func() error {
		return store.SaveFenced(ctx, slot, epoch, res.To, at)
	}); err != nil {
		return fmt.Errorf("refill %s: %w", res.ID, err)
	}
	res.Duration = time.Since(began)
	what := fmt.Sprintf("refill %s at %s: slot %s, %d events re-sent from the outbox table (%d into the retry table, %d left in it), checkpoint %s -> %s, in %s",
		res.ID, at.UTC().Format(time.RFC3339), gap.Cause, res.Events-res.Held, res.Parked, res.Held, res.From, res.To, res.Duration.Round(time.Millisecond))
	if err := store.RecordRefill(ctx, slot, epoch, what); err != nil {
		log.Warn("refill: cannot record the refill in the checkpoint row (status shows it)", "err", err)
	}
	if err := store.RecordSnapshot(ctx, slot, res.To, at, xmin, res.To); err != nil {
		log.Warn("refill: cannot record the checkpoint history row of the refill; retention waits for the next one", "err", err)
	}
	r.m.Refilled(res.Events - res.Held)
	r.m.SetSlotGap(false)
	if res.Pruned != nil {
		res.Pruned.Found = res.Events
		log.Error("refill: rows of the range may be missing: retention deleted them before this slot delivered them", "err", res.Pruned)
	}
	log.Warn("refill done: the slot continues from the checkpoint again",
		"slot", slot, "cause", gap.Cause, "from_checkpoint", res.From.String(), "to_checkpoint", res.To.String(),
		"events", res.Events-res.Held, "parked_in_retry_table", res.Parked, "already_in_retry_table", res.Held, "duration", res.Duration.Round(time.Millisecond).String(), "selection", res.Note)
	return nil
}

// skipRefilled narrows the selections when a refill from the same
// checkpoint recorded its progress and was killed: what it handled is
// skipped (replay.Selected.SkipSent says which rows, and why none is lost).
// A progress of another checkpoint, or in another order, is ignored.
func (r *Relay) skipRefilled(ctx context.Context, store *checkpoint.Store, sels []refillSource, res *RefillResult) error {
	p, ok, err := store.LoadRefillProgress(ctx, r.cfg.Replication.Slot)
	if err != nil {
		r.log.Warn("refill: cannot read the progress of an earlier refill; sending everything", "err", err)
		return nil
	}
	if !ok || p.From != res.From || p.Table >= len(sels) || len(p.Position) != len(sels[p.Table].sel.Order()) {
		return nil
	}
	for i := 0; i <= p.Table; i++ {
		pos := p.Position
		if i < p.Table {
			pos = nil
		}
		if err := sels[i].sel.SkipSent(pos, p.Xmin); err != nil {
			return fmt.Errorf("refill: skip what refill %s sent: %w", p.ID, err)
		}
	}
	res.Resumed = p.Sent
	r.log.Warn("refill: continuing after a refill from the same checkpoint that stopped: skipping what it handled",
		"stopped_refill_id", p.ID, "events_it_handled", p.Sent, "table", sels[p.Table].name)
	return nil
}

// A RefillError says why a gap cannot be refilled, and what to do instead.
// It exits with exitcode.Gap, as the gap itself.
type RefillError struct {
	Gap    *pgslot.GapError
	Reason string
	// NoHistory: the checkpoint history has no row at or before the
	// checkpoint; the range can only be delivered by time (ReplayFrom),
	// after which the checkpoint is set to the slot's position.
	NoHistory  bool
	ReplayFrom string
}

func (e *RefillError) Error() string {
	return fmt.Sprintf("cannot refill slot %q (%s, uncovered range %s): %s", e.Gap.Slot, e.Gap.Cause, e.Gap.Range(), e.Reason)
}

// ExitCode is exitcode.Gap: the gap stands.
func (e *RefillError) ExitCode() int { return exitcode.Gap }

func (e *RefillError) Unwrap() error { return e.Gap }

// canRefill refuses a refill whose selection would be wrong: without a
// history row at or before the checkpoint the checkpoint cannot be mapped to
// transactions.
func (r *Relay) canRefill(ctx context.Context, store *checkpoint.Store, gap *pgslot.GapError, cp checkpoint.Checkpoint) error {
	ok, err := store.HistoryCovers(ctx, r.cfg.Replication.Slot, cp.LSN)
	if err != nil {
		return fmt.Errorf("refill: %w", err)
	}
	if !ok {
		from := "<the time of the last event delivered, a minute early>"
		if !cp.LastCommitTime.IsZero() {
			from = cp.LastCommitTime.Add(-time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
		}
		return &RefillError{Gap: gap, NoHistory: true, ReplayFrom: from, Reason: fmt.Sprintf("the checkpoint history has no row at or before the checkpoint %s, so the rows it does not cover cannot be told apart. "+
			"Deliver them by time instead, with the relay stopped: 1. replay the events committed since %s; 2. create the slot if it is missing or lost "+
			"(drop a lost one first); 3. set the checkpoint to the slot's confirmed_flush_lsn; 4. start the relay",
			cp.LSN, from)}
	}
	return nil
}

// A refillSource is one outbox table's selection of a refill, and its
// routing.
type refillSource struct {
	name   string
	sel    *replay.Selected
	router router.Config
}

// selectRefill selects, in each outbox table, the rows of the transactions
// the checkpoint may not cover (a refill delivers them table after table:
// an aggregate is its table's own, so its order is kept).
func (r *Relay) selectRefill(ctx context.Context, pool *pgxpool.Pool, from pglogrepl.LSN) ([]refillSource, error) {
	ct, err := sql.ParseTable(r.cfg.CheckpointTable)
	if err != nil {
		return nil, err
	}
	var out []refillSource
	for _, o := range r.cfg.outboxes() {
		outbox, _ := sql.ParseTable(o.name) // validated by New
		sel, err := replay.Select(ctx, pool, replay.Config{
			Selection: replay.Selection{FromLSN: from},
			Outbox:    outbox, Columns: o.router.Columns, Router: o.router,
			CheckpointTable: ct, Slot: r.cfg.Replication.Slot, Log: r.log,
		})
		if err != nil {
			return nil, fmt.Errorf("refill %s: %w", o.name, err)
		}
		out = append(out, refillSource{name: o.name, sel: sel, router: o.router})
	}
	return out, nil
}

// dropSlot drops the slot if it exists. A slot a process streams is
// refused after a short wait (the server may not yet have seen this relay's
// own connection go): another process reads it.
func (r *Relay) dropSlot(ctx context.Context, pool *pgxpool.Pool) error {
	slot := r.cfg.Replication.Slot
	deadline := time.Now().Add(r.cfg.Replication.WalSenderTimeout + 5*time.Second)
	for {
		sl, err := pgslot.Read(ctx, pool, slot)
		if errors.Is(err, pgslot.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		if !sl.Active {
			err := pgslot.Drop(ctx, pool, slot)
			if errors.Is(err, pgslot.ErrActive) { // taken meanwhile
				continue
			}
			if err != nil {
				return fmt.Errorf("refill: drop the replication slot to create it again: %w", err)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("refill: replication slot %q is active (%s): another process streams it; stop it (or, if it is another relay of this group, let it refill) and recover again",
				slot, leader.Holder(ctx, pool, r.cfg.CheckpointTable, sl))
		}
		if err := backoff.Sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// replicationConn opens a replication connection, to
// postgres.replication_dsn when set (postgres.dsn may be a pooler's).
func (r *Relay) replicationConn(ctx context.Context, app string) (*pgconn.PgConn, error) {
	pcfg, err := pgconn.ParseConfig(r.cfg.Replication.ReplicationConnDSN())
	if err != nil {
		return nil, errors.New("postgres.replication_dsn (or postgres.dsn) cannot be parsed: check its syntax")
	}
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = app
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	switch {
	case replication.PoolerRefused(err):
		return nil, fmt.Errorf("connect to postgres over a replication connection: %s: %w", replication.PoolerAdvice, err)
	case err != nil:
		return nil, fmt.Errorf("connect to postgres over a replication connection (the role needs the REPLICATION attribute, and pg_hba.conf must allow it): %w", err)
	}
	return conn, nil
}

// directConn opens an SQL connection to Postgres itself
// (postgres.replication_dsn when set): session state such as a session-level
// advisory lock does not survive a pooler in transaction mode.
func (r *Relay) directConn(ctx context.Context, app string) (*pgx.Conn, error) {
	cfg, err := sqlconn.ConnConfig(r.cfg.Replication.ReplicationConnDSN())
	if err != nil {
		return nil, errors.New("postgres.replication_dsn (or postgres.dsn) cannot be parsed: check its syntax")
	}
	cfg.RuntimeParams["application_name"] = app
	return pgx.ConnectConfig(ctx, cfg)
}

// refillProgressEvery is how often a refill logs how many events it sent.
var refillProgressEvery = 10 * time.Second
