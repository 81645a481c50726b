package admin

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// testDB is a fresh database on the test server (testenv.Postgres) and a
// Config of the relay's defaults on it with a slot of its own: what the CLI
// builds from a configuration that names only postgres.dsn, since slot names
// are global to a server and other tests may run against it at once.
func testDB(t *testing.T) (*testenv.PG, Config) {
	t.Helper()
	pg := testenv.Postgres(t)
	return pg, defaultConfig(t, pg.DSN, testenv.UniqueName(t, "relay_admin"))
}

// defaultConfig is Config with every name at the relay's default (the
// defaults of the CLI's settings), the relay layout's columns and headers.
func defaultConfig(t *testing.T, dsn, slot string) Config {
	t.Helper()
	table := func(name string) sql.Table {
		tb, err := sql.ParseTable(name)
		if err != nil {
			t.Fatalf("ParseTable(%q): %v", name, err)
		}
		return tb
	}
	cols, err := sql.LayoutRelay.Columns()
	if err != nil {
		t.Fatalf("LayoutRelay.Columns(): %v", err)
	}
	return Config{
		DSN:             dsn,
		Slot:            slot,
		Publication:     sql.DefaultPublication,
		OutboxTable:     table(sql.DefaultOutboxTable),
		Layout:          sql.LayoutRelay,
		Columns:         cols,
		Router:          router.Config{Columns: cols, Headers: sql.LayoutRelay.Headers()},
		CheckpointTable: table(sql.DefaultCheckpointTable),
		RetryTable:      table(sql.DefaultRetryTable),
		RedactedDSN:     dsn,
	}
}

// queryString runs q in the database of dsn and returns its one value.
func queryString(t *testing.T, dsn, q string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var s string
	if err := conn.QueryRow(ctx, q, args...).Scan(&s); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	return s
}

// wantLines fails the test for each of want that out (what's output) lacks.
func wantLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s output lacks %q; got:\n%s", what, w, out)
		}
	}
}
