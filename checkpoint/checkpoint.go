// Package checkpoint persists, per replication slot, the end LSN of the last
// transaction whose events were all delivered, and decides where streaming
// resumes.
//
// Invariants enforced here:
//   - A saved checkpoint never moves backwards: Save of an LSN at or below the
//     stored one changes nothing. A slot's confirmed_flush_lsn can go backwards
//     (the server persists it only at its own checkpoints, so a crash can lose
//     it); this row, committed in the same database, cannot.
//   - Save is durable when it returns nil: the row is committed.
//   - Start never resumes behind the slot's confirmed_flush_lsn: the server has
//     already discarded that WAL for the slot.
//
// The caller confirms an LSN to Postgres only after Save of it returned nil,
// idle positions included: the checkpoint then explains every position the
// slot was ever confirmed to, and a slot found ahead of it was moved by
// something else (DESIGN invariant 14). The row also records the server
// (system identifier, timeline) whose WAL its positions belong to.
//
// # The history, and what it proves
//
// Beside the one row per slot, the relay keeps a compact history of the
// checkpoints it saved (sql.CheckpointHistoryTable, one row at most every
// checkpoint.history_interval, written by Record): the checkpoint's LSN and
// commit time, and a snapshot of the server taken when the row was written,
// in one statement:
//
//	snapshot_xmin  pg_snapshot_xmin(pg_current_snapshot()): the oldest
//	               transaction still running
//	snapshot_lsn   pg_current_wal_insert_lsn(), read after that snapshot
//	               (the statement's snapshot is taken before it runs)
//
// Every transaction with an xid older than snapshot_xmin had finished when
// the row was written, so if it committed, its commit record lies before
// snapshot_lsn. Hence once the relay's checkpoint is at or past snapshot_lsn,
// every row inserted by a transaction older than snapshot_xmin has been
// delivered (acknowledged by Kafka or stored in the retry table). Conversely,
// every transaction that commits after some LSN X >= snapshot_lsn has an xid
// >= snapshot_xmin: a transaction that stays open across many checkpoints
// keeps its xid at or above the snapshot_xmin of every row written while it
// is open. A subtransaction's xid is newer than its parent's, so the rule
// holds for rows inserted under a savepoint too.
//
// Retention (package retention) deletes only rows older than the
// snapshot_xmin of the Horizon: the newest history row whose snapshot_lsn the
// covered position has reached. The covered position is the later of the
// saved checkpoint and the slot's confirmed_flush_lsn, which is where a
// relay resumes (Start): the relay confirms a position to the slot only
// when everything before it is delivered, or when nothing is in flight and
// the server has decoded everything before it.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/sql"
)

// ErrNoCheckpoint is returned by Load when nothing has been saved for the slot.
var ErrNoCheckpoint = errors.New("checkpoint: none saved")

// A Checkpoint is what Load returns. LastCommitTime is the commit time of the
// transaction that ended at LSN (zero if unknown); SavedAt is when the row was
// last moved forward, by the database's clock.
type Checkpoint struct {
	LSN            pglogrepl.LSN
	LastCommitTime time.Time
	SavedAt        time.Time
	// Server is the server the slot was streamed from when a relay last took
	// it over (TakeOver) or an operator set the checkpoint: the zero Server
	// for a row written by a version before it was recorded.
	Server Server
}

// Server identifies a Postgres server's WAL: its system identifier (from
// initdb, shared by its physical standbys) and the timeline it writes on
// (raised by each promotion). The LSNs of a checkpoint mean something only
// on the WAL of the server they came from.
type Server struct {
	SystemID string // IDENTIFY_SYSTEM's systemid, decimal; "" unknown
	Timeline int32  // 0 unknown
}

// A Store keeps checkpoints in a Postgres table (see sql.CheckpointTable), one
// row per slot. It is safe for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	t       sql.Table
	table   string // quoted
	history string // quoted: sql.CheckpointHistoryName
	err     error  // from parsing the table name, returned by every call
}

// New returns a Store using table ("table" or "schema.table"; an exact name,
// not SQL). It does not connect: the pool dials lazily. An invalid table name
// is reported by the first Load or Save.
func New(pool *pgxpool.Pool, table string) *Store {
	t, err := sql.ParseTable(table)
	if err != nil {
		return &Store{err: fmt.Errorf("checkpoint table: %w", err)}
	}
	return &Store{pool: pool, t: t, table: t.Quoted(), history: sql.CheckpointHistoryName(t).Quoted()}
}

// Load returns the checkpoint saved for slot, or ErrNoCheckpoint.
func (s *Store) Load(ctx context.Context, slot string) (Checkpoint, error) {
	if s.err != nil {
		return Checkpoint{}, s.err
	}
	return load(ctx, s.pool, s.table, slot)
}

// Read returns the checkpoint saved for slot in table ("table" or
// "schema.table", as New takes it), or ErrNoCheckpoint, over q: for readers
// without a Store, such as lag and status.
func Read(ctx context.Context, q Querier, table, slot string) (Checkpoint, error) {
	t, err := sql.ParseTable(table)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("checkpoint table: %w", err)
	}
	return load(ctx, q, t.Quoted(), slot)
}

