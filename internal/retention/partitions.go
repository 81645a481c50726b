package retention

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/sql"
)

// PartitionMode is how a round removes the rows of a partitioned outbox.
type PartitionMode string

// The partition modes (Config.Partitions).
const (
	// PartitionsDelete deletes rows in batches, partitioned or not: the default.
	PartitionsDelete PartitionMode = "delete"
	// PartitionsDrop drops a partition once every row it can hold is older
	// than the retention and every row in it is delivered.
	PartitionsDrop PartitionMode = "drop"
	// PartitionsDetach detaches such a partition instead, leaving it as a
	// table of its own for the operator to archive and drop.
	PartitionsDetach PartitionMode = "detach"
)

// PartitionLockTimeout bounds each lock a partition drop or detach waits for.
// DROP and DETACH take an ACCESS EXCLUSIVE lock on the outbox table, which
// queues every insert behind it while it waits: this is the longest the
// application's inserts can be held up. A partition whose lock is not
// obtained is tried again next round.
const PartitionLockTimeout = 500 * time.Millisecond

// A Partition is one partition a round considered: one whose range lies
// wholly before the retention.
type Partition struct {
	Name string // schema-qualified, quoted as SQL needs
	Rows int64  // rows in it when checked
	Gone bool   // dropped or detached; with DryRun, would be
	Kept string // why it was not, when !Gone
}

// partitioning is what a round needs to know of a partitioned outbox.
type partitioning struct {
	parent sql.Table
	def    string      // the default partition, quoted; "" when there is none
	due    []Partition // partitions whose upper bound is at or before now() - retention (Name only)
}

// boundTo extracts the upper bound of a range partition from
// pg_get_expr(relpartbound): FOR VALUES FROM (…) TO ('…'). MAXVALUE does not
// match, so such a partition is never due.
const boundTo = ` TO \('([^']*)'\)$`

