// Package isolation finds the neighbours of a relay in its database: other
// relays' rows in the retry and checkpoint tables it shares with them, other
// logical replication slots, and other publications of its outbox tables;
// and says what each means. setup, check and run report them; none is an
// error.
//
// Isolation is by slot, the relay's identity: every row of the retry table,
// the checkpoint table, its history and the replay table names the slot of
// the relay that wrote it, and a relay reads, delivers, requeues, deletes and
// prunes only its own slot's rows (relays of one slot, a leader and its
// standbys, share them). So several services may share those tables, and
// several slots may read one outbox table, each delivering every event to
// its own topics. What they still share is the outbox table itself: a slot
// reading it through another relay (or Debezium) needs its rows until it has
// read them, which retention (outbox.retention) must account for.
package isolation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/sql"
)

// A DB runs queries: *pgx.Conn, *pgxpool.Pool and pgx.Tx are one.
type DB interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config is the relay Survey looks around: its slot and publication, its
// retry and checkpoint tables and its outbox tables (schema-qualified, or
// in public).
type Config struct {
	Slot        string
	Publication string
	Retry       sql.Table
	Checkpoint  sql.Table
	Outboxes    []sql.Table
}

// A Slot is a logical replication slot of the database other than the
// relay's.
type Slot struct {
	Name, Plugin string
	Active       bool
}

// A Report is what Survey found besides the relay's own.
type Report struct {
	// RetryRows counts the rows of other slots in the retry table, by slot.
	RetryRows map[string]int64
	// SameOutbox are the other slots with rows in the retry table read
	// from one of the relay's outbox tables: relays reading it too.
	SameOutbox []string
	// CheckpointSlots are the other slots with a row in the checkpoint
	// table.
	CheckpointSlots []string
	// Slots are the other logical replication slots of the database.
	Slots []Slot
	// Publications are the other publications that publish one of the
	// relay's outbox tables (or all tables), by outbox table.
	Publications map[string][]string
}

// Empty reports whether the relay has no neighbour.
func (r *Report) Empty() bool {
	return len(r.RetryRows) == 0 && len(r.CheckpointSlots) == 0 && len(r.Slots) == 0 && len(r.Publications) == 0
}

// Survey looks for cfg's neighbours. Tables that do not exist (or are of an
// earlier version) are skipped: setup and check report those.
func Survey(ctx context.Context, db DB, cfg Config) (*Report, error) {
	r := &Report{RetryRows: map[string]int64{}, Publications: map[string][]string{}}
	var outboxes []string
	for _, t := range cfg.Outboxes {
		outboxes = append(outboxes, qualified(t))
	}
	if ok, err := hasColumn(ctx, db, cfg.Retry, "slot_name"); err != nil {
		return nil, err
	} else if ok {
		rows, err := db.Query(ctx, `SELECT slot_name, count(*), bool_or(outbox_table = ANY($2)) FROM `+cfg.Retry.Quoted()+`
WHERE slot_name <> $1 GROUP BY 1 ORDER BY 1`, cfg.Slot, outboxes)
		if err != nil {
			return nil, fmt.Errorf("read the slots of retry table %s: %w", cfg.Retry, err)
		}
		var slot string
		var n int64
		var same *bool
		if _, err := pgx.ForEachRow(rows, []any{&slot, &n, &same}, func() error {
			r.RetryRows[slot] = n
			if same != nil && *same {
				r.SameOutbox = append(r.SameOutbox, slot)
			}
			return nil
		}); err != nil {
			return nil, fmt.Errorf("read the slots of retry table %s: %w", cfg.Retry, err)
		}
	}
	if ok, err := hasColumn(ctx, db, cfg.Checkpoint, "slot_name"); err != nil {
		return nil, err
	} else if ok {
		rows, err := db.Query(ctx, `SELECT slot_name FROM `+cfg.Checkpoint.Quoted()+` WHERE slot_name <> $1 ORDER BY 1`, cfg.Slot)
		if err != nil {
			return nil, fmt.Errorf("read checkpoint table %s: %w", cfg.Checkpoint, err)
		}
		if r.CheckpointSlots, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			return nil, fmt.Errorf("read checkpoint table %s: %w", cfg.Checkpoint, err)
		}
	}
	rows, err := db.Query(ctx, `SELECT slot_name::text, coalesce(plugin::text, ''), active FROM pg_catalog.pg_replication_slots
WHERE slot_type = 'logical' AND database = current_database() AND slot_name <> $1 ORDER BY 1`, cfg.Slot)
	if err != nil {
		return nil, fmt.Errorf("read the replication slots: %w", err)
	}
	if r.Slots, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Slot, error) {
		var s Slot
		err := row.Scan(&s.Name, &s.Plugin, &s.Active)
		return s, err
	}); err != nil {
		return nil, fmt.Errorf("read the replication slots: %w", err)
	}
	rows, err = db.Query(ctx, `SELECT t.schemaname || '.' || t.tablename, t.pubname::text FROM pg_catalog.pg_publication_tables t
WHERE t.pubname <> $1 AND t.schemaname || '.' || t.tablename = ANY($2) ORDER BY 1, 2`, cfg.Publication, outboxes)
	if err != nil {
		return nil, fmt.Errorf("read the publications: %w", err)
	}
	var table, pub string
	if _, err := pgx.ForEachRow(rows, []any{&table, &pub}, func() error {
		r.Publications[table] = append(r.Publications[table], pub)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read the publications: %w", err)
	}
	return r, nil
}

