package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/admin"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
)

func newCheckpointCmd(wrap wrapFunc) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Show the relay's checkpoint, or move it forward",
		Long: `The checkpoint is the relay's own record of the last transaction it delivered:
a row per slot in the checkpoint table, which never moves backwards. A relay
resumes at the later of it and the slot's confirmed position. Beside it, the
checkpoint history keeps a row every checkpoint.history_interval, with the
commit time, for replay and retention.`,
	}
	cmd.AddCommand(newCheckpointShowCmd(wrap), newCheckpointSetCmd(wrap))
	return cmd
}

func newCheckpointShowCmd(wrap wrapFunc) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"},
		Use:         "show [--json]",
		Short:       "Show the checkpoint, the slot's position, the history and the retention horizon",
		Long: `show reads the checkpoint of the slot, the slot's confirmed position, where the
next run resumes, the checkpoint history (count, oldest and newest rows) and the
retention horizon (the newest history row the checkpoint covers: outbox rows of
transactions older than its snapshot_xmin are delivered) over an ordinary
read-only connection. A relay may be running. --json prints one object with the
fields listed in docs/operating.md.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			return printReport(cmd.Context(), e, "outbox-relay checkpoint show", asJSON, ops.CheckpointShow)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (field names in docs/operating.md)")
	return cmd
}

func newCheckpointSetCmd(wrap wrapFunc) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"},
		Use:         "set LSN [--yes]",
		Short:       "Move the checkpoint forward to LSN, skipping the events before it (stop the relay first)",
		Long: `set moves the slot's checkpoint forward to LSN (X/Y, two hexadecimal numbers of
1 to 8 digits): the next run starts there, and every event of a transaction that
commits at or before LSN is never delivered. It is the documented way to skip
events, with the relay stopped.

It refuses:
  - an LSN behind the checkpoint: the checkpoint never moves back (transactions
    at or before it are dropped as duplicates after a crash); to deliver events
    again, replay them from the outbox table (outbox-relay replay);
  - an LSN behind the slot's confirmed position: the server no longer keeps
    that WAL for the slot;
  - an LSN beyond the server's current WAL position;
  - while the slot is active: stop the relay first, or it would go on from
    where it was.

It prints what would be skipped: the WAL range and, decoding the slot up to LSN
without consuming anything (at most 30s), the outbox events and transactions in
it. Without --yes nothing is changed and it exits 2.

Exit codes: 0 moved (or already there), 1 failure (cannot connect, slot missing
or active), 2 bad LSN, refused position, or no --yes.`,
		Args: cobra.ExactArgs(1),
		RunE: wrap(func(cmd *cobra.Command, e *env, args []string) error {
			lsn, err := parseLSN(args[0])
			if err != nil {
				return usageErrorf("LSN: %w", err)
			}
			return setCheckpoint(cmd.Context(), e, lsn, yes)
		}),
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: the events before LSN are skipped, never delivered")
	return cmd
}

func setCheckpoint(ctx context.Context, e *env, lsn pglogrepl.LSN, yes bool) error {
	pc, err := sqlconn.PoolConfig(e.cfg.Replication.DSN)
	if err != nil {
		return fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	pc.MaxConns = 2
	pc.ConnConfig.RuntimeParams["application_name"] = "outbox-relay checkpoint set"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect to postgres %s: %w", redactDSN(e.cfg.Replication.DSN), err)
	}
	defer pool.Close()
	cfg := e.adminConfig()
	skip, err := admin.PlanSkip(ctx, pool, cfg, lsn)
	var refused *admin.SkipRefusedError
	switch {
	case errors.As(err, &refused):
		return usageErrorf("%w", err)
	case err != nil:
		return err
	case skip.Nothing:
		fmt.Fprintf(e.stdout, "slot %s already resumes at %s: nothing to skip\n", ops.Printable(skip.Slot), lsn)
		return nil
	}

	tw := ops.NewTable(e.stdout)
	row := tw.Row
	row("slot", skip.Slot+" (inactive)")
	switch {
	case skip.Gap:
		row("checkpoint", fmt.Sprintf("%s  (the slot has confirmed %s, ahead of it: recreated or moved by something other than the relay)", skip.Checkpoint, skip.To))
	case skip.Checkpoint != 0:
		row("checkpoint", fmt.Sprintf("%s  (the slot has confirmed %s; the next run resumes at %s)", skip.Checkpoint, skip.SlotLSN, skip.Resume))
	default:
		row("checkpoint", fmt.Sprintf("none saved  (the slot has confirmed %s; the next run resumes there)", skip.SlotLSN))
	}
	row("new checkpoint", lsn.String())
	switch {
	case skip.Gap:
		row("gap accepted", fmt.Sprintf("the events committed after %s and at or before %s are not in this slot: the relay never delivers them (`outbox-relay replay --from-lsn %s` re-delivers them from the outbox table)", skip.Checkpoint, skip.To, skip.Checkpoint))
	default:
		row("skipped", fmt.Sprintf("every transaction that commits after %s and at or before %s: %s of WAL", skip.Resume, lsn, ops.Bytes(int64(lsn-skip.Resume))))
		if skip.CountErr != nil {
			row("", "outbox events in it: not counted ("+skip.CountErr.Error()+")")
		} else {
			row("", fmt.Sprintf("%d outbox events in %d transactions (decoded from the slot, which does not move)", skip.Events, skip.Txns))
		}
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !yes && skip.Gap {
		return usageErrorf("checkpoint not moved: run again with --yes to accept the gap (replay its events first, or they are lost for Kafka)")
	}
	if !yes {
		return usageErrorf("checkpoint not moved: skipped events are never delivered by the relay (replay can re-deliver rows " +
			"still in the outbox table); run again with --yes to skip them")
	}

	done, err := skip.Apply(ctx, pool, cfg)
	if errors.Is(err, admin.ErrCheckpointPassed) {
		return fmt.Errorf("checkpoint not moved: it reached %s or beyond meanwhile (a relay ran?): see `outbox-relay checkpoint show`", lsn)
	}
	if err != nil {
		return err
	}
	if done.HistoryErr != nil {
		e.log.Warn("checkpoint moved, but not recorded in the checkpoint history", "err", done.HistoryErr)
	}
	if skip.Gap {
		fmt.Fprintf(e.stdout, "checkpoint of slot %s moved to %s, the slot's position: the next `outbox-relay run` streams on from there\n", ops.Printable(skip.Slot), lsn)
		return nil
	}
	fmt.Fprintf(e.stdout, "checkpoint of slot %s moved to %s: the next `outbox-relay run` starts there\n", ops.Printable(skip.Slot), lsn)
	if done.Active {
		e.log.Warn("the slot became active while the checkpoint was being moved: that relay started from the old position and delivers the events before it; restart it to skip them",
			"slot", skip.Slot)
	}
	return nil
}
