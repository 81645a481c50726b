package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/isolation"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Where a term starts: the slot, the checkpoint and the server checked
// against each other (DESIGN invariant 14), the tables upgraded, the outbox
// and its columns found, the gate loaded. Nothing here streams.

// opened is what a term starts from: where, on which server, and the
// tables and catalog it works with, checked.
type opened struct {
	start   pglogrepl.LSN
	srv     pgslot.Server
	store   *checkpoint.Store
	rstore  *retry.Store
	gate    *gate               // loaded
	placers []*placement.Placer // per outbox table, as Config.outboxes
	buffer  *walbuffer.Store    // the slot's WAL buffer; nil when off
}

// open resolves where to start and loads the gate, waiting for Postgres if it
// is down or restarting (a host reboot starts both). What needs an operator
// (no slot, no table, a bad password) fails at once.
func (r *Relay) open(ctx context.Context, pool *pgxpool.Pool) (*opened, error) {
	o := &opened{store: checkpoint.New(pool, r.cfg.CheckpointTable)}
	store := o.store
	rstore, err := retry.NewStore(pool, r.cfg.RetryTable, r.cfg.Replication.Slot)
	if err != nil {
		return nil, fmt.Errorf("retry table: %w", err)
	}
	o.rstore, o.gate = rstore, newGate(rstore, r.log)
	err = backoff.RetryIf(ctx, r.log, "postgres unreachable at start-up", unreachable, func() error {
		var err error
		if o.start, o.srv, err = r.resolveStart(ctx, pool, store); err != nil {
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
		// Rows of an earlier version belong to no slot: this relay's when
		// provably so, else it stops, saying how to assign them.
		if err := r.adopt(ctx, pool, rstore); err != nil {
			return err
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
		// What each outbox is (its OID, whether partitioned): inserts under
		// other names are placed against them.
		o.placers = nil
		for i, ob := range r.cfg.outboxes() {
			table, _ := sql.ParseTable(ob.name) // validated by New
			p := placement.New(pool, placement.Config{Outbox: table, Publication: r.cfg.Replication.Publication,
				Others: r.cfg.OtherTables, OthersKey: r.cfg.OtherTablesKey})
			if err := p.Init(ctx); err != nil {
				return err
			}
			// A mapping that cannot work fails now, in check's words, not
			// at the first event as if the table had changed while running.
			switch {
			case p.OID() == 0 && r.cfg.readsTable():
				return fmt.Errorf("%w: %s: create it, or point the relay at your outbox table", ErrOutboxMissing, ob.name)
			case p.OID() != 0:
				// With messages only, the table is the archive refill and
				// replay read: its columns must still fit.
				if err := placement.CheckColumns(ctx, pool, p.OID(), p.Outbox(), r.routers[i].Needs()); err != nil {
					return err
				}
			}
			o.placers = append(o.placers, p)
		}
		// The WAL buffer's table, created when missing.
		if o.buffer, err = r.openBuffer(ctx, pool); err != nil {
			return err
		}
		// Retention that cannot work says so at start, not once a minute.
		if r.cfg.Retention.Retention > 0 {
			for _, ob := range r.cfg.outboxes() {
				if err := retention.CheckTable(ctx, pool, ob.name); err != nil {
					return field.Within("Retention", err)
				}
				if err := retention.CheckPartitions(ctx, pool, ob.name, r.cfg.Retention.Partitions); err != nil {
					return field.Within("Retention", err)
				}
			}
		}
		return o.gate.load(ctx)
	})
	if err != nil {
		return nil, err
	}
	return o, nil
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
			// setup cannot create it either while wal_level is below
			// logical: name that, not setup (issue 37).
			var level string
			if qerr := pool.QueryRow(ctx, `SELECT current_setting('wal_level')`).Scan(&level); qerr == nil && level != "logical" {
				return 0, pgslot.Server{}, fmt.Errorf("%w: replication slot %q does not exist, and no logical slot can be created while wal_level = %s", ErrWALLevel, slot, level)
			}
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
	if err := sl.Usable(); err != nil {
		return 0, pgslot.Server{}, err
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
		cur, err := sl.CurrentWAL()
		if err != nil {
			return 0, pgslot.Server{}, err
		}
		if sl.Reached(r.cfg.StartLSN) != nil {
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

// adopt gives the relay's slot the retry rows of an earlier version that are
// provably its own (retry.Adopt), and logs what else shares its tables and
// its outbox (package isolation): legitimate, but worth knowing.
func (r *Relay) adopt(ctx context.Context, pool *pgxpool.Pool, rstore *retry.Store) error {
	cp, _ := sql.ParseTable(r.cfg.CheckpointTable) // validated by New
	var outboxes []string
	for _, ob := range r.cfg.outboxes() {
		outboxes = append(outboxes, ob.name)
	}
	n, err := rstore.Adopt(ctx, cp, outboxes)
	if err != nil {
		return err
	}
	if n > 0 {
		r.log.Info("retry table: rows of an earlier version, which belonged to no slot, are now this slot's (no other slot ever saved a checkpoint here, and they come from this relay's outbox tables)",
			"table", r.cfg.RetryTable, "slot", r.cfg.Replication.Slot, "rows", n)
	}
	rt, _ := sql.ParseTable(r.cfg.RetryTable)
	icfg := isolation.Config{Slot: r.cfg.Replication.Slot, Publication: r.cfg.Replication.Publication, Retry: rt, Checkpoint: cp}
	if r.cfg.readsTable() {
		for _, ob := range r.cfg.outboxes() {
			t, _ := sql.ParseTable(ob.name)
			icfg.Outboxes = append(icfg.Outboxes, t)
		}
	}
	rep, err := isolation.Survey(ctx, pool, icfg)
	if err != nil {
		if unreachable(err) {
			return err
		}
		r.log.Warn("cannot look for other relays and slots in the database", "err", err)
		return nil
	}
	for _, f := range rep.Findings(icfg) {
		level := slog.LevelInfo
		if f.Reader {
			level = slog.LevelWarn
		}
		r.log.Log(ctx, level, "neighbour: "+f.What, "meaning", f.Meaning)
	}
	return nil
}
