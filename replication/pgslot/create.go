package pgslot

// Slot creation: every slot the relay creates, permanent, failover,
// temporary or exporting a snapshot, is created here (the statements are
// sql's), so that a slot's plugin and options are chosen in one place.

import (
	"context"

	"github.com/jackc/pglogrepl"
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
