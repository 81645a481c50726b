package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
)

// runRetention runs a retention round (package retention) of one outbox table every
// Retention.Interval, counted from the end of the previous one, until ctx is
// done. A failed round is logged and the next one tries again: cleaning up
// can wait, delivery must not.
func (r *Relay) runRetention(ctx context.Context, db retention.DB, table string) {
	cfg := r.cfg.Retention
	cfg.Table = table
	cfg.Deleted = r.m.RetentionDeleted
	if bt, err := walbuffer.TableFor(r.cfg.RetryTable); err == nil {
		cfg.BufferTable = bt.String()
	}
	log := r.log.With("component", "retention", "table", table)
	log.Info("retention on: deleting delivered outbox rows older than the retention",
		"retention", cfg.Retention.String(), "interval", cfg.Interval.String(), "batch_size", cfg.BatchSize,
		"partitions", string(cfg.Partitions))
	// A partition kept for the same reason round after round is said once.
	keptSaid := map[string]string{}
	var lastReason checkpoint.NoHorizonKind
	var heldSaid string // the slots holding rows back, as last said
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		start := time.Now()
		res, err := retention.Round(ctx, db, cfg)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil:
			log.Warn("retention round failed; the next round tries again", "deleted", res.Deleted,
				"retry_in", cfg.Interval.String(), "err", err)
		case res.Horizon == nil:
			r.m.RetentionRound(time.Now(), time.Since(start), res.Overdue)
			r.m.RetentionKept(res.KeptForReaders)
			// Said once per reason: a relay that has just started, or a
			// missing history table, would otherwise log every round.
			if res.NoHorizonKind != lastReason || (res.NoHorizonKind == retention.HeldBySlot && heldSaid != heldBy(res)) {
				log.Info("retention: nothing deleted", "reason", res.NoHorizon, "overdue", res.Overdue.String(), "kept_for_other_slots", res.KeptForReaders)
			}
			lastReason, heldSaid = res.NoHorizonKind, heldBy(res)
		default:
			r.m.RetentionRound(time.Now(), time.Since(start), res.Overdue)
			r.m.RetentionKept(res.KeptForReaders)
			lastReason = ""
			// Said when the slots holding rows back change.
			if h := heldBy(res); h != heldSaid {
				if h != "" {
					log.Info("retention: rows kept for other slots that have not passed them (outbox.retention_ignore_slots lists slots that do not read the outbox)",
						"slots", h, "kept_rows", res.KeptForReaders)
				}
				heldSaid = h
			}
			for _, p := range res.Partitions {
				switch {
				case p.Gone:
					log.Info("retention: removed a partition whose rows were all delivered", "partition", p.Name,
						"action", string(cfg.Partitions), "rows", p.Rows)
					delete(keptSaid, p.Name)
				case keptSaid[p.Name] != p.Kept:
					log.Info("retention: partition kept", "partition", p.Name, "reason", p.Kept)
					keptSaid[p.Name] = p.Kept
				}
			}
			if res.Deleted > 0 {
				log.Info("retention: deleted expired outbox rows", "rows", res.Deleted, "batches", res.Batches,
					"horizon_lsn", res.Horizon.Entry.LSN.String(), "took", time.Since(start).Round(time.Millisecond).String())
			}
		}
		t.Reset(cfg.Interval)
	}
}

// heldBy names the slots that held a round's horizon back, and where they
// are, for a log line.
func heldBy(res retention.Result) string {
	var s []string
	for _, r := range res.HeldBy {
		s = append(s, fmt.Sprintf("%s (%s)", r.Slot, r.State()))
	}
	return strings.Join(s, "; ")
}
