package relay

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// standBy returns once the slot is free (no walsender holds it), waiting as
// long as another process streams it, and saying who does: in the log (at
// once, then every minute), in Role and in the active metric (0); the ready
// metric says, as /readyz does, whether it reaches Postgres and could lead
// (checkCouldLead, at once and every couldLeadEvery). A missing
// slot or a slot of the wrong kind is an error for the operator.
func (r *Relay) standBy(ctx context.Context, pool *pgxpool.Pool) error {
	r.m.SetActive(false)
	defer r.standby.Store(nil)
	defer r.leadProblem.Store(nil)
	var logged, checked time.Time
	for {
		var sl pgslot.Slot
		err := backoff.RetryIf(ctx, r.log, "postgres unreachable while looking at the slot", unreachable, func() error {
			var err error
			sl, err = pgslot.Read(ctx, pool, r.cfg.Replication.Slot)
			// What /readyz says of a standby (Ready): ready while it
			// reaches Postgres and could lead (checkCouldLead).
			r.m.SetStandby((err == nil || !unreachable(err)) && r.leadProblem.Load() == nil)
			return err
		})
		if errors.Is(err, pgslot.ErrNotFound) {
			return nil // nobody streams it: lead says what is wrong, or refills
		}
		if err != nil {
			return err
		}
		if !sl.Active {
			return nil
		}
		if checked.IsZero() || time.Since(checked) >= couldLeadEvery {
			checked = time.Now()
			r.checkCouldLead(ctx, pool)
			r.m.SetStandby(r.leadProblem.Load() == nil)
		}
		who := leader.Holder(ctx, pool, r.cfg.CheckpointTable, sl)
		r.standby.Store(&who)
		if logged.IsZero() || time.Since(logged) >= time.Minute {
			r.log.Info("standby: another process streams the slot; waiting to take over", "slot", sl.Name, "active", who)
			logged = time.Now()
		}
		t := time.NewTimer(r.cfg.StandbyPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}
