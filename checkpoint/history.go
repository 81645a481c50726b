package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/sql"
)

// A HistoryEntry is a row of the checkpoint history (see the package doc).
type HistoryEntry struct {
	LSN            pglogrepl.LSN
	LastCommitTime time.Time // zero when unknown (a checkpoint set by an operator)
	SavedAt        time.Time
	SnapshotXmin   uint64 // a full (epoch-extended) transaction id, xid8
	SnapshotLSN    pglogrepl.LSN
}

// HistoryTable returns the history table's name as configured: the
// checkpoint table's name + "_history", in its schema.
func (s *Store) HistoryTable() string { return sql.CheckpointHistoryName(s.t).String() }

// HistoryCovers reports whether slot has a history row at or before lsn
// (by its snapshot's LSN): without one, a checkpoint at lsn cannot be
// mapped to the transactions it covers (a refill refuses to guess).
func (s *Store) HistoryCovers(ctx context.Context, slot string, lsn pglogrepl.LSN) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	var ok bool
	err := s.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+s.history+` WHERE slot_name = $1 AND snapshot_lsn <= $2::text::pg_lsn)`,
		slot, lsn.String()).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("read the checkpoint history %s: %w", s.history, err)
	}
	return ok, nil
}

// Record writes a history row for slot's checkpoint lsn, with the commit
// time of the transaction that ended there (zero if unknown), and the
// server's snapshot, in one statement (see the package doc). Recording an
// LSN already recorded changes nothing. It does not touch the checkpoint.
func (s *Store) Record(ctx context.Context, slot string, lsn pglogrepl.LSN, lastCommit time.Time) error {
	// One statement: its snapshot is taken before pg_current_wal_insert_lsn()
	// is read, which is what makes snapshot_lsn a bound on the commits of
	// every transaction older than snapshot_xmin.
	return s.record(ctx, slot, lsn, lastCommit, `pg_snapshot_xmin(pg_current_snapshot()), pg_current_wal_insert_lsn()`)
}

// RecordSnapshot writes a history row for slot's checkpoint lsn with a
// snapshot taken elsewhere: a refill's, whose snapshot_xmin is the xmin of
// the snapshot a new slot exported (a full xid) and whose snapshot_lsn is the
// slot's consistent point. The rule of the package doc holds for it: every
// transaction older than that xmin had finished when the snapshot was
// taken, so if it committed, it did before the consistent point.
func (s *Store) RecordSnapshot(ctx context.Context, slot string, lsn pglogrepl.LSN, lastCommit time.Time, xmin uint64, snapLSN pglogrepl.LSN) error {
	return s.record(ctx, slot, lsn, lastCommit, `$4::text::xid8, $5::text::pg_lsn`, strconv.FormatUint(xmin, 10), snapLSN.String())
}

// record inserts a history row whose snapshot_xmin and snapshot_lsn are the
// SQL expressions snapshot, which may use the parameters $4 on (args).
func (s *Store) record(ctx context.Context, slot string, lsn pglogrepl.LSN, lastCommit time.Time, snapshot string, args ...any) error {
	if s.err != nil {
		return s.err
	}
	var commit *time.Time
	if !lastCommit.IsZero() {
		commit = &lastCommit
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.history+` (slot_name, lsn, last_commit_time, saved_at, snapshot_xmin, snapshot_lsn)
VALUES ($1, $2::text::pg_lsn, $3, now(), `+snapshot+`)
ON CONFLICT DO NOTHING`, append([]any{slot, lsn.String(), commit}, args...)...)
	if err != nil {
		return fmt.Errorf("record checkpoint history %q at %s in %s: %w", slot, lsn, s.HistoryTable(), err)
	}
	return nil
}

