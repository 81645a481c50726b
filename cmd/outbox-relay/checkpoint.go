package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
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

// countTimeout bounds the decoding that counts the events a skip passes
// over: a skip over gigabytes of WAL is still allowed, uncounted.
const countTimeout = 30 * time.Second

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
	pc, err := pgxpool.ParseConfig(e.cfg.Postgres.DSN)
	if err != nil {
		return fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	pc.MaxConns = 2
	pc.ConnConfig.RuntimeParams["application_name"] = "outbox-relay checkpoint set"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect to postgres %s: %w", redactDSN(e.cfg.Postgres.DSN), err)
	}
	defer pool.Close()
	slot := e.cfg.Postgres.Slot

	sl, err := pgslot.Read(ctx, pool, slot)
	if err != nil {
		return err // a missing slot says to run setup
	}
	if sl.Active {
		return activeSlotError(sl)
	}
	store := checkpoint.New(pool, e.cfg.Checkpoint.Table)
	cp, err := store.Load(ctx, slot)
	if err != nil && !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		return fmt.Errorf("%w (run `outbox-relay setup` if the table %s is missing)", err, e.cfg.Checkpoint.Table)
	}
	slotLSN, err := sl.Confirmed()
	if err != nil {
		return err
	}
	cur, err := sl.CurrentWAL()
	if err != nil {
		return err
	}
	resume, _ := checkpoint.Start(cp.LSN, slotLSN, 0)
	switch {
	case lsn < cp.LSN:
		return usageErrorf("%s is behind the checkpoint %s: the checkpoint never moves back (the relay drops transactions at or "+
			"before it as already delivered, which is what keeps a slot that went back in a crash from resending them); "+
			"to deliver events again, replay them from the outbox table (`outbox-relay replay`)", lsn, cp.LSN)
	case lsn < slotLSN:
		return usageErrorf("%s is behind the slot's confirmed position %s: the server no longer keeps that WAL for the slot, "+
			"and the next run starts at %s anyway", lsn, slotLSN, resume)
	case lsn == resume && lsn <= cp.LSN:
		fmt.Fprintf(e.stdout, "slot %s already resumes at %s: nothing to skip\n", ops.Printable(slot), lsn)
		return nil
	case lsn == resume:
		// The slot is ahead of the checkpoint: it was recreated or moved by
		// something else, and run refuses it (pgslot.Verify). Setting the
		// checkpoint to its position accepts that gap.
		return acceptGap(ctx, e, store, slot, cp.LSN, lsn, yes)
	case sl.Reached(lsn) != nil:
		return usageErrorf("%v, including events not written yet; give a position at or before %s", sl.Reached(lsn), cur)
	}

	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, ops.Printable(v)) }
	row("slot", slot+" (inactive)")
	if cp.LSN != 0 {
		row("checkpoint", fmt.Sprintf("%s  (the slot has confirmed %s; the next run resumes at %s)", cp.LSN, slotLSN, resume))
	} else {
		row("checkpoint", fmt.Sprintf("none saved  (the slot has confirmed %s; the next run resumes there)", slotLSN))
	}
	row("new checkpoint", lsn.String())
	row("skipped", fmt.Sprintf("every transaction that commits after %s and at or before %s: %s of WAL", resume, lsn, ops.Bytes(int64(lsn-resume))))
	events, txns, err := countSkipped(ctx, pool, e, resume, lsn)
	if err != nil {
		row("", "outbox events in it: not counted ("+err.Error()+")")
	} else {
		row("", fmt.Sprintf("%d outbox events in %d transactions (decoded from the slot, which does not move)", events, txns))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !yes {
		return usageErrorf("checkpoint not moved: skipped events are never delivered by the relay (replay can re-deliver rows " +
			"still in the outbox table); run again with --yes to skip them")
	}

	moved, err := store.Skip(ctx, slot, lsn)
	if err != nil {
		return err
	}
	if !moved {
		return fmt.Errorf("checkpoint not moved: it reached %s or beyond meanwhile (a relay ran?): see `outbox-relay checkpoint show`", lsn)
	}
	// The history shows the skip; without a history table the skip stands.
	if err := store.Record(ctx, slot, lsn, time.Time{}); err != nil {
		e.log.Warn("checkpoint moved, but not recorded in the checkpoint history", "err", err)
	}
	fmt.Fprintf(e.stdout, "checkpoint of slot %s moved to %s: the next `outbox-relay run` starts there\n", ops.Printable(slot), lsn)
	// A relay that connected between the check and the move started from
	// the old position: it delivers the events instead of skipping them.
	if sl, err := pgslot.Read(ctx, pool, slot); err == nil && sl.Active {
		e.log.Warn("the slot became active while the checkpoint was being moved: that relay started from the old position and delivers the events before it; restart it to skip them",
			"slot", slot)
	}
	return nil
}

