// Package retention deletes delivered outbox rows older than a retention
// period, in small batches that do not disturb the application: the relay
// runs a Round every outbox.retention_interval, `outbox-relay prune` runs
// one now.
//
// # The invariant
//
// A row whose transaction is not yet covered by the saved checkpoint is
// never deleted, however old its created_at: that includes a row inserted by
// a transaction that stayed open across many checkpoints (created_at is the
// transaction's start, so such a row looks old when it commits). The WAL
// still carries a deleted row's insert, so the relay would deliver it
// anyway; what the rule protects is the operator's copy: replay, and
// re-inserting what a lost slot never delivered, need the rows that are not
// known to be delivered.
//
// A batch deletes only rows that satisfy both
//
//	created_at < now() - retention
//	xmin older than H.snapshot_xmin
//
// where H is the slot's horizon (checkpoint.FindHorizon): the newest row of
// the checkpoint history whose snapshot_lsn the covered position (the later
// of the saved checkpoint and the slot's confirmed_flush_lsn) has reached.
// Without such a row nothing is deleted, and the Result says why. By the
// history's rule (package checkpoint), a transaction older than
// H.snapshot_xmin committed, if at all, before H.snapshot_lsn, hence before
// the covered position: its rows were delivered. A transaction still open,
// or committed after H.snapshot_lsn, has an xid at or above H.snapshot_xmin,
// and a savepoint's xid is above its parent's: their rows are kept.
//
// The price of the rule: snapshot_xmin is the oldest transaction running on
// the whole server, in any database (any that was assigned an xid by
// writing, and prepared transactions), so one left open holds back the
// deletion of every row newer than it until it ends. Rows are kept longer,
// never deleted early.
//
// # Other readers of the outbox
//
// The checkpoint says what this relay delivered, not what every reader of
// the outbox did: a second relay with a slot of its own on the same table
// (blue/green, a migration from Debezium running side by side) needs the
// rows it has not delivered, and after losing its slot its refill reads
// them from the table. So H's snapshot_xmin is lowered to that of every
// other reader, and a batch deletes only rows older than the lowest. The
// readers are every logical slot of the database other than the relay's own
// (a slot does not record which tables it decodes: its consumer names the
// publication when it streams), and every other slot's row in the
// checkpoint table (another relay, its slot perhaps lost), less those in
// Config.IgnoreSlots. A reader's position is its checkpoint row's LSN when
// there is one (a refill starts there), else its slot's
// confirmed_flush_lsn; it maps to a horizon through the history as the own
// checkpoint does: the newest history row whose snapshot_lsn it has
// reached, of the reader's own history when it has a checkpoint row (the
// rows its refill would map its checkpoint with), else of this slot's. A reader with none (behind all history, or too old to compare
// xids with) keeps every row: nothing is deleted, and the Result names it
// and the setting that acknowledges a slot that does not read the outbox.
// A lost slot is named as such. Result.KeptForReaders counts the rows the
// own horizon would delete and the readers keep.
//
// Before a round deletes, it records the horizon it deletes up to in its
// slot's checkpoint row (checkpoint.RecordPruned): a refill or replay of any
// slot whose range needs rows of younger transactions says they may be gone
// (replay.PrunedError) instead of reporting a short count as complete.
//
// # Comparing a row's xmin with snapshot_xmin
//
// xmin is a 32-bit xid that wraps around; snapshot_xmin is a 64-bit xid8.
// They are compared as ages relative to the same "now" (age() is stable
// within a transaction): age(xmin) > age(snapshot_xmin mod 2^32). This is
// exact while both are less than 2^31 transactions old. For snapshot_xmin,
// FindHorizon refuses a horizon older than checkpoint.MaxHorizonAge (a
// running relay records a new one every minute). For xmin: a row not yet
// covered has an xid at or above snapshot_xmin, so it is younger than that
// too and its age is exact; VACUUM freezing it keeps its xmin (PostgreSQL
// 9.4 and later mark frozen tuples with a flag). Only a frozen row more than
// 2^31 transactions old can show a wrong age: negative (taken as old and
// deleted: it is older than any horizon, so that is right) or, after 2^32
// transactions, small (then it is kept: a leak, never a loss). A row whose
// xmin reads as FrozenTransactionId (frozen before 9.4 and carried over by
// pg_upgrade) has age 2^31-1 and is deleted: it predates any slot.
//
// # Disturbing the application as little as possible
//
// Each batch is its own transaction with SET LOCAL statement_timeout, deletes
// at most BatchSize rows (oldest created_at first, through the created_at
// index, by ctid), and is followed by a Pause. A round stops at the first
// batch that deletes fewer rows than BatchSize. Only the outbox table is
// touched: the retry table keeps its rows until they are delivered or dropped.
//
// # Partitioned outboxes
//
// Rows are deleted through the partitioned table like through a plain one,
// by the same rule; a batch names its rows by (tableoid, ctid), since a ctid
// is unique only within one partition.
//
// With Config.Partitions drop or detach (the outbox partitioned BY RANGE
// (created_at) alone), a round instead removes whole partitions, and deletes
// no row outside the default partition. A partition is removed only when
//
//   - its range ends at or before now() - retention, so every row it holds or
//     could ever be given is older than the retention (a partition created
//     ahead for next month is empty, and never due); and
//   - every row in it may be deleted by the rule above: one row whose
//     transaction the checkpoint does not cover keeps the whole partition.
//
// The rows are counted under a SHARE lock on the partition, held until the
// DROP TABLE or DETACH PARTITION in the same transaction commits, so no
// insert can slip in between (see removePartition for the locks and why
// DETACH CONCURRENTLY is not used). The default partition is never removed
// (it takes rows of any age); its rows are deleted in batches by the rule.
// A sub-partitioned partition is left alone. Detach leaves the partition as
// a table of its own: archiving and dropping it is the operator's job.
package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Defaults of Config's zero values, exported for the CLI's key table.
const (
	DefaultInterval         = time.Minute
	DefaultBatchSize        = 1000
	DefaultPause            = 100 * time.Millisecond
	DefaultStatementTimeout = 5 * time.Second
)

