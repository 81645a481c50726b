package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sql"
)

// A Pruned is what a slot's retention may have deleted from an outbox
// table: rows of transactions older than Xmin (a full xid). Recorded in the
// slot's checkpoint row (column pruned, keyed by the table's schema.name as
// the catalog spells it) before the rows are deleted.
type Pruned struct {
	Slot string
	Xmin uint64
}

// prunedKey is the key of the outbox table (quoted SQL name in $2) in the
// column pruned: its schema and name as the catalog spells them, whatever
// the search_path or the configured spelling.
const prunedKey = `SELECT n.nspname || '.' || c.relname AS key FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($2)`

// RecordPruned records, in slot's checkpoint row, that its retention is
// about to delete rows of outbox table (quoted SQL name) older than xmin (see Pruned); it
// never lowers a recorded xmin. It runs over q, as a round's other
// statements do. A checkpoint table without the column (from an older
// version, not upgraded) gets an error saying how to add it.
func RecordPruned(ctx context.Context, q Querier, checkpointTable, slot, table string, xmin uint64) error {
	t, err := sql.ParseTable(checkpointTable)
	if err != nil {
		return fmt.Errorf("checkpoint table: %w", err)
	}
	x := strconv.FormatUint(xmin, 10)
	var one int
	err = q.QueryRow(ctx, `WITH k AS (`+prunedKey+`)
UPDATE `+t.Quoted()+` SET pruned = coalesce(pruned, '{}') || jsonb_build_object((SELECT key FROM k), $3::text)
WHERE slot_name = $1 AND coalesce((pruned->>(SELECT key FROM k))::numeric, 0) < $3::numeric RETURNING 1`, slot, table, x).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // recorded already, or no row: then nothing is covered
	}
	if err != nil {
		return fmt.Errorf("record in %s what retention deletes (as the table's owner, run %q, or outbox-relay setup): %w",
			t, sql.CheckpointUpgrade(t), err)
	}
	return nil
}

// FindPruned returns the newest record of any slot's retention for outbox
// table (quoted SQL name): the highest Xmin, and its slot, and false when none is recorded.
// It reads a table without the column, or no table, as none.
func FindPruned(ctx context.Context, q Querier, checkpointTable, table string) (Pruned, bool, error) {
	t, err := sql.ParseTable(checkpointTable)
	if err != nil {
		return Pruned{}, false, fmt.Errorf("checkpoint table: %w", err)
	}
	var slot, x string
	err = q.QueryRow(ctx, `WITH k AS (`+strings.ReplaceAll(prunedKey, "$2", "$1")+`)
SELECT slot_name, to_jsonb(c)->'pruned'->>(SELECT key FROM k) FROM `+t.Quoted()+` c
WHERE to_jsonb(c)->'pruned'->>(SELECT key FROM k) IS NOT NULL
ORDER BY (to_jsonb(c)->'pruned'->>(SELECT key FROM k))::numeric DESC LIMIT 1`, table).Scan(&slot, &x)
	var pe *pgconn.PgError
	if errors.Is(err, pgx.ErrNoRows) || errors.As(err, &pe) && pe.Code == "42P01" {
		// No checkpoint table: no retention of any slot ever recorded
		// anything in it (replay can run where only the history is).
		return Pruned{}, false, nil
	}
	if err != nil {
		return Pruned{}, false, fmt.Errorf("read what retention deleted from %s: %w", table, err)
	}
	xmin, err := strconv.ParseUint(x, 10, 64)
	if err != nil {
		return Pruned{}, false, fmt.Errorf("pruned xmin %q of slot %q: %w", x, slot, err)
	}
	return Pruned{Slot: slot, Xmin: xmin}, true, nil
}