// acceptGap moves the checkpoint up to a slot that is ahead of it: the
// transactions committed in between were never decoded by this slot, so
// nothing can count them; replay re-delivers them from the outbox table.
func acceptGap(ctx context.Context, e *env, store *checkpoint.Store, slot string, from, to pglogrepl.LSN, yes bool) error {
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s\t%s\n", k, ops.Printable(v)) }
	row("slot", slot+" (inactive)")
	row("checkpoint", fmt.Sprintf("%s  (the slot has confirmed %s, ahead of it: recreated or moved by something other than the relay)", from, to))
	row("new checkpoint", to.String())
	row("gap accepted", fmt.Sprintf("the events committed after %s and at or before %s are not in this slot: the relay never delivers them (`outbox-relay replay --from-lsn %s` re-delivers them from the outbox table)", from, to, from))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !yes {
		return usageErrorf("checkpoint not moved: run again with --yes to accept the gap (replay its events first, or they are lost for Kafka)")
	}
	moved, err := store.Skip(ctx, slot, to)
	if err != nil {
		return err
	}
	if !moved {
		return fmt.Errorf("checkpoint not moved: it reached %s or beyond meanwhile (a relay ran?): see `outbox-relay checkpoint show`", to)
	}
	if err := store.Record(ctx, slot, to, time.Time{}); err != nil {
		e.log.Warn("checkpoint moved, but not recorded in the checkpoint history", "err", err)
	}
	fmt.Fprintf(e.stdout, "checkpoint of slot %s moved to %s, the slot's position: the next `outbox-relay run` streams on from there\n", ops.Printable(slot), to)
	return nil
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

// countSkipped counts the outbox events of the transactions that end after
// from and at or before to, by decoding the slot up to to with
// pg_logical_slot_peek_binary_changes, which moves nothing. It gives up after
// countTimeout.
func countSkipped(ctx context.Context, pool *pgxpool.Pool, e *env, from, to pglogrepl.LSN) (events, txns int64, err error) {
	outbox, err := sql.ParseTable(e.cfg.Outbox.Table)
	if err != nil {
		return 0, 0, err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var oid *uint32
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1)::oid`, outbox.Quoted()).Scan(&oid); err != nil {
		return 0, 0, err
	}
	if oid == nil {
		return 0, 0, fmt.Errorf("the outbox table %s does not exist", outbox)
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, fmt.Sprint(countTimeout.Milliseconds())); err != nil {
		return 0, 0, err
	}
	// pgoutput v1, binary: an insert is 'I' (73) then the relation's OID;
	// a commit is 'C' (67), and its row's lsn is the transaction's end.
	var rel [4]byte
	binary.BigEndian.PutUint32(rel[:], *oid)
	err = tx.QueryRow(ctx, `SELECT coalesce(sum(n), 0), count(*) FROM (
    SELECT count(*) FILTER (WHERE get_byte(data, 0) = 73 AND substring(data FROM 2 FOR 4) = $5) AS n,
           max(lsn) FILTER (WHERE get_byte(data, 0) = 67) AS end_lsn
    FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL, 'proto_version', '1', 'publication_names', $3)
    GROUP BY xid) t
WHERE n > 0 AND end_lsn > $4::text::pg_lsn AND end_lsn <= $2::text::pg_lsn`,
		e.cfg.Postgres.Slot, to.String(), sql.Ident(e.cfg.Postgres.Publication), from.String(), rel[:]).Scan(&events, &txns)
	if err != nil {
		if ctx.Err() == nil && isQueryCanceled(err) {
			return 0, 0, fmt.Errorf("decoding took longer than %s", countTimeout)
		}
		return 0, 0, err
	}
	return events, txns, nil
}

// isQueryCanceled reports a statement cancelled by statement_timeout.
func isQueryCanceled(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "57014"
}
