package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
)

func newPruneCmd(wrap wrapFunc) *cobra.Command {
	var (
		dryRun bool
		period string
	)
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"},
		Use:         "prune [--dry-run] [--retention 7d]",
		Short:       "Delete delivered outbox rows older than outbox.retention, once, now",
		Long: `prune runs one retention round now, as a relay with outbox.retention does every
outbox.retention_interval: it deletes the outbox rows older than the retention
whose transactions the slot's checkpoint covers, in batches of
outbox.retention_batch_size rows, each its own transaction with
outbox.retention_statement_timeout, outbox.retention_pause apart. A row whose
transaction is not yet covered is never deleted, however old.

It prints how many rows it deleted, the horizon it used (the newest checkpoint
history row the checkpoint covers), and why nothing was deleted when so.
--dry-run counts instead and deletes nothing. --retention overrides
outbox.retention for this run. A relay may be running. Exits 0 when the round
ran, deleted or not; 1 when it failed.

Rows another logical slot of the database has not passed (a second relay on
the same outbox, Debezium beside it, another relay's checkpoint whose slot
was lost) are kept, and listed as "kept for" with the slot; a slot that has
not passed any history row keeps everything. outbox.retention_ignore_slots
lists the slots that do not read the outbox.

With outbox.retention_partitions drop or detach (an outbox partitioned by range
on created_at), it drops or detaches each partition whose range ends before the
retention and whose rows are all delivered, lists each such partition it kept
and why, and deletes the delivered old rows of the default partition;
--dry-run lists the partitions that would go.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			rc := e.cfg.retentionConfig()
			if period != "" {
				d, err := parseDuration(period)
				if err != nil || d <= 0 {
					return usageErrorf("--retention %q: want a positive duration; %s", period, durationForm)
				}
				rc.Retention = d
			}
			if rc.Retention <= 0 {
				return usageErrorf("outbox.retention is off: set it (in the config file, RELAY_OUTBOX_RETENTION=7d) or give --retention 7d")
			}
			rc.DryRun = dryRun
			return prune(cmd.Context(), e, rc)
		}),
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "count the rows a round would delete; delete nothing")
	cmd.Flags().StringVar(&period, "retention", "", "delete rows older than this (7d, 12h) instead of outbox.retention")
	return cmd
}

func prune(ctx context.Context, e *env, rc retention.Config) error {
	cfg, err := sqlconn.ConnConfig(e.cfg.Replication.DSN)
	if err != nil {
		return fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	cfg.RuntimeParams["application_name"] = "outbox-relay prune"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect to postgres %s: %w", redactDSN(e.cfg.Replication.DSN), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := retention.CheckTable(ctx, conn, rc.Table); err != nil {
		return field.Within("Retention", err)
	}
	if err := retention.CheckPartitions(ctx, conn, rc.Table, rc.Partitions); err != nil {
		return field.Within("Retention", err)
	}
	start := time.Now()
	res, err := retention.Round(ctx, conn, rc)
	tw := ops.NewTable(e.stdout)
	printPruneRound(tw.Row, rc, res, err, start)
	if ferr := tw.Flush(); ferr != nil && err == nil {
		err = fmt.Errorf("write: %w", ferr)
	}
	return err
}

// printPruneRound prints what a round of prune did (or, with an error, what
// it did before it), a row per line: the horizon, the readers it kept rows
// for, the partitions, the count deleted and the oldest row left.
func printPruneRound(row func(k, v string), rc retention.Config, res retention.Result, err error, start time.Time) {
	age := daysText(rc.Retention)
	if h := res.Horizon; h != nil {
		commit := "commit time unknown"
		if !h.Entry.LastCommitTime.IsZero() {
			commit = "committed " + h.Entry.LastCommitTime.UTC().Format(time.RFC3339)
		}
		row("horizon", fmt.Sprintf("checkpoint %s (%s, recorded %s): outbox rows of transactions older than xid %d are delivered",
			h.Entry.LSN, commit, h.Entry.SavedAt.UTC().Format(time.RFC3339), h.Entry.SnapshotXmin))
	} else if err == nil {
		row("horizon", "none: "+res.NoHorizon)
	}
	printPruneKept(row, rc, res, age)
	inPartitions, done := printPrunePartitions(row, rc, res, age)
	printPruneDeleted(row, rc, res, age, inPartitions, done, start)
	printPruneOldest(row, rc, res, err, age)
}

// printPruneKept names the readers the round kept rows for.
func printPruneKept(row func(k, v string), rc retention.Config, res retention.Result, age string) {
	if len(res.HeldBy) == 0 {
		return
	}
	var slots []string
	for _, r := range res.HeldBy {
		if r.Buffer {
			// Rows this relay has read but not delivered yet.
			slots = append(slots, "the WAL buffer (postgres.max_retained_wal: "+r.State()+")")
			continue
		}
		slots = append(slots, fmt.Sprintf("slot %s (%s)", r.Slot, r.State()))
	}
	counted := fmt.Sprint(res.KeptForReaders)
	if !rc.DryRun && res.KeptForReaders >= retention.MaxKeptCount {
		counted = "at least " + counted
	}
	row("kept for", fmt.Sprintf("%s: %s rows older than %s this slot delivered and it has not passed; "+
		"list a slot that does not read the outbox in outbox.retention_ignore_slots", strings.Join(slots, ", "), counted, age))
}

// printPrunePartitions prints each partition dropped, detached or kept, and
// returns the rows removed with their partitions and the word for how.
func printPrunePartitions(row func(k, v string), rc retention.Config, res retention.Result, age string) (inPartitions int64, done string) {
	done = map[retention.PartitionMode]string{retention.PartitionsDrop: "dropped", retention.PartitionsDetach: "detached"}[rc.Partitions]
	for _, p := range res.Partitions {
		switch {
		case p.Gone && rc.DryRun:
			row("would "+string(rc.Partitions), fmt.Sprintf("partition %s (%d rows, all delivered; its range ends more than %s ago)", p.Name, p.Rows, age))
		case p.Gone:
			row(done, fmt.Sprintf("partition %s (%d rows, all delivered; its range ends more than %s ago)", p.Name, p.Rows, age))
		default:
			row("kept", fmt.Sprintf("partition %s: %s", p.Name, p.Kept))
		}
		if p.Gone {
			inPartitions += p.Rows
		}
	}
	return inPartitions, done
}

// printPruneDeleted prints how many rows the round deleted (would delete,
// with --dry-run), and in how long.
func printPruneDeleted(row func(k, v string), rc retention.Config, res retention.Result, age string, inPartitions int64, done string, start time.Time) {
	switch {
	case rc.DryRun && res.Horizon != nil:
		row("would delete", fmt.Sprintf("%d rows older than %s (dry run: nothing deleted)", res.Deleted, age))
	case rc.DryRun:
		row("would delete", "0 rows: nothing may be deleted without a horizon (dry run)")
	case res.Horizon != nil || res.Deleted > 0:
		batches := "batches"
		if res.Batches == 1 {
			batches = "batch"
		}
		took := time.Since(start).Round(time.Millisecond)
		if inPartitions == 0 {
			row("deleted", fmt.Sprintf("%d rows older than %s in %d %s of at most %d, in %s",
				res.Deleted, age, res.Batches, batches, rc.BatchSize, took))
		} else {
			row("deleted", fmt.Sprintf("%d rows older than %s: %d %s with their partitions, %d in %d %s of at most %d, in %s",
				res.Deleted, age, inPartitions, done, res.Deleted-inPartitions, res.Batches, batches, rc.BatchSize, took))
		}
	default:
		row("deleted", "0 rows: nothing may be deleted without a horizon")
	}
}

// printPruneOldest prints the oldest row past the retention that is left,
// and why; nothing after an error.
func printPruneOldest(row func(k, v string), rc retention.Config, res retention.Result, err error, age string) {
	switch {
	case err != nil:
	case res.OldestExpired == nil && rc.Partitions != retention.PartitionsDelete:
		row("oldest left", "no row due: rows older than "+age+" in a partition whose range ended less than "+age+" ago go with it later")
	case res.OldestExpired == nil:
		row("oldest left", "no row older than "+age)
	case rc.DryRun:
		row("oldest expired", fmt.Sprintf("%s, older than %s by %s", res.OldestExpired.UTC().Format(time.RFC3339), age, ops.RoughDuration(res.Overdue)))
	default:
		row("oldest left", fmt.Sprintf("%s, older than %s by %s: its transaction is not covered yet, or a transaction older than it is still open on the server",
			res.OldestExpired.UTC().Format(time.RFC3339), age, ops.RoughDuration(res.Overdue)))
	}
}
