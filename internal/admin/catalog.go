package admin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Catalog lookups shared by Setup and Check.

// tableOID returns the table's oid, or 0 if it does not exist. An unqualified
// name is looked up on the search_path, as the server would. It works
// without USAGE on the table's schema (where to_regclass fails or finds
// nothing), so that check can name that grant instead of calling the table
// missing.
func tableOID(ctx context.Context, conn *pgx.Conn, t sql.Table) (uint32, error) {
	oid, _, err := locateTable(ctx, conn, t)
	return oid, err
}

// locateTable returns the table's oid and schema, or 0 and "" if it does not
// exist, from the catalog, which every role may read.
func locateTable(ctx context.Context, conn *pgx.Conn, t sql.Table) (uint32, string, error) {
	var oid *uint32
	var schema *string
	var err error
	if t.Schema != "" {
		err = conn.QueryRow(ctx, `SELECT c.oid, n.nspname FROM pg_catalog.pg_namespace n
JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = $2
WHERE n.nspname = $1`, t.Schema, t.Name).Scan(&oid, &schema)
	} else {
		// to_regclass resolves as the server does, but skips the schemas
		// the role may not use: then the search_path itself is read.
		err = conn.QueryRow(ctx, `SELECT c.oid, n.nspname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)
UNION ALL
SELECT * FROM (
    SELECT c.oid, n.nspname
    FROM unnest(string_to_array(current_setting('search_path'), ',')) WITH ORDINALITY AS p(raw, ord)
    CROSS JOIN LATERAL (SELECT btrim(p.raw) AS s) e
    JOIN pg_catalog.pg_namespace n ON n.nspname = CASE
        WHEN e.s IN ('$user', '"$user"') THEN current_user::text
        WHEN e.s LIKE '"%"' THEN replace(substr(e.s, 2, length(e.s) - 2), '""', '"')
        ELSE lower(e.s) END
    JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = $2
    ORDER BY p.ord LIMIT 1) s
LIMIT 1`, t.Quoted(), t.Name).Scan(&oid, &schema)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, "", nil
	}
	if err != nil {
		return 0, "", fmt.Errorf("look up table %s: %w", t, err)
	}
	if oid == nil || schema == nil {
		return 0, "", nil
	}
	return *oid, *schema, nil
}

// serialSequence returns the sequence owned by the column of the table (a
// serial's), or "" and 0: read from pg_depend, which needs no privilege.
func serialSequence(ctx context.Context, conn *pgx.Conn, table uint32, column string) (string, uint32, error) {
	var name string
	var oid uint32
	err := conn.QueryRow(ctx, `SELECT s.relname, s.oid FROM pg_catalog.pg_depend d
JOIN pg_catalog.pg_class s ON s.oid = d.objid AND s.relkind = 'S'
JOIN pg_catalog.pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
WHERE d.classid = 'pg_catalog.pg_class'::regclass AND d.refclassid = 'pg_catalog.pg_class'::regclass
  AND d.refobjid = $1 AND a.attname = $2 AND d.deptype IN ('a', 'i')
LIMIT 1`, table, column).Scan(&name, &oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("look up the sequence of %s: %w", column, err)
	}
	return name, oid, nil
}

type publicationInfo struct {
	Exists    bool
	AllTables bool
	Insert    bool
	ViaRoot   bool     // publish_via_partition_root
	Covers    bool     // publishes the outbox table (or, without ViaRoot, its partitions)
	Tables    []string // schema.table of every table it publishes
	// Partitioned: the outbox table is partitioned. Without ViaRoot its
	// partitions' inserts arrive under their own names.
	Partitioned bool
}

// PartitionsByName reports a publication that sends a partitioned outbox's
// inserts under the partitions' names.
func (p publicationInfo) PartitionsByName() bool { return p.Exists && p.Partitioned && !p.ViaRoot }

