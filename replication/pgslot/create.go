package pgslot

// Slot creation: every slot the relay creates, permanent, failover,
// temporary or exporting a snapshot, is created here (the statements are
// sql's), so that a slot's plugin and options are chosen in one place.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sql"
)

// An Execer runs a statement: *pgx.Conn, pgx.Tx and *pgxpool.Pool are.
type Execer interface {
	Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error)
}

// Create creates the logical replication slot called name with pgoutput;
// with failover a failover slot (Postgres 17+: see FailoverMinVersion),
// which standbys with sync_replication_slots keep a copy of. It must run
// outside a transaction that has written anything, and it waits for the
// transactions running at that moment to finish. The error is the server's.
func Create(ctx context.Context, db Execer, name string, failover bool) error {
	create := sql.CreateSlot(name)
	if failover {
		create = sql.CreateFailoverSlot(name)
	}
	_, err := db.Exec(ctx, create)
	return err
}

// CreateTemporary creates a temporary logical slot called name with
// pgoutput. It belongs to db's session: the session's end drops it, so a
// caller that may leave it behind must not use a pooled connection. The
// error is the server's.
func CreateTemporary(ctx context.Context, db Execer, name string) error {
	_, err := db.Exec(ctx, sql.CreateTemporarySlot(name))
	return err
}

// CreateExporting creates the logical slot called name with pgoutput on
// conn, a replication connection, and exports a snapshot of the moment the
// slot starts at (CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT). The snapshot
// can be imported (SET TRANSACTION SNAPSHOT) for as long as conn stays open
// and runs no other command. The error is the server's.
func CreateExporting(ctx context.Context, conn *pgconn.PgConn, name string) (pglogrepl.CreateReplicationSlotResult, error) {
	return pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "EXPORT_SNAPSHOT"})
}

// ImportSnapshot makes tx, a repeatable read transaction that has run
// nothing yet, read in snapshot, one CreateExporting exported, and returns
// the snapshot's xmin (a full xid: every transaction older than it had
// finished when the snapshot was taken) and the server's time.
func ImportSnapshot(ctx context.Context, tx pgx.Tx, snapshot string) (uint64, time.Time, error) {
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+sql.Literal(snapshot)); err != nil {
		return 0, time.Time{}, fmt.Errorf("import the slot's snapshot: %w", err)
	}
	var xminText string
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, now()`).Scan(&xminText, &at); err != nil {
		return 0, time.Time{}, err
	}
	xmin, err := strconv.ParseUint(xminText, 10, 64)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("snapshot xmin %q: %w", xminText, err)
	}
	return xmin, at, nil
}
