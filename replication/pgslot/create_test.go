package pgslot_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TestCreate: Create makes a pgoutput slot and returns the server's error
// for one that exists; CreateTemporary's slot lives with its session;
// CreateExporting's comes with a snapshot and a consistent point.
func TestCreate(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(ctx, t, pg.DSN)

	slot := testenv.UniqueName(t, "slot")
	if err := pgslot.Create(ctx, conn, slot, false); err != nil {
		t.Fatalf("Create(%s) = %v", slot, err)
	}
	if s, err := pgslot.Read(ctx, conn, slot); err != nil || s.Type != "logical" || s.Plugin != "pgoutput" {
		t.Errorf("Read(%s) after Create = %+v, %v; want a logical pgoutput slot", slot, s, err)
	}
	var pgErr *pgconn.PgError
	if err := pgslot.Create(ctx, conn, slot, false); !errors.As(err, &pgErr) || pgErr.Code != "42710" {
		t.Errorf("Create(%s) again = %v; want the server's duplicate_object (42710)", slot, err)
	}

	tmp := testenv.UniqueName(t, "tmp")
	if err := pgslot.CreateTemporary(ctx, conn, tmp); err != nil {
		t.Fatalf("CreateTemporary(%s) = %v", tmp, err)
	}
	var temporary bool
	if err := conn.QueryRow(ctx, `SELECT temporary FROM pg_replication_slots WHERE slot_name = $1`, tmp).Scan(&temporary); err != nil || !temporary {
		t.Errorf("slot %s: temporary = %v, %v; want true", tmp, temporary, err)
	}

	exp := testenv.UniqueName(t, "exp")
	repl := replicationConn(ctx, t, pg.DSN)
	defer repl.Close(context.Background())
	created, err := pgslot.CreateExporting(ctx, repl, exp)
	if err != nil {
		t.Fatalf("CreateExporting(%s) = %v", exp, err)
	}
	if _, perr := pglogrepl.ParseLSN(created.ConsistentPoint); created.SlotName != exp || created.SnapshotName == "" || created.OutputPlugin != "pgoutput" || perr != nil {
		t.Errorf("CreateExporting(%s) = %+v; want the slot, pgoutput, a snapshot and a consistent point", exp, created)
	}
}