func publication(ctx context.Context, conn *pgx.Conn, name string, outboxOID uint32) (publicationInfo, error) {
	var p publicationInfo
	if outboxOID != 0 {
		if err := conn.QueryRow(ctx, `SELECT relkind = 'p' FROM pg_catalog.pg_class WHERE oid = $1`, outboxOID).Scan(&p.Partitioned); err != nil {
			return p, fmt.Errorf("look up outbox table: %w", err)
		}
	}
	err := conn.QueryRow(ctx, `SELECT puballtables, pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1`, name).
		Scan(&p.AllTables, &p.Insert, &p.ViaRoot)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, nil
	}
	if err != nil {
		return p, fmt.Errorf("look up publication %q: %w", name, err)
	}
	p.Exists = true
	// Without publish_via_partition_root the view lists a partitioned
	// table's leaf partitions instead of the table: they cover it too.
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(pt.schemaname || '.' || pt.tablename ORDER BY 1), '{}'),
       coalesce(bool_or(c.oid = $2 OR c.oid IN (SELECT t.relid FROM pg_catalog.pg_partition_tree(nullif($2, 0)::oid::regclass) t)), false)
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = $1`, name, outboxOID).Scan(&p.Tables, &p.Covers)
	if err != nil {
		return p, fmt.Errorf("look up tables of publication %q: %w", name, err)
	}
	return p, nil
}

// readSlot returns the slot, or Exists false when there is none.
func readSlot(ctx context.Context, conn *pgx.Conn, name string) (slotInfo, error) {
	s, err := pgslot.Read(ctx, conn, name)
	if errors.Is(err, pgslot.ErrNotFound) {
		return slotInfo{}, nil
	}
	return slotInfo{Slot: s, Exists: err == nil}, err
}

type slotInfo struct {
	pgslot.Slot
	Exists bool
}

// problem describes what is wrong with an existing slot for this relay, or "".
func (s slotInfo) problem(name string) string {
	var u *pgslot.UnusableError
	switch {
	case errors.As(s.Usable(), &u) && u.Err == pgslot.ErrDatabase:
		return u.Reason + "; set postgres.slot to another name"
	case u != nil:
		return fmt.Sprintf("%s; drop it (SELECT pg_drop_replication_slot(%s)) and run setup, or set postgres.slot to another name",
			u.Reason, sql.Literal(name))
	case s.Lost():
		return fmt.Sprintf("has lost WAL it needed (wal_status lost, max_slot_wal_keep_size exceeded) and cannot stream; drop it (SELECT pg_drop_replication_slot(%s)) and run setup, then re-insert the events since its last confirmed position",
			sql.Literal(name))
	}
	return ""
}

func publicationTables(p publicationInfo) string {
	if p.AllTables {
		return "all tables"
	}
	if len(p.Tables) == 0 {
		return "no tables"
	}
	return strings.Join(p.Tables, ", ")
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// peekTimeout bounds the trial decoding of publicationAtSlot.
const peekTimeout = 10 * time.Second

// publicationAtSlot returns what stops the slot from decoding with the
// publication from its confirmed position, or "". The walsender decodes with
// the catalog as it was at each change: for a change made before the
// publication existed (dropped and recreated, or created after the slot),
// pgoutput fails with "publication ... does not exist", and since the slot
// cannot move past that change, every restart fails the same way.
//
// A publication whose row is younger than the slot's catalog_xmin
// (age(xmin) < age(catalog_xmin)) was created or altered after the slot's
// position; only then, and only while no relay holds the slot, the slot is
// asked for real: its changes up to now are decoded with
// pg_logical_slot_peek_binary_changes, which confirms nothing and so changes
// nothing, within peekTimeout.
func publicationAtSlot(ctx context.Context, conn *pgx.Conn, pub string, s slotInfo) (string, error) {
	slotName := s.Name
	if !s.Exists || s.Active || s.Usable() != nil || s.CatalogXmin == nil {
		return "", nil // missing or unusable pieces are reported on their own
	}
	var younger bool
	err := conn.QueryRow(ctx, `SELECT coalesce(age(xmin) < age($2::xid), false) FROM pg_publication WHERE pubname = $1`,
		pub, *s.CatalogXmin).Scan(&younger)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !younger) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("compare publication %q with slot %q: %w", pub, slotName, err)
	}
	confirmed := s.ConfirmedFlushLSN
	peekErr := peekSlot(ctx, conn, pub, slotName)
	var current string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&current); err != nil {
		return "", fmt.Errorf("read pg_current_wal_lsn(): %w", err)
	}
	fix := fmt.Sprintf("start the relay past that point with `outbox-relay run --start-lsn %s --force` "+
		"(%s is the current WAL position; events committed in between are skipped: re-insert or replay them), "+
		"or drop the slot (SELECT pg_drop_replication_slot(%s)) and run `outbox-relay setup` to create it again after the publication",
		current, current, sql.Literal(slotName))
	var pgErr *pgconn.PgError
	switch {
	case peekErr == nil:
		return "", nil // it decodes: the publication was only altered, or nothing was written in between
	case errors.As(peekErr, &pgErr) && replication.SkippedPublication((*pgconn.Notice)(pgErr)):
		at := atLSN(pgErr)
		return fmt.Sprintf("publication %s was created after the position of slot %s (confirmed up to %s): "+
			"the slot cannot decode past that point with this publication (the server decodes with the catalog as it was then, "+
			"leaves out what was written before the publication existed and warns \"skipped loading publication\"%s; `run` stops there on every start); %s",
			pub, slotName, deref(confirmed), at, fix), nil
	case errors.As(peekErr, &pgErr) && pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication"):
		at := atLSN(pgErr)
		return fmt.Sprintf("publication %s was created after the position of slot %s (confirmed up to %s): "+
			"the slot cannot decode past that point with this publication (the server decodes with the catalog as it was then "+
			"and reports \"publication does not exist\"%s, so `run` fails on every start); %s",
			pub, slotName, deref(confirmed), at, fix), nil
	case errors.As(peekErr, &pgErr) && (pgErr.Code == "55006" || pgErr.Code == "55000"):
		return "", nil // a relay took the slot meanwhile, or the slot is lost (reported with the slot)
	case errors.Is(peekErr, pgslot.ErrPeekTimeout):
		return fmt.Sprintf("publication %s was created or altered after the position of slot %s (confirmed up to %s), "+
			"and a trial decoding did not finish within %s: if `run` fails with \"publication does not exist at the slot's position\", %s",
			pub, slotName, deref(confirmed), peekTimeout, fix), nil
	}
	return "", fmt.Errorf("trial decoding of slot %q: %w", slotName, peekErr)
}

// peekSlot decodes the slot's changes up to now as the relay would (pgoutput, proto_version 1, the publication name as the relay passes
// it), without confirming anything. Postgres 18 does not fail on a change written while the publication did not exist: it warns
// ("skipped loading publication") and leaves the change out, as it would for the relay. The warning comes as a notice, so the
// trial decoding runs on a connection of its own that collects it, and returns it as the error.
func peekSlot(ctx context.Context, admin *pgx.Conn, pub, slotName string) error {
	cfg := admin.Config().Copy()
	var skipped *pgconn.Notice
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if skipped == nil && replication.SkippedPublication(n) {
			skipped = n
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := pgslot.Peek(ctx, conn, slotName, pub, peekTimeout); err != nil {
		return err
	}
	if skipped != nil {
		return (*pgconn.PgError)(skipped)
	}
	return nil
}

// atLSN is " at <LSN>" from a decoding error's context ("... associated LSN
// 0/1A2B3C"), or "".
func atLSN(e *pgconn.PgError) string {
	if _, lsn, ok := strings.Cut(e.Where, "associated LSN "); ok {
		return " at " + strings.TrimSpace(lsn)
	}
	return ""
}