// MaxBatchSize bounds Config.BatchSize: a batch is one short transaction.
const MaxBatchSize = 100_000

// CreatedAtColumn is the outbox table's column retention reads: the one
// `outbox-relay setup --create-outbox-table` creates (timestamptz, default
// now()) and `outbox-relay lag` reads.
const CreatedAtColumn = "created_at"

// Config configures a Round. Zero values mean the documented defaults.
type Config struct {
	Table           string        // the outbox table; default sql.DefaultOutboxTable
	CheckpointTable string        // default sql.DefaultCheckpointTable; its history is beside it
	Slot            string        // required: whose checkpoint covers the rows
	Retention       time.Duration // required: rows younger than this are kept
	// Interval is how often the relay starts a round (Round itself ignores
	// it). Default 1m.
	Interval         time.Duration
	BatchSize        int           // rows per DELETE, default 1000
	Pause            time.Duration // between batches, default 100ms
	StatementTimeout time.Duration // per batch (SET LOCAL statement_timeout), default 5s

	// Partitions is how a round removes rows of a partitioned outbox:
	// PartitionsDelete (the default) deletes rows; PartitionsDrop and
	// PartitionsDetach remove whole partitions (see "Partitioned outboxes"
	// in the package doc).
	Partitions PartitionMode

	// IgnoreSlots names logical slots of the database (or rows of the
	// checkpoint table) that do not read the outbox table: retention does
	// not wait for them (see "Other readers" in the package doc).
	IgnoreSlots []string

	// BufferTable is the relay's WAL buffer table (sql.WALBufferTable;
	// "": none): rows of transactions the buffer holds events of are not
	// delivered yet, so the slot's oldest buffered commit holds the
	// horizon back like another reader.
	BufferTable string

	// DryRun counts what a round would delete, in read-only statements
	// (their timeout the larger of StatementTimeout and 60s), and deletes
	// nothing; with Partitions drop or detach it lists the partitions that
	// would go.
	DryRun bool
	// Deleted, when set, is called after each committed batch with the
	// number of rows it deleted.
	Deleted func(n int64)
}