// load reads slot's row of the quoted table.
func load(ctx context.Context, q Querier, table, slot string) (Checkpoint, error) {
	var (
		lsn        string
		lastCommit *time.Time
		systemID   *string
		timeline   *int32
		cp         Checkpoint
	)
	// The server columns through to_jsonb: a table from before they
	// existed still loads (the relay upgrades it after reading where to
	// start, and check or lag must not need it upgraded).
	err := q.QueryRow(ctx,
		`SELECT lsn::text, last_commit_time, saved_at, to_jsonb(c)->>'system_identifier', (to_jsonb(c)->>'timeline_id')::int
FROM `+table+` AS c WHERE slot_name = $1`,
		slot).Scan(&lsn, &lastCommit, &cp.SavedAt, &systemID, &timeline)
	if errors.Is(err, pgx.ErrNoRows) {
		return Checkpoint{}, ErrNoCheckpoint
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("load checkpoint %q: %w", slot, err)
	}
	if cp.LSN, err = pglogrepl.ParseLSN(lsn); err != nil {
		return Checkpoint{}, fmt.Errorf("load checkpoint %q: %w", slot, err)
	}
	if lastCommit != nil {
		cp.LastCommitTime = *lastCommit
	}
	if systemID != nil {
		cp.Server.SystemID = *systemID
	}
	if timeline != nil {
		cp.Server.Timeline = *timeline
	}
	return cp, nil
}

// Save records lsn as slot's checkpoint, with the commit time of the
// transaction that ended there (zero if unknown, or none: an idle advance past
// WAL that held no event keeps the commit time recorded, since the last
// transaction delivered is still that one). It is durable when it
// returns nil. It never moves the checkpoint backwards: saving an LSN at or
// below the stored one is a no-op and not an error, so concurrent or replayed
// saves are harmless.
func (s *Store) Save(ctx context.Context, slot string, lsn pglogrepl.LSN, lastCommit time.Time) error {
	if s.err != nil {
		return s.err
	}
	var commit *time.Time
	if !lastCommit.IsZero() {
		commit = &lastCommit
	}
	// One statement, so the compare and the write are atomic: the row lock
	// taken by ON CONFLICT serialises concurrent saves of one slot, and the
	// WHERE re-reads the row after waiting for it.
	_, err := s.pool.Exec(ctx, `INSERT INTO `+s.table+` AS c (slot_name, lsn, last_commit_time, saved_at)
VALUES ($1, $2::text::pg_lsn, $3, now())
ON CONFLICT (slot_name) DO UPDATE
SET lsn = EXCLUDED.lsn, last_commit_time = coalesce(EXCLUDED.last_commit_time, c.last_commit_time), saved_at = EXCLUDED.saved_at,
    stop_reason = CASE WHEN c.stopped_before < EXCLUDED.lsn THEN NULL ELSE c.stop_reason END,
    stopped_before = CASE WHEN c.stopped_before < EXCLUDED.lsn THEN NULL ELSE c.stopped_before END,
    reading = CASE WHEN (c.reading->>'commit_lsn')::pg_lsn < EXCLUDED.lsn THEN NULL ELSE c.reading END
WHERE c.lsn < EXCLUDED.lsn`, slot, lsn.String(), commit)
	if err != nil {
		return fmt.Errorf("save checkpoint %q at %s: %w", slot, lsn, err)
	}
	return nil
}

// BackwardsError is returned by Start when the operator asked to start behind
// the slot's confirmed_flush_lsn.
type BackwardsError struct {
	Requested     pglogrepl.LSN
	SlotConfirmed pglogrepl.LSN
}

func (e *BackwardsError) Error() string {
	return fmt.Sprintf("cannot start at %s: the slot has confirmed up to %s, and the server keeps WAL "+
		"for a slot only from its restart_lsn and never decodes before its confirmed_flush_lsn, "+
		"so the events before %s are gone for this slot; to deliver them again, re-insert the events "+
		"into the outbox (a new slot would start at the current WAL position, never at an older one)",
		e.Requested, e.SlotConfirmed, e.SlotConfirmed)
}

// Start decides where streaming resumes. Without a request (requested 0) it is
// the later of the saved checkpoint and the slot's confirmed_flush_lsn: the
// slot may have gone backwards in a crash, and what the checkpoint covers was
// delivered. The result is also the dedup floor: transactions ending at or
// before it are skipped.
//
// An operator's requested LSN is allowed at or after the slot's position. If it
// is beyond the usual start, the events in between are skipped (the caller logs
// that loudly); if it lies between the slot's position and a later checkpoint,
// events already delivered are delivered again. A requested LSN behind the
// slot's confirmed_flush_lsn returns a *BackwardsError.
func Start(saved, slotConfirmed, requested pglogrepl.LSN) (pglogrepl.LSN, error) {
	if requested == 0 {
		return max(saved, slotConfirmed), nil
	}
	if requested < slotConfirmed {
		return 0, &BackwardsError{Requested: requested, SlotConfirmed: slotConfirmed}
	}
	return requested, nil
}
