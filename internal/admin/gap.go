package admin

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

// checkSlotGap fails when run would refuse the slot: it does not continue
// from the checkpoint (recreated, invalidated, another system: DESIGN
// invariant 14). The caller skips it when the slot or the checkpoint table
// is missing: their own lines say so.
func checkSlotGap(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	g, err := ops.FindGap(ctx, conn, cfg.CheckpointTable.String(), cfg.Slot)
	switch {
	case err != nil:
		c.warn("slot continuity", "cannot tell whether %s continues from the checkpoint: %v", cfg.Slot, cfg.scrub(err))
	case g == nil:
		c.ok("slot continuity", "%s continues from the checkpoint (same system, no position the relay did not confirm)", cfg.Slot)
	default:
		rng := g.FromLSN + ".."
		if g.ToLSN != nil {
			rng += *g.ToLSN
		}
		c.fail("slot continuity", "run refuses slot %s (exit 4): the events committed in %s were never sent: %s. Fix: %s", cfg.Slot, rng, g.Reason, g.Fix)
	}
}