// Validate fills defaults and returns every value that cannot work, each a
// *field.Error naming its field and the fix. A zero Retention is valid (off:
// a relay then runs no rounds) and the other fields are checked all the same,
// so that turning retention on later reveals no typo; Round needs it set.
// The relay calls Validate at start-up.
func (c *Config) Validate() error {
	var v field.Checker
	if c.Retention < 0 {
		v.Errorf("Retention", "%s is negative; use a period such as 7d or 12h, or 0 for off", c.Retention)
	}
	field.Default(&c.Table, sql.DefaultOutboxTable)
	field.Default(&c.CheckpointTable, sql.DefaultCheckpointTable)
	field.Positive(&v, "Interval", &c.Interval, DefaultInterval)
	field.Positive(&v, "BatchSize", &c.BatchSize, DefaultBatchSize)
	if c.BatchSize > MaxBatchSize {
		v.Errorf("BatchSize", "%d is out of range; allowed 1 to %d (default %d): each batch is one transaction, keep it short", c.BatchSize, MaxBatchSize, DefaultBatchSize)
	}
	field.Positive(&v, "Pause", &c.Pause, DefaultPause)
	field.Positive(&v, "StatementTimeout", &c.StatementTimeout, DefaultStatementTimeout)
	switch c.Partitions {
	case "":
		c.Partitions = PartitionsDelete
	case PartitionsDelete, PartitionsDrop, PartitionsDetach:
	default:
		v.Errorf("Partitions", "%q is not one of delete (rows, the default), drop or detach (whole partitions of an outbox partitioned by range on created_at)", c.Partitions)
	}
	return v.Err()
}

// validateRound is Validate for Round, which also needs the slot whose
// checkpoint covers the rows and a retention period.
func (c *Config) validateRound() error {
	var v field.Checker
	v.Add(c.Validate())
	if c.Slot == "" {
		v.Add(field.Required("Slot", "name the slot whose checkpoint says which rows are delivered"))
	}
	if c.Retention == 0 {
		v.Add(field.Required("Retention", "a round deletes rows older than the retention period"))
	}
	return v.Err()
}

// A DB runs the statements of a round: *pgx.Conn and *pgxpool.Pool satisfy
// it. A round uses it from one goroutine.
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Result is what a round did.
type Result struct {
	// Horizon is what the round deleted up to; nil when there is none, and
	// then NoHorizon says why nothing was deleted.
	Horizon       *checkpoint.Horizon
	NoHorizon     string
	NoHorizonKind checkpoint.NoHorizonKind
	// Xmin is the horizon the round deleted up to: Horizon's snapshot_xmin,
	// or an older one of a reader in HeldBy; 0 when nothing was deleted
	// for want of one.
	Xmin uint64
	// HeldBy are the other readers whose horizon is older than the own
	// (or who have none: then nothing is deleted and NoHorizonKind is
	// HeldBySlot). KeptForReaders is how many rows older than the
	// retention the own horizon would delete and they keep: at most
	// MaxKeptCount unless DryRun.
	HeldBy         []Reader
	KeptForReaders int64
	Deleted        int64 // rows deleted, or removed with their partition; with DryRun, rows that would be
	Batches        int   // DELETE statements run
	// Partitions: with Config.Partitions drop or detach, the partitions
	// whose range lies wholly before the retention: dropped or detached
	// (with DryRun: would be), or kept and why.
	Partitions []Partition
	// Overdue is how long the oldest row older than the retention that is
	// still in the table has been due (its age minus the retention), after
	// the round; 0 when there is none. OldestExpired is its created_at.
	Overdue       time.Duration
	OldestExpired *time.Time
}

