// Package pgslot reads a replication slot's row of pg_replication_slots, with
// the walsender holding it, in one statement that works on an ordinary
// connection and on a replication (walsender) connection alike.
//
// Read is the relay's one reader of pg_replication_slots: the stream's start
// checks, setup and check, lag and status, and the metrics sampler all see the
// same fields and the same error for a missing slot. Create,
// CreateTemporary and CreateExporting are its one place that creates a slot
// (create.go).
package pgslot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/outbox-relay/outbox-relay/sql"
)

// ErrNotFound is wrapped by Read's error when the slot does not exist.
var ErrNotFound = errors.New("replication slot not found")

type notFoundError struct{ slot string }

func (e *notFoundError) Error() string {
	return fmt.Sprintf("replication slot %q does not exist", e.slot)
}
func (e *notFoundError) Unwrap() error { return ErrNotFound }

// A Querier runs one query returning at most one row. *pgx.Conn,
// *pgxpool.Pool and pgx.Tx satisfy it; ReplicationConn adapts a
// replication connection. Read passes no parameters (a walsender takes none).
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Slot is a replication slot as the server sees it at one moment. Nullable
// columns are pointers: nil is SQL NULL (a physical slot has no plugin, a slot
// not yet used no confirmed_flush_lsn, a slot nobody holds no walsender).
type Slot struct {
	Name              string
	Type              string // logical or physical
	Plugin            string // "" for a physical slot
	Database          string // the slot's database; "" for a physical slot
	CurrentDatabase   string // the database Read ran in
	Active            bool
	ActivePID         *int32
	CatalogXmin       *string // xid, as text
	RestartLSN        *string
	ConfirmedFlushLSN *string
	WALStatus         *string // reserved, extended, unreserved, lost
	SafeWALSizeBytes  *int64  // nil when max_slot_wal_keep_size is unlimited

	// Positions relative to the server's current WAL position (the replay
	// position on a standby; "" and nil on a standby that has replayed
	// nothing yet), read in the same statement.
	CurrentWALLSN    string
	LagBytes         *int64 // current WAL position minus confirmed_flush_lsn
	RetainedWALBytes *int64 // current WAL position minus restart_lsn: WAL kept for the slot
	Now              time.Time

	Walsender *Walsender // nil when no walsender streams the slot

	// Missing says that no slot of this name exists (Read returned
	// ErrNotFound): only Name is set. Verify takes it as a gap when a
	// checkpoint exists.
	Missing bool
}

// Walsender is the backend streaming the slot (pg_stat_replication). Without
// pg_read_all_stats (or pg_monitor) the fields of another role's backend
// read as nil.
type Walsender struct {
	ApplicationName *string
	ClientAddr      *string
	BackendStart    *time.Time
	State           *string
}

// Lost reports whether the slot was invalidated (wal_status lost): it can
// never stream again.
func (s Slot) Lost() bool { return s.WALStatus != nil && *s.WALStatus == "lost" }

// Confirmed returns the slot's confirmed_flush_lsn, 0 when it has none.
func (s Slot) Confirmed() (pglogrepl.LSN, error) {
	if s.ConfirmedFlushLSN == nil {
		return 0, nil
	}
	lsn, err := pglogrepl.ParseLSN(*s.ConfirmedFlushLSN)
	if err != nil {
		return 0, fmt.Errorf("confirmed_flush_lsn of slot %q: %w", s.Name, err)
	}
	return lsn, nil
}

// currentWAL is the server's current WAL position: the replay position on a
// standby, where pg_current_wal_lsn() fails.
const currentWAL = `CASE WHEN pg_catalog.pg_is_in_recovery() THEN pg_catalog.pg_last_wal_replay_lsn()
                   ELSE pg_catalog.pg_current_wal_lsn() END`

