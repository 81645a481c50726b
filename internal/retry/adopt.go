package retry

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sql"
)

// A DB runs statements: *pgx.Conn, *pgxpool.Pool and pgx.Tx are one.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Owner is whose rows of an earlier version (no slot) Adopt and FindOrphans
// look at: the relay's slot, the retry table, the checkpoint table (whose
// rows, and its history's, name every slot that ever saved a checkpoint
// there) and the outbox tables the relay reads, as schema.table.
type Owner struct {
	Retry      sql.Table
	Checkpoint sql.Table
	Slot       string
	Outboxes   []string
}

// Orphans describes the rows of a retry table that belong to no slot: made
// by an earlier version, before rows had owners.
type Orphans struct {
	Rows int64
	// ByTable counts them by the outbox table they were read from ("" for
	// none: a logical decoding message, or a row of an even older version).
	ByTable map[string]int64
	// OtherSlots are the slots other than the owner's that saved a
	// checkpoint in the checkpoint table (or its history).
	OtherSlots []string
	// Foreign are the outbox tables of ByTable that the owner does not
	// read.
	Foreign []string
}

// Adoptable reports whether the rows are provably the owner's: no other
// slot ever saved a checkpoint beside it, and none of the rows was read from
// an outbox table it does not read.
func (o *Orphans) Adoptable() bool { return len(o.OtherSlots) == 0 && len(o.Foreign) == 0 }

// FindOrphans counts the rows of o.Retry without a slot, and what tells
// whether they are o.Slot's. It returns a zero Orphans when the table does
// not exist or is of a version older still (no slot_name column: Migrate
// adds it).
func FindOrphans(ctx context.Context, db DB, o Owner) (*Orphans, error) {
	out := &Orphans{ByTable: map[string]int64{}}
	var hasColumn bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1) AND attname = 'slot_name' AND NOT attisdropped)`, o.Retry.Quoted()).Scan(&hasColumn)
	if err != nil || !hasColumn {
		return out, wrapOrphans(o, err)
	}
	rows, err := db.Query(ctx, `SELECT coalesce(outbox_table, ''), count(*) FROM `+o.Retry.Quoted()+` WHERE slot_name IS NULL GROUP BY 1`)
	if err != nil {
		return nil, wrapOrphans(o, err)
	}
	var table string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&table, &n}, func() error {
		out.ByTable[table] = n
		out.Rows += n
		if table != "" && !slices.Contains(o.Outboxes, table) {
			out.Foreign = append(out.Foreign, table)
		}
		return nil
	}); err != nil {
		return nil, wrapOrphans(o, err)
	}
	if out.Rows == 0 {
		return out, nil
	}
	sort.Strings(out.Foreign)
	// Every slot that saved a checkpoint here: the checkpoint table keeps
	// a row per slot until an operator deletes it, the history a row per
	// slot for checkpoint.history_keep.
	hist := sql.CheckpointHistoryName(o.Checkpoint)
	var slots []string
	for _, t := range []sql.Table{o.Checkpoint, hist} {
		var exists bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Quoted()).Scan(&exists); err != nil {
			return nil, wrapOrphans(o, err)
		}
		if !exists {
			continue
		}
		rows, err := db.Query(ctx, `SELECT DISTINCT slot_name FROM `+t.Quoted()+` WHERE slot_name <> $1`, o.Slot)
		if err != nil {
			return nil, wrapOrphans(o, err)
		}
		found, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, wrapOrphans(o, err)
		}
		slots = append(slots, found...)
	}
	sort.Strings(slots)
	out.OtherSlots = slices.Compact(slots)
	return out, nil
}

func wrapOrphans(o Owner, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("look for rows without a slot in retry table %s: %w", o.Retry, err)
}

// An OrphansError says that the retry table holds rows of an earlier
// version that the relay cannot tell are its own, and how to assign them.
type OrphansError struct {
	Owner   Owner
	Orphans *Orphans
}

func (e *OrphansError) Error() string {
	o, r := e.Owner, e.Orphans
	var why []string
	if len(r.OtherSlots) > 0 {
		why = append(why, fmt.Sprintf("other slots saved checkpoints in %s too (%s)", o.Checkpoint, strings.Join(r.OtherSlots, ", ")))
	}
	if len(r.Foreign) > 0 {
		why = append(why, fmt.Sprintf("some were read from outbox tables this relay does not read (%s)", strings.Join(r.Foreign, ", ")))
	}
	var counts []string
	for _, t := range slices.Sorted(maps.Keys(r.ByTable)) {
		name := t
		if name == "" {
			name = "no outbox table (a message, or an older version's row)"
		}
		counts = append(counts, fmt.Sprintf("%s: %d", name, r.ByTable[t]))
	}
	return fmt.Sprintf("retry table %s holds %d rows of an earlier version that belong to no slot (%s), and this relay (slot %s) cannot tell they are its own: %s. "+
		"Nothing delivers, requeues or deletes them until each is given the slot of the relay that parked it; then start again. "+
		"By outbox table: UPDATE %s SET slot_name = '<the slot of the relay reading it>' WHERE slot_name IS NULL AND outbox_table = '<schema.table>'; "+
		"rows without an outbox table by their topic: UPDATE %s SET slot_name = '<slot>' WHERE slot_name IS NULL AND outbox_table IS NULL AND topic = '<topic>'",
		o.Retry, r.Rows, strings.Join(counts, ", "), sql.Literal(o.Slot), strings.Join(why, "; "), o.Retry.Quoted(), o.Retry.Quoted())
}

// Adopt gives o.Slot the rows of an earlier version (no slot) when they are
// provably its own (Orphans.Adoptable), and returns how many it adopted. When
// they may be another relay's it changes nothing and returns an
// *OrphansError saying how to assign them: guessing would let one relay
// deliver another's events to its own topics. Several relays of the slot
// may call it at once.
func Adopt(ctx context.Context, db DB, o Owner) (int64, error) {
	r, err := FindOrphans(ctx, db, o)
	if err != nil || r.Rows == 0 {
		return 0, err
	}
	if !r.Adoptable() {
		return 0, &OrphansError{Owner: o, Orphans: r}
	}
	// The tables are checked above, and again here against rows inserted
	// meanwhile by a relay of an earlier version still running.
	tag, err := db.Exec(ctx, `UPDATE `+o.Retry.Quoted()+` SET slot_name = $1
WHERE slot_name IS NULL AND (outbox_table IS NULL OR outbox_table = ANY($2))`, o.Slot, o.Outboxes)
	if err != nil {
		return 0, fmt.Errorf("give the rows without a slot in retry table %s to slot %s: %w", o.Retry, o.Slot, err)
	}
	return tag.RowsAffected(), nil
}

// Adopt is Adopt of the Store's rows, for a relay that reads outboxes and
// saves its checkpoints in checkpoint.
func (s *Store) Adopt(ctx context.Context, checkpoint sql.Table, outboxes []string) (int64, error) {
	return Adopt(ctx, s.pool, Owner{Retry: s.t, Checkpoint: checkpoint, Slot: s.slot, Outboxes: outboxes})
}