// Round deletes, in batches, the outbox rows older than cfg.Retention whose
// transactions the slot's checkpoint covers (see the package doc), and
// reports what it did. No horizon is not an error: Result.NoHorizon says why
// nothing was deleted. An error from a batch ends the round; the batches
// before it stay committed.
func Round(ctx context.Context, db DB, cfg Config) (Result, error) {
	var res Result
	if err := cfg.validateRound(); err != nil {
		return res, err
	}
	t, err := sql.ParseTable(cfg.Table)
	if err != nil {
		return res, fmt.Errorf("outbox table: %w", err)
	}
	var parts *partitioning
	if cfg.Partitions != PartitionsDelete {
		p, err := partitionsOf(ctx, db, t, cfg)
		if err != nil {
			return res, err
		}
		parts = &p
	}
	h, err := checkpoint.FindHorizon(ctx, db, cfg.CheckpointTable, cfg.Slot)
	var nh *checkpoint.NoHorizonError
	switch {
	case errors.As(err, &nh):
		res.NoHorizon, res.NoHorizonKind = nh.Reason, nh.Kind
	case err != nil:
		return res, err
	default:
		res.Horizon = h
		if err := holdBack(ctx, db, t, cfg, &res); err != nil {
			return res, err
		}
		// Recorded before the rows go: a refill or replay of another slot
		// that needed rows older than this says they may be gone.
		if res.Xmin != 0 && !cfg.DryRun {
			if err := checkpoint.RecordPruned(ctx, db, cfg.CheckpointTable, cfg.Slot, t.Quoted(), res.Xmin); err != nil {
				return res, err
			}
		}
		switch {
		case res.Xmin == 0:
		case parts != nil:
			err = partitionRound(ctx, db, *parts, cfg, res.Xmin, &res)
		case cfg.DryRun:
			res.Deleted, err = count(ctx, db, t.Quoted(), t.String(), cfg, res.Xmin)
		default:
			err = deleteBatches(ctx, db, t.Quoted(), t.String(), cfg, res.Xmin, &res)
		}
		if err != nil {
			return res, err
		}
	}
	from := t.Quoted()
	if parts != nil {
		if from = parts.left(res, cfg.DryRun); from == "" {
			return res, nil
		}
	}
	res.OldestExpired, res.Overdue, err = overdue(ctx, db, from, t.String(), cfg.Retention)
	return res, err
}

// expired is the predicate of a deletable row: $1 the retention in seconds,
// $2 the horizon's snapshot_xmin (xid8, as bigint). See the package doc for
// the age comparison; age(xmin) < 0 is a frozen row more than 2^31
// transactions old.
func expired() string {
	return sql.Ident(CreatedAtColumn) + ` < now() - make_interval(secs => $1)
      AND ` + xminOlder("$2")
}

// xminOlder says that a row's transaction is older than the xid8 (as
// bigint) in the parameter arg.
func xminOlder(arg string) string {
	return `(age(xmin) > age((` + arg + `::bigint % 4294967296)::text::xid) OR age(xmin) < 0)`
}

// deleteBatches deletes the expired rows of table (quoted SQL text; the
// outbox, or one partition of it) in batches. A batch names its rows by
// (tableoid, ctid): a ctid is unique only within one table, and through a
// partitioned parent "ctid = ANY(…)" alone matches the same ctid in every
// partition, deleting rows that were never selected (undelivered ones
// included). The ctid = ANY(…) is kept for the plan: a TID scan per
// partition, where a join on (tableoid, ctid) alone scans every partition.
func deleteBatches(ctx context.Context, db DB, table, name string, cfg Config, xmin uint64, res *Result) error {
	q := `WITH batch AS MATERIALIZED (
    SELECT tableoid AS t, ctid AS c FROM ` + table + `
    WHERE ` + expired() + `
    ORDER BY ` + sql.Ident(CreatedAtColumn) + ` LIMIT $3)
DELETE FROM ` + table + ` WHERE ctid = ANY(ARRAY(SELECT c FROM batch)) AND (tableoid, ctid) IN (SELECT t, c FROM batch)`
	timeout := strconv.FormatInt(cfg.StatementTimeout.Milliseconds(), 10)
	for {
		n, err := batch(ctx, db, timeout, q, cfg.Retention.Seconds(), int64(xmin), cfg.BatchSize)
		if err != nil {
			return fmt.Errorf("delete expired rows from %s (batch %d): %w", name, res.Batches+1, err)
		}
		res.Batches++
		res.Deleted += n
		if cfg.Deleted != nil {
			cfg.Deleted(n)
		}
		if n < int64(cfg.BatchSize) {
			return nil
		}
		if err := backoff.Sleep(ctx, cfg.Pause); err != nil {
			return err
		}
	}
}