func hasColumn(ctx context.Context, db DB, t sql.Table, column string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1) AND attname = $2 AND NOT attisdropped)`, t.Quoted(), column).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look up table %s: %w", t, err)
	}
	return ok, nil
}

// qualified is t as schema.table, in public when unqualified: how the relay
// names an outbox table in the retry table's outbox_table column.
func qualified(t sql.Table) string {
	if t.Schema == "" {
		return "public." + t.Name
	}
	return t.String()
}

// A Finding is one neighbour, in plain words: what was found, what it
// means for this relay. Reader is set when another slot may read the
// relay's outbox table: a reader retention must wait for.
type Finding struct {
	What, Meaning string
	Reader        bool
}

// Findings says what r means for the relay of cfg, one Finding per kind of
// neighbour.
func (r *Report) Findings(cfg Config) []Finding {
	var out []Finding
	if len(r.RetryRows) > 0 {
		var parts []string
		for _, s := range slices.Sorted(maps.Keys(r.RetryRows)) {
			parts = append(parts, fmt.Sprintf("%s (%d)", s, r.RetryRows[s]))
		}
		out = append(out, Finding{
			What: fmt.Sprintf("retry table %s also holds rows of other slots: %s", cfg.Retry, strings.Join(parts, ", ")),
			Meaning: "isolation is by slot: those rows are their relays' own, and this relay never reads, delivers, requeues or deletes them " +
				"(nor does `retries` with this configuration list them)",
		})
	}
	if len(r.CheckpointSlots) > 0 {
		out = append(out, Finding{
			What: fmt.Sprintf("checkpoint table %s also holds the checkpoints of slots %s", cfg.Checkpoint, strings.Join(r.CheckpointSlots, ", ")),
			Meaning: "relays of other slots share it; each reads and writes only its own slot's row and history, " +
				"and lag, status and checkpoint commands with this configuration show only this slot's",
		})
	}
	if len(r.SameOutbox) > 0 {
		out = append(out, Finding{
			What: fmt.Sprintf("slots %s parked events of this relay's outbox tables in the retry table: their relays read the same outbox", strings.Join(r.SameOutbox, ", ")),
			Meaning: "each delivers every event to its own topics, and their parked rows are untouched here; " +
				"outbox.retention waits for them: it deletes only rows every other slot of the database has read, unless outbox.retention_ignore_slots names one of them",
			Reader: true,
		})
	}
	if len(r.Publications) > 0 {
		var parts []string
		for _, t := range slices.Sorted(maps.Keys(r.Publications)) {
			parts = append(parts, fmt.Sprintf("%s by %s", t, strings.Join(r.Publications[t], ", ")))
		}
		out = append(out, Finding{
			What: fmt.Sprintf("other publications publish this relay's outbox tables: %s", strings.Join(parts, "; ")),
			Meaning: "a slot reading through them (another relay, Debezium) reads the same events and delivers them itself; " +
				"outbox.retention waits for every other slot of the database: it deletes only rows they have all read, unless outbox.retention_ignore_slots names one",
			Reader: true,
		})
	}
	if len(r.Slots) > 0 {
		var parts []string
		for _, s := range r.Slots {
			state := "inactive"
			if s.Active {
				state = "active"
			}
			parts = append(parts, fmt.Sprintf("%s (%s, %s)", s.Name, s.Plugin, state))
		}
		out = append(out, Finding{
			What: fmt.Sprintf("other logical replication slots in this database: %s", strings.Join(parts, ", ")),
			Meaning: "each keeps WAL from its own position, and a relay of another slot keeps its own rows in shared tables; " +
				"outbox.retention deletes only rows each of them has read (a slot that never reads the outbox holds it back: name it in outbox.retention_ignore_slots)",
		})
	}
	return out
}
