package pgslot_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_create_logical_replication_slot('pgslot_test', 'pgoutput')`); err != nil {
		t.Fatal(err)
	}

	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pc.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
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