// PruneHistory deletes slot's history rows saved more than keep ago, in
// batches of at most batch rows, each its own statement, and returns how
// many it deleted. The newest row of the slot is always kept, so that a
// relay stopped for longer than keep still finds a horizon when it starts.
func (s *Store) PruneHistory(ctx context.Context, slot string, keep time.Duration, batch int) (int64, error) {
	if s.err != nil {
		return 0, s.err
	}
	if batch <= 0 {
		batch = 1000
	}
	var total int64
	for {
		tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.history+` WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM `+s.history+`
    WHERE slot_name = $1 AND saved_at < now() - make_interval(secs => $2)
      AND lsn < (SELECT max(lsn) FROM `+s.history+` WHERE slot_name = $1)
    ORDER BY lsn LIMIT $3))`, slot, keep.Seconds(), batch)
		if err != nil {
			return total, fmt.Errorf("prune checkpoint history %q in %s: %w", slot, s.HistoryTable(), err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < int64(batch) {
			return total, nil
		}
	}
}

// MigrateHistory creates the history table and its index if missing (a
// table made before the history existed). It is a no-op, without locks,
// when both exist. An error wrapping the server's (insufficient privilege)
// means the relay's role may not create tables there: run
// `outbox-relay setup` as the owner.
func (s *Store) MigrateHistory(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	h := sql.CheckpointHistoryName(s.t)
	idx := sql.CheckpointHistoryIndex(s.t)
	var exists bool
	if err := s.pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL`,
		h.Quoted(), idx.Quoted()).Scan(&exists); err != nil {
		return fmt.Errorf("look up checkpoint history table %s: %w", h, err)
	}
	if exists {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("create checkpoint history table %s: %w", h, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// Two relays starting together would otherwise race on the catalog.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "outbox-relay checkpoint history "+h.Quoted()); err != nil {
		return fmt.Errorf("create checkpoint history table %s: %w", h, err)
	}
	for _, stmt := range sql.CheckpointHistoryTable(s.t) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create checkpoint history table %s: %w", h, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("create checkpoint history table %s: %w", h, err)
	}
	return nil
}

// Skip moves slot's checkpoint forward to lsn for an operator who decided
// that the events before it are not to be delivered (`outbox-relay
// checkpoint set`), and reports whether it moved. As Save, it never moves the
// checkpoint backwards; unlike Save it keeps last_commit_time, which is the
// commit time of the last transaction delivered, and skipped transactions
// were not. It records a history row with no commit time, so that the
// history shows the skip.
func (s *Store) Skip(ctx context.Context, slot string, lsn pglogrepl.LSN) (bool, error) {
	if s.err != nil {
		return false, s.err
	}
	tag, err := s.pool.Exec(ctx, `INSERT INTO `+s.table+` AS c (slot_name, lsn, last_commit_time, saved_at)
VALUES ($1, $2::text::pg_lsn, NULL, now())
ON CONFLICT (slot_name) DO UPDATE
SET lsn = EXCLUDED.lsn, saved_at = EXCLUDED.saved_at
WHERE c.lsn < EXCLUDED.lsn`, slot, lsn.String())
	if err != nil {
		return false, fmt.Errorf("set checkpoint %q to %s: %w", slot, lsn, err)
	}
	return tag.RowsAffected() == 1, nil
}

// A Querier runs one query returning at most one row. *pgx.Conn,
// *pgxpool.Pool and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// MaxHorizonAge is how many transactions old a horizon's snapshot_xmin may
// be: 32-bit xids (a row's xmin) compare correctly only within 2^31 of each
// other, and the margin leaves room for the transactions that start between
// finding the horizon and using it.
const MaxHorizonAge = 1<<31 - 1<<24

// A Horizon is the newest history row of a slot whose snapshot the covered
// position has reached: every row inserted by a transaction older than
// Entry.SnapshotXmin was delivered (see the package doc).
type Horizon struct {
	Covered pglogrepl.LSN // the later of the saved checkpoint and the slot's confirmed_flush_lsn
	Entry   HistoryEntry
	// Age is how many transaction ids were assigned since
	// Entry.SnapshotXmin, as of when the horizon was read.
	Age int64
}

// NoHorizonError says why a slot has no horizon yet: nothing may be deleted.
type NoHorizonError struct {
	Slot   string
	Kind   NoHorizonKind
	Reason string // for people: what is missing and what to do
}

// NoHorizonKind tells the reasons of a NoHorizonError apart, for callers
// that report a reason once rather than on every try.
type NoHorizonKind string

// The reasons for no horizon.
const (
	NoCheckpointTable NoHorizonKind = "no_checkpoint_table" // create the relay's tables
	NoHistoryTable    NoHorizonKind = "no_history_table"    // create the relay's tables
	NoCheckpoint      NoHorizonKind = "no_checkpoint"       // nothing delivered yet
	NotCovered        NoHorizonKind = "not_covered"         // no history row reached by the checkpoint yet
	HorizonTooOld     NoHorizonKind = "too_old"             // snapshot_xmin too old to compare with 32-bit xids
)

func (e *NoHorizonError) Error() string {
	return fmt.Sprintf("no retention horizon for slot %q: %s", e.Slot, e.Reason)
}

// FindHorizon returns slot's horizon, or a *NoHorizonError saying why there
// is none (no checkpoint, no history table, no history row covered yet, a
// horizon too old to compare xids with). checkpointTable names the
// checkpoint table as configured; its history is found beside it. It only
// reads.
func FindHorizon(ctx context.Context, q Querier, checkpointTable, slot string) (*Horizon, error) {
	t, err := sql.ParseTable(checkpointTable)
	if err != nil {
		return nil, fmt.Errorf("checkpoint table: %w", err)
	}
	h := sql.CheckpointHistoryName(t)
	var cpOK, histOK bool
	if err := q.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL`,
		t.Quoted(), h.Quoted()).Scan(&cpOK, &histOK); err != nil {
		return nil, fmt.Errorf("look up the checkpoint tables: %w", err)
	}
	switch {
	case !cpOK:
		return nil, &NoHorizonError{slot, NoCheckpointTable, fmt.Sprintf("the checkpoint table %s does not exist: create it (sql/002_relay.sql)", t)}
	case !histOK:
		return nil, &NoHorizonError{slot, NoHistoryTable, fmt.Sprintf("the checkpoint history table %s does not exist: create it (sql/002_relay.sql), or start the relay with the rights to create it", h)}
	}
	var (
		covered                  *string
		lsn, xmin, snapLSN, next *string
		lastCommit, savedAt      *time.Time
		slotExists               bool
	)
	// greatest() ignores NULLs: a missing checkpoint row or slot leaves the
	// other; both missing leave NULL, and then no history row matches.
	// The slot's position counts only beside a checkpoint row from a
	// version that did not record its server (and confirmed idle positions
	// without saving them): a relay that records it saves every position
	// before confirming it, so a slot ahead of such a row was moved by
	// something else (dropped and created again: a gap, pgslot.Verify), and
	// the rows in between, not delivered, are what a refill reads.
	err = q.QueryRow(ctx, `SELECT c.cov::text, h.lsn::text, h.last_commit_time, h.saved_at, h.snapshot_xmin::text,
       h.snapshot_lsn::text, pg_snapshot_xmax(pg_current_snapshot())::text,
       EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = $1)
FROM (SELECT greatest((SELECT lsn FROM `+t.Quoted()+` WHERE slot_name = $1),
                      (SELECT confirmed_flush_lsn FROM pg_catalog.pg_replication_slots WHERE slot_name = $1
                       AND NOT EXISTS (SELECT 1 FROM `+t.Quoted()+` k WHERE k.slot_name = $1 AND to_jsonb(k)->>'system_identifier' IS NOT NULL))) AS cov) c
LEFT JOIN LATERAL (SELECT * FROM `+h.Quoted()+` WHERE slot_name = $1 AND snapshot_lsn <= c.cov
                   ORDER BY snapshot_lsn DESC LIMIT 1) h ON true`, slot).
		Scan(&covered, &lsn, &lastCommit, &savedAt, &xmin, &snapLSN, &next, &slotExists)
	if err != nil {
		return nil, fmt.Errorf("find the retention horizon of slot %q: %w", slot, err)
	}
	if covered == nil {
		why := "no checkpoint is saved for it"
		if !slotExists {
			why += " and the slot does not exist"
		}
		return nil, &NoHorizonError{slot, NoCheckpoint, why + ": nothing is known to be delivered"}
	}
	hz := &Horizon{}
	if hz.Covered, err = pglogrepl.ParseLSN(*covered); err != nil {
		return nil, fmt.Errorf("covered position %q: %w", *covered, err)
	}
	if lsn == nil {
		return nil, &NoHorizonError{slot, NotCovered, fmt.Sprintf("no history row in %s has a snapshot_lsn the checkpoint (%s) has reached yet; "+
			"the relay records one at most every checkpoint.history_interval while it delivers, and the next checkpoint covers it", h, hz.Covered)}
	}
	e := &hz.Entry
	if e.LSN, err = pglogrepl.ParseLSN(*lsn); err != nil {
		return nil, fmt.Errorf("history lsn %q: %w", *lsn, err)
	}
	if e.SnapshotLSN, err = pglogrepl.ParseLSN(*snapLSN); err != nil {
		return nil, fmt.Errorf("history snapshot_lsn %q: %w", *snapLSN, err)
	}
	if e.SnapshotXmin, err = strconv.ParseUint(*xmin, 10, 64); err != nil {
		return nil, fmt.Errorf("history snapshot_xmin %q: %w", *xmin, err)
	}
	if lastCommit != nil {
		e.LastCommitTime = *lastCommit
	}
	e.SavedAt = *savedAt
	n, err := strconv.ParseUint(*next, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("next transaction id %q: %w", *next, err)
	}
	hz.Age = int64(n - e.SnapshotXmin)
	if n < e.SnapshotXmin {
		hz.Age = 0 // cannot be: the next xid only grows
	}
	if hz.Age > MaxHorizonAge {
		return nil, &NoHorizonError{slot, HorizonTooOld, fmt.Sprintf("the newest covered history row (%s, saved %s) is %d transactions old, "+
			"too old to compare 32-bit row xids with; a running relay records a newer one within checkpoint.history_interval",
			e.LSN, e.SavedAt.UTC().Format(time.RFC3339), hz.Age)}
	}
	return hz, nil
}

// IsNoHorizon reports whether err says there is no horizon (nothing may be
// deleted), rather than that the lookup failed.
func IsNoHorizon(err error) bool {
	var nh *NoHorizonError
	return errors.As(err, &nh)
}