// batch runs one DELETE in a transaction of its own, bounded by the
// statement timeout, and returns the rows it deleted once committed.
func batch(ctx context.Context, db DB, timeoutMillis, q string, args ...any) (int64, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, timeoutMillis); err != nil {
		return 0, err
	}
	tag, err := tx.Exec(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func count(ctx context.Context, db DB, table, name string, cfg Config, xmin uint64) (int64, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	timeout := max(cfg.StatementTimeout, time.Minute)
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('transaction_read_only', 'on', true)`,
		strconv.FormatInt(timeout.Milliseconds(), 10)); err != nil {
		return 0, err
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE `+expired(),
		cfg.Retention.Seconds(), int64(xmin)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count expired rows in %s: %w", name, err)
	}
	return n, nil
}

// overdue finds the oldest row older than the retention in from (a table,
// or a subquery with a created_at column), through the created_at index.
func overdue(ctx context.Context, db DB, from, name string, retention time.Duration) (*time.Time, time.Duration, error) {
	c := sql.Ident(CreatedAtColumn)
	var oldest *time.Time
	var secs *float64
	err := db.QueryRow(ctx, `SELECT m, extract(epoch FROM (now() - make_interval(secs => $1)) - m)::float8
FROM (SELECT min(`+c+`)::timestamptz AS m FROM `+from+` WHERE `+c+` < now() - make_interval(secs => $1)) s`,
		retention.Seconds()).Scan(&oldest, &secs)
	if err != nil {
		return nil, 0, fmt.Errorf("find the oldest expired row in %s: %w", name, err)
	}
	if secs == nil || *secs < 0 {
		return oldest, 0, nil
	}
	return oldest, time.Duration(*secs * float64(time.Second)), nil
}

// CheckTable reports whether retention can work on the outbox table: it
// exists, has a created_at column of a timestamp type, and the role may
// delete from it. The error says how to fix it.
func CheckTable(ctx context.Context, q checkpoint.Querier, table string) error {
	t, err := sql.ParseTable(table)
	if err != nil {
		return fmt.Errorf("outbox table: %w", err)
	}
	var exists, canDelete bool
	var typ *string
	err = q.QueryRow(ctx, `SELECT c.oid IS NOT NULL,
       (SELECT format_type(a.atttypid, NULL) FROM pg_catalog.pg_attribute a
        WHERE a.attrelid = c.oid AND a.attname = $2 AND NOT a.attisdropped),
       c.oid IS NOT NULL AND has_table_privilege(c.oid, 'DELETE')
FROM (SELECT to_regclass($1)::oid AS oid) c`, t.Quoted(), CreatedAtColumn).Scan(&exists, &typ, &canDelete)
	switch {
	case err != nil:
		return fmt.Errorf("look up outbox table %s: %w", t, err)
	case !exists:
		return field.Errorf("Table", "outbox table %s does not exist: create it, or name your outbox table", t)
	case typ == nil:
		return field.Errorf("Retention", "set, but the outbox table %s has no %q column to tell a row's age: add it "+
			"(ALTER TABLE %s ADD COLUMN %s timestamptz NOT NULL DEFAULT now(); existing rows get the time of the ALTER) "+
			"and an index on it, or set {Retention} to \"\" (off)", t, CreatedAtColumn, t.Quoted(), sql.Ident(CreatedAtColumn))
	case *typ != "timestamp with time zone" && *typ != "timestamp without time zone":
		return field.Errorf("Retention", "set, but %s.%s is %s, not a timestamp: retention cannot tell a row's age; set {Retention} to \"\" (off)",
			t, CreatedAtColumn, *typ)
	case !canDelete:
		return field.Errorf("Retention", "set, but the relay's role may not delete from %s: GRANT DELETE ON %s TO <the relay's role>, or set {Retention} to \"\" (off)",
			t, t.Quoted())
	}
	return nil
}
