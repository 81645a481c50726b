package admin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// A Skip is a planned move of a slot's checkpoint forward to To (the
// `outbox-relay checkpoint set` command): every event of a transaction that
// commits after Resume and at or before To is then never delivered.
// PlanSkip makes it, refusing what must not be skipped; Apply moves the
// checkpoint.
//
// The checkpoint never moves back (transactions at or before it are dropped
// as duplicates after a crash), never behind the slot (the server no longer
// keeps that WAL), never beyond the server's WAL (it would skip events not
// written yet), and not while the slot is active (a running relay would go
// on from its own position).
type Skip struct {
	Slot       string
	Checkpoint pglogrepl.LSN // the saved checkpoint; 0 when none is saved
	SlotLSN    pglogrepl.LSN // the slot's confirmed position
	Resume     pglogrepl.LSN // where the next run starts without the skip
	To         pglogrepl.LSN

	// Nothing says that the next run resumes at To already: Apply has
	// nothing to do.
	Nothing bool
	// Gap says that the slot is ahead of the checkpoint (recreated, or
	// moved by something other than the relay) and To is its position:
	// the skip accepts the gap, whose events this slot never decoded, so
	// nothing can count them (replay re-delivers them from the outbox
	// table).
	Gap bool

	// Events and Txns count the outbox events and the transactions
	// skipped, decoded from the slot without moving it; CountErr says why
	// they could not be counted (the skip is still allowed). Not for a Gap.
	Events, Txns int64
	CountErr     error
}

// A SkipRefusedError is a position PlanSkip refuses: behind the checkpoint or
// the slot, or beyond the server's WAL. Reason says why and what to do.
type SkipRefusedError struct{ Reason string }

func (e *SkipRefusedError) Error() string { return e.Reason }

// ErrCheckpointPassed is returned by Apply when the checkpoint reached To or
// beyond after PlanSkip (a relay ran meanwhile): nothing was moved.
var ErrCheckpointPassed = errors.New("checkpoint passed the position meanwhile")

// countTimeout bounds the decoding that counts the events a skip passes
// over: a skip over gigabytes of WAL is still allowed, uncounted.
const countTimeout = 30 * time.Second

// PlanSkip plans moving the checkpoint of cfg.Slot forward to to. It returns
// a *SkipRefusedError for a position that must not be skipped to, and an
// error for an active slot, a missing one or a failure.
func PlanSkip(ctx context.Context, pool *pgxpool.Pool, cfg Config, to pglogrepl.LSN) (*Skip, error) {
	sl, err := pgslot.Read(ctx, pool, cfg.Slot)
	if err != nil {
		return nil, err // a missing slot says to run setup
	}
	if sl.Active {
		return nil, activeSlotError(sl)
	}
	cp, err := checkpoint.New(pool, cfg.CheckpointTable.String()).Load(ctx, cfg.Slot)
	if err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return nil, fmt.Errorf("%w (run `outbox-relay setup` if the table %s is missing)", err, cfg.CheckpointTable)
	}
	slotLSN, err := sl.Confirmed()
	if err != nil {
		return nil, err
	}
	cur, err := sl.CurrentWAL()
	if err != nil {
		return nil, err
	}
	resume, _ := checkpoint.Start(cp.LSN, slotLSN, 0)
	s := &Skip{Slot: cfg.Slot, Checkpoint: cp.LSN, SlotLSN: slotLSN, Resume: resume, To: to}
	switch {
	case to < cp.LSN:
		return nil, &SkipRefusedError{fmt.Sprintf("%s is behind the checkpoint %s: the checkpoint never moves back (the relay drops transactions at or "+
			"before it as already delivered, which is what keeps a slot that went back in a crash from resending them); "+
			"to deliver events again, replay them from the outbox table (`outbox-relay replay`)", to, cp.LSN)}
	case to < slotLSN:
		return nil, &SkipRefusedError{fmt.Sprintf("%s is behind the slot's confirmed position %s: the server no longer keeps that WAL for the slot, "+
			"and the next run starts at %s anyway", to, slotLSN, resume)}
	case to == resume && to <= cp.LSN:
		s.Nothing = true
		return s, nil
	case to == resume:
		// The slot is ahead of the checkpoint: it was recreated or moved by
		// something else, and run refuses it (pgslot.Verify). Setting the
		// checkpoint to its position accepts that gap.
		s.Gap = true
		return s, nil
	case sl.Reached(to) != nil:
		return nil, &SkipRefusedError{fmt.Sprintf("%v, including events not written yet; give a position at or before %s", sl.Reached(to), cur)}
	}
	s.Events, s.Txns, s.CountErr = countSkipped(ctx, pool, cfg, resume, to)
	return s, nil
}

// countSkipped counts the outbox events of the transactions that end after
// from and at or before to, decoding the slot (which does not move).
func countSkipped(ctx context.Context, pool *pgxpool.Pool, cfg Config, from, to pglogrepl.LSN) (events, txns int64, err error) {
	var oid *uint32
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::oid`, cfg.OutboxTable.Quoted()).Scan(&oid); err != nil {
		return 0, 0, err
	}
	if oid == nil {
		return 0, 0, fmt.Errorf("the outbox table %s does not exist", cfg.OutboxTable)
	}
	return pgslot.CountInserts(ctx, pool, cfg.Slot, cfg.Publication, *oid, from, to, countTimeout)
}

// A Skipped is what Apply did besides moving the checkpoint.
type Skipped struct {
	// HistoryErr says why the move is not in the checkpoint history; the
	// move stands.
	HistoryErr error
	// Active says that the slot became active while the checkpoint was
	// moved: a relay that started from the old position delivers the
	// events before To instead of skipping them, until it restarts.
	Active bool
}

// Apply moves the checkpoint to s.To and records the move in the checkpoint
// history. It returns ErrCheckpointPassed when the checkpoint reached s.To or
// beyond since PlanSkip.
func (s *Skip) Apply(ctx context.Context, pool *pgxpool.Pool, cfg Config) (Skipped, error) {
	store := checkpoint.New(pool, cfg.CheckpointTable.String())
	moved, err := store.Skip(ctx, s.Slot, s.To)
	if err != nil {
		return Skipped{}, err
	}
	if !moved {
		return Skipped{}, ErrCheckpointPassed
	}
	var done Skipped
	// The history shows the skip; without a history table the skip stands.
	done.HistoryErr = store.Record(ctx, s.Slot, s.To, time.Time{})
	// A relay that connected between the check and the move started from
	// the old position.
	if !s.Gap {
		if sl, err := pgslot.Read(ctx, pool, s.Slot); err == nil && sl.Active {
			done.Active = true
		}
	}
	return done, nil
}

// activeSlotError refuses to move the checkpoint of a slot that is streamed:
// a running relay would go on from its own position.
func activeSlotError(sl pgslot.Slot) error {
	who := ""
	if sl.ActivePID != nil {
		who = fmt.Sprintf(" by PID %d", *sl.ActivePID)
	}
	if w := sl.Walsender; w != nil && w.ApplicationName != nil {
		who += fmt.Sprintf(" (%s)", *w.ApplicationName)
	}
	return fmt.Errorf("slot %s is active%s: a relay (or something else) is streaming it and would go on from its own position; "+
		"stop it first, then run this again (the next run starts at the new checkpoint)", sl.Name, who)
}