// The slot, and through active_pid its walsender: the LEFT JOIN keeps the
// slot when nobody holds it. Values a walsender connection cannot decode in
// binary (pg_lsn, xid) are read as text.
const query = `SELECT s.slot_type, coalesce(s.plugin, ''), coalesce(s.database, ''), current_database(),
       s.active, s.active_pid, s.catalog_xmin::text, s.restart_lsn::text, s.confirmed_flush_lsn::text,
       s.wal_status, s.safe_wal_size, coalesce(w.cur::text, ''),
       pg_wal_lsn_diff(w.cur, s.confirmed_flush_lsn)::bigint,
       pg_wal_lsn_diff(w.cur, s.restart_lsn)::bigint,
       now(), r.pid IS NOT NULL, r.application_name, host(r.client_addr), r.backend_start, r.state
FROM pg_catalog.pg_replication_slots s
CROSS JOIN (SELECT ` + currentWAL + ` AS cur) w
LEFT JOIN pg_catalog.pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = `

// Read returns the slot called name. A slot that does not exist is an error
// wrapping ErrNotFound that says how to create it.
func Read(ctx context.Context, q Querier, name string) (Slot, error) {
	s := Slot{Name: name}
	var w Walsender
	var held bool
	err := q.QueryRow(ctx, query+sql.Literal(name)).Scan(&s.Type, &s.Plugin, &s.Database, &s.CurrentDatabase,
		&s.Active, &s.ActivePID, &s.CatalogXmin, &s.RestartLSN, &s.ConfirmedFlushLSN,
		&s.WALStatus, &s.SafeWALSizeBytes, &s.CurrentWALLSN, &s.LagBytes, &s.RetainedWALBytes,
		&s.Now, &held, &w.ApplicationName, &w.ClientAddr, &w.BackendStart, &w.State)
	if errors.Is(err, pgx.ErrNoRows) {
		return Slot{}, &notFoundError{slot: name}
	}
	if err != nil {
		return Slot{}, fmt.Errorf("read replication slot %q: %w", name, err)
	}
	if held {
		s.Walsender = &w
	}
	return s, nil
}

// ErrActive is Drop's error when a process streams the slot.
var ErrActive = errors.New("replication slot is active")

// Drop drops the slot called name unless a process streams it (ErrActive).
// A slot that does not exist, or went meanwhile, is no error: the caller
// wanted it gone.
func Drop(ctx context.Context, q Querier, name string) error {
	var one int
	err := q.QueryRow(ctx, `SELECT 1 FROM pg_catalog.pg_drop_replication_slot($1)`, name).Scan(&one)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "42704": // undefined_object: gone
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "55006": // object_in_use
		return fmt.Errorf("drop replication slot %q: %w (%s)", name, ErrActive, pgErr.Message)
	}
	return fmt.Errorf("drop replication slot %q: %w", name, err)
}

// ReplicationConn adapts a replication connection (replication=database) to a
// Querier. A walsender speaks only the simple query protocol: queries take
// no parameters, and values arrive in text form.
func ReplicationConn(conn *pgconn.PgConn) Querier { return walsender{conn} }

type walsender struct{ conn *pgconn.PgConn }

func (w walsender) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	if len(args) > 0 {
		return errRow{errors.New("pgslot: a walsender query takes no parameters")}
	}
	results, err := w.conn.Exec(ctx, query).ReadAll()
	if err != nil {
		return errRow{err}
	}
	if len(results) != 1 {
		return errRow{fmt.Errorf("pgslot: %d results; want 1", len(results))}
	}
	return textRow{results[0]}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// textRow scans the first row of a simple-protocol result with pgx's types.
type textRow struct{ res *pgconn.Result }

func (r textRow) Scan(dest ...any) error {
	if len(r.res.Rows) == 0 {
		return pgx.ErrNoRows
	}
	row, fields := r.res.Rows[0], r.res.FieldDescriptions
	typeMap := pgtype.NewMap() // not safe for concurrent use: one per row
	if len(dest) != len(row) || len(fields) != len(row) {
		return fmt.Errorf("pgslot: %d columns, %d destinations", len(row), len(dest))
	}
	for i, d := range dest {
		if err := typeMap.Scan(fields[i].DataTypeOID, fields[i].Format, row[i], d); err != nil {
			return fmt.Errorf("pgslot: column %s: %w", fields[i].Name, err)
		}
	}
	return nil
}
