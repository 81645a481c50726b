package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// HoldSlot streams slot (pgoutput, publication pub) over a replication
// connection to dsn, as a relay holds its slot, and returns the func that
// closes the connection. application_name is appName unless it is empty.
// The slot is active once the server has started the walsender, which may
// be a moment after HoldSlot returns.
func HoldSlot(t testing.TB, dsn, slot, pub, appName string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	if appName != "" {
		cfg.RuntimeParams["application_name"] = appName
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("replication connect: %v", err)
	}
	if err := pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"},
	}); err != nil {
		conn.Close(ctx)
		t.Fatalf("start replication: %v", err)
	}
	return func() { conn.Close(context.Background()) }
}