// partitionsOf checks that t is range-partitioned by created_at alone, the
// only layout in which a partition's range says how old its rows are, and
// lists its partitions.
func partitionsOf(ctx context.Context, db DB, t sql.Table, cfg Config) (partitioning, error) {
	p := partitioning{parent: t}
	if err := checkLayout(ctx, db, t, cfg.Partitions); err != nil {
		return p, err
	}
	// DB has no Query (a round's statements are rows or transactions):
	// the list is read in a transaction that changes nothing.
	tx, err := db.Begin(ctx)
	if err != nil {
		return p, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `SELECT format('%I.%I', n.nspname, c.relname), c.relkind = 'p',
       coalesce(pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', false),
       coalesce((regexp_match(pg_get_expr(c.relpartbound, c.oid), $3))[1]::timestamptz <= now() - make_interval(secs => $2), false)
FROM pg_catalog.pg_inherits i
JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE i.inhparent = $1::regclass
ORDER BY 1`, t.Quoted(), cfg.Retention.Seconds(), boundTo)
	if err != nil {
		return p, fmt.Errorf("list the partitions of %s: %w", t, err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		var sub, def, due bool
		if err := rows.Scan(&name, &sub, &def, &due); err != nil {
			return p, fmt.Errorf("list the partitions of %s: %w", t, err)
		}
		switch {
		case def:
			p.def = name
		case due && sub:
			p.due = append(p.due, Partition{Name: name, Kept: "it is partitioned itself: retention drops only partitions that hold rows"})
		case due:
			p.due = append(p.due, Partition{Name: name})
		}
	}
	if err := rows.Err(); err != nil {
		return p, fmt.Errorf("list the partitions of %s: %w", t, err)
	}
	return p, nil
}

// checkLayout returns an error saying what to do unless t is partitioned by
// range on created_at alone.
func checkLayout(ctx context.Context, q checkpoint.Querier, t sql.Table, mode PartitionMode) error {
	var strategy, key *string
	var columns int
	err := q.QueryRow(ctx, `SELECT p.partstrat::text, coalesce(p.partnatts, 0),
       (SELECT a.attname::text FROM pg_catalog.pg_attribute a WHERE a.attrelid = p.partrelid AND a.attnum = p.partattrs[0])
FROM (SELECT to_regclass($1)::oid AS oid) c
LEFT JOIN pg_catalog.pg_partitioned_table p ON p.partrelid = c.oid`, t.Quoted()).Scan(&strategy, &columns, &key)
	switch {
	case err != nil:
		return fmt.Errorf("look up how %s is partitioned: %w", t, err)
	case strategy == nil:
		return field.Errorf("Partitions", "%s, but the outbox table %s is not partitioned: set {Partitions} to delete (rows)", mode, t)
	case *strategy != "r" || columns != 1 || key == nil || *key != CreatedAtColumn:
		return field.Errorf("Partitions", "%s, but the outbox table %s is not partitioned BY RANGE (%s) alone, "+
			"so a partition's range does not say how old its rows are: set {Partitions} to delete (rows)", mode, t, CreatedAtColumn)
	}
	return nil
}

// CheckPartitions reports whether a round with mode can work on the outbox
// table: for drop and detach, it is partitioned by range on created_at alone
// and the role owns what the statements change (DROP TABLE: the partitions;
// DETACH PARTITION: the outbox table and the partitions). The error says how
// to fix it. It checks nothing for PartitionsDelete: CheckTable does.
func CheckPartitions(ctx context.Context, q checkpoint.Querier, table string, mode PartitionMode) error {
	if mode == "" || mode == PartitionsDelete {
		return nil
	}
	t, err := sql.ParseTable(table)
	if err != nil {
		return fmt.Errorf("outbox table: %w", err)
	}
	if err := checkLayout(ctx, q, t, mode); err != nil {
		return err
	}
	var parentOwned bool
	var notOwned *string
	err = q.QueryRow(ctx, `SELECT pg_has_role(p.relowner, 'USAGE'),
       (SELECT string_agg(format('%I.%I', n.nspname, c.relname), ', ' ORDER BY n.nspname, c.relname)
        FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE i.inhparent = p.oid AND NOT pg_has_role(c.relowner, 'USAGE'))
FROM pg_catalog.pg_class p WHERE p.oid = to_regclass($1)`, t.Quoted()).Scan(&parentOwned, &notOwned)
	if err != nil {
		return fmt.Errorf("look up the owners of %s and its partitions: %w", t, err)
	}
	var missing []string
	if mode == PartitionsDetach && !parentOwned {
		missing = append(missing, "the outbox table "+t.String()+" (DETACH PARTITION alters it)")
	}
	if notOwned != nil {
		missing = append(missing, "the partitions "+*notOwned)
	}
	if len(missing) > 0 {
		return field.Errorf("Partitions", "%s, but the relay's role does not own %s: "+
			"ALTER TABLE … OWNER TO <relay role> (or GRANT <owning role> TO <relay role>), or set {Partitions} to delete",
			mode, strings.Join(missing, ", nor "))
	}
	return nil
}

// partitionRound removes the due partitions whose rows are all delivered,
// then deletes the expired, delivered rows of the default partition (which
// is never dropped: it takes rows of any age).
func partitionRound(ctx context.Context, db DB, p partitioning, cfg Config, xmin uint64, res *Result) error {
	var err error
	for _, part := range p.due {
		if part.Kept == "" {
			if cfg.DryRun {
				part, err = checkPartition(ctx, db, part.Name, cfg, xmin, res.HeldBy)
			} else {
				part, err = removePartition(ctx, db, p.parent, part.Name, cfg, xmin, res.HeldBy)
			}
			if err != nil {
				return err
			}
		}
		res.Partitions = append(res.Partitions, part)
		if part.Gone {
			res.Deleted += part.Rows
			if !cfg.DryRun && cfg.Deleted != nil {
				cfg.Deleted(part.Rows)
			}
		}
	}
	if p.def == "" {
		return nil
	}
	if cfg.DryRun {
		n, err := count(ctx, db, p.def, p.def, cfg, xmin)
		res.Deleted += n
		return err
	}
	return deleteBatches(ctx, db, p.def, p.def, cfg, xmin, res)
}

// left is what is overdue after a round is measured over (see overdue): the
// rows a partition mode removes once due, those of the due partitions still
// there and of the default partition. Rows in partitions whose range is not
// yet past the retention are not due, however old: a monthly partition's
// first rows are a month older than it. "" when there is nothing.
func (p partitioning) left(res Result, dryRun bool) string {
	gone := map[string]bool{}
	for _, part := range res.Partitions {
		gone[part.Name] = part.Gone && !dryRun
	}
	var from []string
	for _, part := range p.due {
		if !gone[part.Name] {
			from = append(from, `SELECT `+sql.Ident(CreatedAtColumn)+` FROM ONLY `+part.Name)
		}
	}
	if p.def != "" {
		from = append(from, `SELECT `+sql.Ident(CreatedAtColumn)+` FROM ONLY `+p.def)
	}
	if len(from) == 0 {
		return ""
	}
	return `(` + strings.Join(from, ` UNION ALL `) + `) due`
}

// rowsQuery counts a partition's rows, and those a round may not delete.
// A NULL created_at cannot be in a range partition, but is counted as not
// deletable all the same.
func rowsQuery(part string) string {
	return `SELECT count(*), count(*) FILTER (WHERE NOT coalesce(` + expired() + `, false)) FROM ONLY ` + part
}

// checkPartition says, without locks or changes, whether removePartition
// would remove the partition now.
func checkPartition(ctx context.Context, db DB, name string, cfg Config, xmin uint64, held []Reader) (Partition, error) {
	part := Partition{Name: name}
	tx, err := db.Begin(ctx)
	if err != nil {
		return part, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('transaction_read_only', 'on', true)`,
		millis(max(cfg.StatementTimeout, time.Minute))); err != nil {
		return part, err
	}
	var undelivered int64
	if err := tx.QueryRow(ctx, rowsQuery(name), cfg.Retention.Seconds(), int64(xmin)).Scan(&part.Rows, &undelivered); err != nil {
		return part, fmt.Errorf("count the rows of partition %s: %w", name, err)
	}
	part.Gone, part.Kept = undelivered == 0, keptFor(undelivered, part.Rows, held)
	return part, nil
}

func keptFor(undelivered, rows int64, held []Reader) string {
	if undelivered == 0 {
		return ""
	}
	why := "their transactions are not covered by the checkpoint yet"
	if len(held) > 0 {
		var slots []string
		for _, r := range held {
			if r.Buffer {
				why += ", or this slot's WAL buffer holds their events (not delivered yet)"
				continue
			}
			slots = append(slots, strconv.Quote(r.Slot))
		}
		if len(slots) > 0 {
			why += ", or slot " + strings.Join(slots, ", ") + " has not passed them"
		}
	}
	return fmt.Sprintf("%d of its %d rows are not known to be delivered (%s)", undelivered, rows, why)
}

// removePartition drops or detaches one due partition if every row in it is
// delivered, in one transaction:
//
//  1. LOCK the partition IN SHARE MODE: it waits for the transactions
//     writing to it and keeps new ones out, so the rows counted next are
//     all it will ever hold (an insert still in progress when the rows
//     were counted without the lock would be dropped with it);
//  2. count its rows that may not be deleted; keep it if there is one;
//  3. DROP TABLE, or ALTER TABLE … DETACH PARTITION: ACCESS EXCLUSIVE on
//     the outbox table and its default partition, for the catalog change only.
//
// Each lock waits at most PartitionLockTimeout; a partition not locked in
// time is kept for the next round. DETACH … CONCURRENTLY is not used:
// Postgres refuses it when a default partition exists, and it cannot run
// inside the transaction that checked the rows.
func removePartition(ctx context.Context, db DB, t sql.Table, name string, cfg Config, xmin uint64, held []Reader) (Partition, error) {
	part := Partition{Name: name}
	tx, err := db.Begin(ctx)
	if err != nil {
		return part, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`,
		millis(PartitionLockTimeout), millis(max(cfg.StatementTimeout, time.Minute))); err != nil {
		return part, err
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE ONLY `+name+` IN SHARE MODE`); err != nil {
		return partitionErr(part, t, cfg.Partitions, "lock partition", err)
	}
	// Detached or attached elsewhere since it was listed: not ours to drop.
	var ours bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_inherits WHERE inhrelid = $1::regclass AND inhparent = $2::regclass)`,
		name, t.Quoted()).Scan(&ours); err != nil {
		return part, fmt.Errorf("check partition %s: %w", name, err)
	}
	if !ours {
		part.Kept = "it is no longer a partition of the outbox"
		return part, nil
	}
	var undelivered int64
	if err := tx.QueryRow(ctx, rowsQuery(name), cfg.Retention.Seconds(), int64(xmin)).Scan(&part.Rows, &undelivered); err != nil {
		return part, fmt.Errorf("count the rows of partition %s: %w", name, err)
	}
	if part.Kept = keptFor(undelivered, part.Rows, held); part.Kept != "" {
		return part, nil
	}
	stmt := `DROP TABLE ` + name
	if cfg.Partitions == PartitionsDetach {
		stmt = `ALTER TABLE ` + t.Quoted() + ` DETACH PARTITION ` + name
	}
	if _, err := tx.Exec(ctx, stmt); err != nil {
		return partitionErr(part, t, cfg.Partitions, string(cfg.Partitions)+" partition", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return partitionErr(part, t, cfg.Partitions, "commit "+string(cfg.Partitions), err)
	}
	part.Gone = true
	return part, nil
}

// partitionErr turns a lock timeout into a kept partition, and a missing
// privilege into an error that says what the role needs.
func partitionErr(part Partition, t sql.Table, mode PartitionMode, op string, err error) (Partition, error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "55P03": // lock_not_available: lock_timeout
			part.Kept = fmt.Sprintf("its lock was not obtained within %s (transactions are using the outbox): tried again next round", PartitionLockTimeout)
			return part, nil
		case "42501": // insufficient_privilege
			return part, fmt.Errorf("%s %s: %w: to %s partitions the relay's role must own them%s "+
				"(ALTER TABLE … OWNER TO <relay role>, or GRANT <owning role> TO <relay role>), or set outbox.retention_partitions to delete",
				op, part.Name, err, mode, map[bool]string{true: " and the outbox table " + t.Quoted(), false: ""}[mode == PartitionsDetach])
		}
	}
	return part, fmt.Errorf("%s %s: %w", op, part.Name, err)
}

func millis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
