package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/sql"
)

// checkSlotGap fails when run would refuse the slot: it does not continue
// from the checkpoint (recreated, invalidated, missing, another system:
// DESIGN invariant 14). The caller skips it when the checkpoint table is
// missing: its own line says so.
func checkSlotGap(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	g, err := ops.FindGap(ctx, conn, cfg.CheckpointTable.String(), cfg.Slot, cfg.Fix)
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

// checkRefill warns when a refill (outbox-relay recover, on_slot_loss:
// refill) could not heal a lost slot, or not completely: it needs a
// checkpoint history row at or before the checkpoint (to map the checkpoint
// to transactions), and the rows the checkpoint does not cover still in the
// outbox table. Retention never deletes those; an application that deletes
// its outbox rows itself (in the same transaction, or a purge job) does.
func checkRefill(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	const name = "slot refill"
	hist := sql.CheckpointHistoryName(cfg.CheckpointTable)
	var cp *string
	var covered bool
	err := conn.QueryRow(ctx, `SELECT c.lsn::text, EXISTS (SELECT 1 FROM `+hist.Quoted()+` h WHERE h.slot_name = c.slot_name AND h.snapshot_lsn <= c.lsn)
FROM `+cfg.CheckpointTable.Quoted()+` c WHERE c.slot_name = $1`, cfg.Slot).Scan(&cp, &covered)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		c.ok(name, "nothing delivered yet: nothing a lost slot could take")
		return
	case err != nil:
		c.warn(name, "cannot tell whether a lost slot could be refilled: %v", cfg.scrub(err))
		return
	case !covered:
		c.warn(name, "no checkpoint history row of %s is at or before the checkpoint %s: if the slot were lost now, a refill could not map the checkpoint to rows "+
			"(recover would refuse, and say to replay by time); a running relay records one within checkpoint.history_interval and covers it with its next checkpoint", cfg.Slot, *cp)
		return
	}
	var inserted, deleted int64
	err = conn.QueryRow(ctx, `SELECT coalesce(sum(n_tup_ins), 0)::bigint, coalesce(sum(n_tup_del), 0)::bigint FROM pg_catalog.pg_stat_all_tables
WHERE relid = to_regclass($1) OR relid IN (SELECT inhrelid FROM pg_catalog.pg_inherits WHERE inhparent = to_regclass($1))`, cfg.OutboxTable.Quoted()).Scan(&inserted, &deleted)
	if err != nil {
		c.warn(name, "cannot read the outbox table's statistics: %v", cfg.scrub(err))
		return
	}
	if deleted > 0 && cfg.Retention <= 0 {
		c.warn(name, "rows are deleted from %s (%d deleted of %d inserted since the statistics were reset) and outbox.retention is off: "+
			"if the application deletes its outbox rows (in the same transaction, or a purge job), a refill of a lost slot can only re-send the rows still there. "+
			"Prefer outbox.retention, which never deletes an undelivered row", cfg.OutboxTable, deleted, inserted)
		return
	}
	c.ok(name, "a lost slot can be refilled from %s: a history row is at or before the checkpoint %s%s", cfg.OutboxTable, *cp, retained(cfg))
}

func retained(cfg *Config) string {
	if cfg.Retention > 0 {
		return fmt.Sprintf(", and retention deletes only delivered rows (older than %s)", period(cfg.Retention))
	}
	return ", and no row was deleted from the outbox table"
}
