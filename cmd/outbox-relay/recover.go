package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/relay"
)

func newRecoverCmd(wrap wrapFunc) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"}, // --dry-run needs none
		Use:         "recover [--dry-run]",
		Short:       "Heal a lost or replaced slot: re-deliver the uncovered range from the outbox table",
		Long: `recover heals the gap run refuses with exit code 4 when the slot does not
continue from the checkpoint because it was dropped, invalidated
(max_slot_wal_keep_size), created again ahead of the checkpoint, or is missing
after a failover. With the relay stopped (or as postgres.on_slot_loss: refill
does by itself), it:

  1. takes over the checkpoint (a new epoch: any other relay of the group is fenced);
  2. drops the slot if it exists and creates it again, exporting its snapshot;
  3. sends, read in that snapshot, every outbox row whose transaction the
     checkpoint may not cover (found with the checkpoint history, as
     "replay --from-lsn <checkpoint>" would), routed as the relay routes them,
     each with the header refill_id; an aggregate with rows waiting in the
     retry table gets its events queued behind them;
  4. saves the checkpoint at the new slot's start, where run then streams on.

Nothing is lost: a row committed before the new slot's start is in the
snapshot, a later one comes from the slot. Duplicates: the events committed up
to one checkpoint.history_interval before the checkpoint. Killed midway, the
checkpoint is unchanged and recover (or run with refill) refills again,
skipping what the killed refill had recorded as handled (its progress is
saved after each chunk Kafka acknowledged).

On another database system or a timeline that forked before the checkpoint
the history's positions mean nothing: recover refuses (exit 4) and says to
replay by time. Exit 0 when refilled or when there was nothing to refill;
5 when rows of the range may be gone: the retention of some slot recorded
deleting rows of transactions the range needs (the message names it); what
was left was sent, and run streams on.
--dry-run prints what it would send and changes nothing.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			if !dryRun && len(e.cfg.Sink.Brokers) == 0 {
				return usageErrorf("kafka.brokers: empty; recover sends to Kafka (set it, or use --dry-run)")
			}
			r, closeSinks, err := newRelay(e.cfg.relayConfig(e.log))
			if err != nil {
				return fmt.Errorf("%w: %w", errConfig, err)
			}
			defer closeSinks()
			ctx, stop := signalContext(cmd.Context(), e)
			defer stop()
			res, err := r.Recover(ctx, dryRun)
			if errors.Is(err, relay.ErrNoGap) {
				fmt.Fprintf(e.stdout, "slot %s continues from the checkpoint: nothing to refill\n", e.cfg.Replication.Slot)
				return nil
			}
			if err != nil {
				return err
			}
			if res.DryRun {
				fmt.Fprintf(e.stdout, "slot %s: %s; the checkpoint is %s.\nrecover would create the slot again and send %d events now in the outbox table (and any committed before it runs); %s\n",
					e.cfg.Replication.Slot, res.Cause, res.From, res.Events, res.Note)
			} else {
				resumed := ""
				if res.Resumed > 0 {
					resumed = fmt.Sprintf(" after the %d a killed refill before it had handled", res.Resumed)
				}
				fmt.Fprintf(e.stdout, "refill %s: slot %s was %s; sent %d events%s (%d of them stored in the retry table; %d more were there already and stay), checkpoint %s -> %s, in %s; run streams on from the new slot\n",
					res.ID, e.cfg.Replication.Slot, res.Cause, res.Events-res.Held, resumed, res.Parked, res.Held, res.From, res.To, res.Duration.Round(1e6))
			}
			if res.Pruned != nil { // exit 5: rows of the range may be gone
				return res.Pruned
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be refilled, change and send nothing")
	return cmd
}
