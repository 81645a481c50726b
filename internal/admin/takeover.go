package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TakeOver makes the relay continue Debezium's slot (the `outbox-relay
// migrate debezium --takeover` command): with the slot idle, it creates what
// the relay needs (Setup, without the outbox table) and saves the relay's
// checkpoint of cfg.Slot at start, Debezium's last committed position, or at
// the slot's confirmed position when that is later. It writes one line per
// step to w, as Setup does, the first being origin (where start comes from),
// and refuses a checkpoint already past start: a relay has run on the slot
// since.
func TakeOver(ctx context.Context, cfg Config, start pglogrepl.LSN, origin string, w io.Writer) error {
	pool, err := sqlconn.NewPool(ctx, cfg.DSN)
	if err != nil {
		return err
	}
	defer pool.Close()
	sl, err := pgslot.Read(ctx, pool, cfg.Slot)
	if err != nil {
		return err
	}
	if err := sl.Usable(); errors.Is(err, pgslot.ErrPlugin) {
		var u *pgslot.UnusableError
		errors.As(err, &u)
		return fmt.Errorf("slot %q %s: the relay reads pgoutput only; create a new slot (outbox-relay setup) and deliver what Debezium had not sent another way, or switch Debezium to plugin.name=pgoutput first", cfg.Slot, u.Reason)
	}
	if sl.Active {
		pid := "?"
		if sl.ActivePID != nil {
			pid = fmt.Sprint(*sl.ActivePID)
		}
		return fmt.Errorf("slot %q is in use (pid %s): stop Debezium's connector first, then run this again", cfg.Slot, pid)
	}
	confirmed, err := sl.Confirmed()
	if err != nil {
		return err
	}
	fmt.Fprintln(w, origin)
	if start < confirmed {
		// Debezium confirms the slot only after Connect stored the offset:
		// a slot ahead means these offsets are older than its last ones,
		// and the slot's position is the later, still safe, point.
		fmt.Fprintf(w, "the slot has confirmed up to %s, past the offset's %s (the offsets read are older than Debezium's last): starting at the slot's position\n", confirmed, start)
		start = confirmed
	}

	if err := Setup(ctx, cfg, false, w); err != nil {
		return err
	}
	store := checkpoint.New(pool, cfg.CheckpointTable.String())
	cp, err := store.Load(ctx, cfg.Slot)
	switch {
	case errors.Is(err, checkpoint.ErrNoCheckpoint):
	case err != nil:
		return err
	case cp.LSN > start:
		return fmt.Errorf("the relay's checkpoint of slot %q is already at %s, past Debezium's %s: a relay has run on this slot since; start it as it is (outbox-relay run)", cfg.Slot, cp.LSN, start)
	}
	if err := store.Save(ctx, cfg.Slot, start, time.Time{}); err != nil {
		return err
	}
	fmt.Fprintf(w, "checkpoint of slot %s set to %s: start the relay with this config (outbox-relay run); it sends every transaction committed after Debezium's last\n", cfg.Slot, start)
	return nil
}
