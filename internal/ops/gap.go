package ops

import (
	"context"
	"errors"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// SlotGap is what lag and status say when the slot does not continue from
// the relay's checkpoint (pgslot.Verify, DESIGN invariant 14): run refuses to
// stream it, exit code 4.
type SlotGap struct {
	Cause   string  `json:"cause"`    // slot_ahead, slot_invalidated, slot_missing, other_system, timeline_forked
	FromLSN string  `json:"from_lsn"` // the checkpoint: delivered up to here
	ToLSN   *string `json:"to_lsn"`   // where the slot resumes; null when it cannot
	Reason  string  `json:"reason"`
	Fix     string  `json:"fix"`

	err *pgslot.GapError
}

// Err returns the gap as the error run would return (exit code 4).
func (g *SlotGap) Err() error { return g.err }

// newSlotGap describes e; fix, when set, gives the fix in the command
// line's words (which command to run), else the gap's own.
func newSlotGap(e *pgslot.GapError, fix func(error) string) *SlotGap {
	g := &SlotGap{Cause: string(e.Cause), FromLSN: e.From.String(), Reason: e.Reason(), Fix: e.Fix(), err: e}
	if fix != nil {
		if f := fix(e); f != "" {
			g.Fix = f
		}
	}
	if e.To != 0 {
		to := e.To.String()
		g.ToLSN = &to
	}
	return g
}

// FindGap reports whether slot, as it stands now, continues from its
// checkpoint in table: nil when it does (or nothing is saved yet), else what
// run would refuse it for. Over an ordinary connection the timeline history
// cannot be read: a new timeline is judged only by run (IdentifyQuerier).
// fix, when set, words the fix (see newSlotGap).
func FindGap(ctx context.Context, q Querier, table, slot string, fix func(error) string) (*SlotGap, error) {
	t, err := resolveTable(ctx, q, table)
	if err != nil || t == "" {
		return nil, err
	}
	sl, err := pgslot.Read(ctx, q, slot)
	if errors.Is(err, pgslot.ErrNotFound) {
		// With a checkpoint, a gap (slot_missing); without one, nothing.
		sl, err = pgslot.Slot{Name: slot, Missing: true}, nil
	}
	if err != nil {
		return nil, err
	}
	cp, err := checkpoint.Read(ctx, q, table, slot)
	if errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	srv, err := pgslot.IdentifyQuerier(ctx, q)
	if err != nil {
		return nil, err
	}
	var gap *pgslot.GapError
	if err := pgslot.Verify(cp, sl, srv); errors.As(err, &gap) {
		return newSlotGap(gap, fix), nil
	} else if err != nil {
		return nil, err
	}
	return nil, nil
}
