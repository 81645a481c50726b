package pgslot_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// TestRead reads the same slot over an ordinary and a replication connection
// and expects the same fields.
func TestRead(t *testing.T) {
	// The server first: testenv.Postgres waits while a fault test of another package
	// holds the servers, which must not count against the timeout.
	dsn := testenv.Postgres(t).DSN
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(ctx, t, dsn)
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('pgslot_test', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}

	repl := replicationConn(ctx, t, dsn)
	defer repl.Close(context.Background())

	for _, q := range []struct {
		name string
		q    pgslot.Querier
	}{{"conn", conn}, {"replication conn", pgslot.ReplicationConn(repl)}} {
		t.Run(q.name, func(t *testing.T) {
			s, err := pgslot.Read(ctx, q.q, "pgslot_test")
			if err != nil {
				t.Fatalf("Read(pgslot_test) = %v", err)
			}
			if s.Type != "logical" || s.Plugin != "pgoutput" || s.Database != s.CurrentDatabase || s.Active || s.Walsender != nil {
				t.Errorf("Read(pgslot_test) = %+v; want an inactive logical pgoutput slot of this database", s)
			}
			lsn, err := s.Confirmed()
			if err != nil || lsn == 0 {
				t.Errorf("Confirmed() = %s, %v; want a position", lsn, err)
			}
			if s.LagBytes == nil || *s.LagBytes < 0 || s.CurrentWALLSN == "" || s.Now.IsZero() || s.CatalogXmin == nil {
				t.Errorf("Read(pgslot_test) = %+v; want lag, current WAL, now and catalog_xmin", s)
			}
			_, err = pgslot.Read(ctx, q.q, "no_such_slot")
			if !errors.Is(err, pgslot.ErrNotFound) || err.Error() != `replication slot "no_such_slot" does not exist` {
				t.Errorf("Read(no_such_slot) = %v; want ErrNotFound saying to run setup", err)
			}
		})
	}
}

// TestDrop: Drop drops an idle slot, takes a missing one as dropped, and
// refuses with ErrActive while a walsender streams it.
func TestDrop(t *testing.T) {
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn := connect(ctx, t, pg.DSN)
	slot := testenv.UniqueName(t, "slot")
	pg.Exec(t, `CREATE TABLE t (id int)`)
	pg.Exec(t, `CREATE PUBLICATION p FOR TABLE t`)
	pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)

	repl := replicationConn(ctx, t, pg.DSN)
	if err := pglogrepl.StartReplication(ctx, repl, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'p'"}}); err != nil {
		t.Fatal(err)
	}
	if err := pgslot.Drop(ctx, conn, slot); !errors.Is(err, pgslot.ErrActive) {
		t.Errorf("Drop of a streamed slot = %v; want ErrActive", err)
	}
	repl.Close(context.Background())
	// The walsender exits after its connection: wait until the slot is idle.
	var err error
	for {
		err = pgslot.Drop(ctx, conn, slot)
		if !errors.Is(err, pgslot.ErrActive) || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("Drop of the idle slot = %v", err)
	}
	if _, err := pgslot.Read(ctx, conn, slot); !errors.Is(err, pgslot.ErrNotFound) {
		t.Errorf("Read after Drop = %v; want ErrNotFound", err)
	}
	if err := pgslot.Drop(ctx, conn, slot); err != nil {
		t.Errorf("Drop of a missing slot = %v; want nil (it is gone, as wanted)", err)
	}
}

// connect opens an ordinary connection to dsn, closed when the test ends.
func connect(ctx context.Context, t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// replicationConn opens a replication connection (replication=database) to
// dsn.
func replicationConn(ctx context.Context, t *testing.T, dsn string) *pgconn.PgConn {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	return repl
}
