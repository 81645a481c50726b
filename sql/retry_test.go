package sql_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestRetryFileMatchesGo runs 004_retry.sql in one database and RetryTable
// with the default name in another, each twice (both must be idempotent), and
// compares what they created.
func TestRetryFileMatchesGo(t *testing.T) {
	ctx := context.Background()
	fromFile := connect(t, newDatabase(t))
	fromGo := connect(t, newDatabase(t))

	b, err := sql.Files.ReadFile("004_retry.sql")
	if err != nil {
		t.Fatal(err)
	}
	table, err := sql.ParseTable(sql.DefaultRetryTable)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := fromFile.PgConn().Exec(ctx, string(b)).ReadAll(); err != nil {
			t.Fatalf("run 004_retry.sql: %v", err)
		}
		// The file also creates the WAL buffer beside the retry table.
		for _, s := range append(sql.RetryTable(table), sql.WALBufferTableDDL(sql.WALBufferTable(table))...) {
			if _, err := fromGo.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}

	a, g := retryCatalog(t, fromFile), retryCatalog(t, fromGo)
	if !slices.Equal(a, g) {
		t.Errorf("catalog after file:\n%s\nafter Go statements:\n%s", strings.Join(a, "\n"), strings.Join(g, "\n"))
	}
	for _, want := range []string{
		`column public.outbox_relay_retry.seq bigint not_null=t default=nextval('outbox_relay_retry_seq_seq'::regclass)`,
		`column public.outbox_relay_retry.event_key text not_null=t default=`,
		`column public.outbox_relay_retry.aggregate text not_null=t default=`,
		`column public.outbox_relay_retry.headers jsonb not_null=f default=`,
		`column public.outbox_relay_retry.source_lsn pg_lsn not_null=f default=`,
		`column public.outbox_relay_retry.next_attempt_at timestamp with time zone not_null=t default=`,
		`column public.outbox_relay_retry.attempts integer not_null=t default=0`,
		`column public.outbox_relay_retry.slot_name text not_null=f default=`,
		`index CREATE UNIQUE INDEX outbox_relay_retry_slot_event_key_idx ON public.outbox_relay_retry USING btree (slot_name, event_key)`,
		`index CREATE INDEX outbox_relay_retry_slot_status_next_attempt_idx ON public.outbox_relay_retry USING btree (slot_name, status, next_attempt_at)`,
		`column public.outbox_relay_retry.last_resort bytea not_null=f default=`,
		`index CREATE INDEX outbox_relay_retry_slot_aggregate_md5_seq_idx ON public.outbox_relay_retry USING btree (slot_name, md5(aggregate), seq)`,
		`check outbox_relay_retry CHECK ((status = ANY (ARRAY['pending'::text, 'dead'::text])))`,
	} {
		if !slices.Contains(a, want) {
			t.Errorf("catalog after file lacks %q; has:\n%s", want, strings.Join(a, "\n"))
		}
	}
}

// oldRetryTable is the retry table as the previous version created it: an
// index on the aggregate's text, no last_resort column.
const oldRetryTable = `CREATE TABLE %[1]s (
    ` + testenv.OldRetryColumns + `
);
CREATE INDEX %[2]s ON %[1]s ("status", "next_attempt_at");
CREATE INDEX %[3]s ON %[1]s ("aggregate", "seq");
INSERT INTO %[1]s (event_key, aggregate, status, next_attempt_at) VALUES ('old', 'orders/A', 'dead', now());`

// TestRetryUpgradesOldTable runs 004_retry.sql on a table of the previous
// version in one database and RetryTable (under a schema-qualified name) in
// another, each twice: both must replace the index on the aggregate's text
// by the one on its md5, add last_resort, keep the rows, and end up with
// the catalog of a fresh table.
func TestRetryUpgradesOldTable(t *testing.T) {
	ctx := context.Background()
	fromFile, fromGo, fresh := connect(t, newDatabase(t)), connect(t, newDatabase(t)), connect(t, newDatabase(t))
	def, _ := sql.ParseTable(sql.DefaultRetryTable)
	qualified, _ := sql.ParseTable("app." + sql.DefaultRetryTable)
	for _, c := range []*pgx.Conn{fromGo, fresh} {
		if _, err := c.Exec(ctx, `CREATE SCHEMA app`); err != nil {
			t.Fatal(err)
		}
	}
	old := func(conn *pgx.Conn, tb sql.Table) {
		t.Helper()
		q := fmt.Sprintf(oldRetryTable, tb.Quoted(), sql.Ident(tb.Name+"_status_next_attempt_at_idx"), sql.Ident(tb.Name+"_aggregate_seq_idx"))
		if _, err := conn.PgConn().Exec(ctx, q).ReadAll(); err != nil {
			t.Fatalf("create old table: %v", err)
		}
	}
	old(fromFile, def)
	old(fromGo, qualified)
	b, err := sql.Files.ReadFile("004_retry.sql")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := fromFile.PgConn().Exec(ctx, string(b)).ReadAll(); err != nil {
			t.Fatalf("run 004_retry.sql: %v", err)
		}
		for _, s := range sql.RetryTable(qualified) {
			if _, err := fromGo.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}
	for _, s := range sql.RetryTable(qualified) {
		if _, err := fresh.Exec(ctx, s); err != nil {
			t.Fatalf("exec %q: %v", s, err)
		}
	}
	got, want := retryCatalog(t, fromGo), retryCatalog(t, fresh)
	if !slices.Equal(got, want) {
		t.Errorf("catalog after upgrade:\n%s\nof a fresh table:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	fileCat := retryCatalog(t, fromFile)
	for _, line := range fileCat {
		if strings.Contains(line, "aggregate_seq_idx") {
			t.Errorf("after 004_retry.sql on an old table the old index is left: %s", line)
		}
	}
	for _, line := range fileCat {
		if strings.Contains(line, "event_key_key") || strings.Contains(line, "_status_next_attempt_at_idx") || strings.Contains(line, "retry_aggregate_md5_seq_idx") {
			t.Errorf("after 004_retry.sql on an old table an index of an earlier version is left: %s", line)
		}
	}
	if !slices.Contains(fileCat, `index CREATE INDEX outbox_relay_retry_slot_aggregate_md5_seq_idx ON public.outbox_relay_retry USING btree (slot_name, md5(aggregate), seq)`) ||
		!slices.Contains(fileCat, `index CREATE UNIQUE INDEX outbox_relay_retry_slot_event_key_idx ON public.outbox_relay_retry USING btree (slot_name, event_key)`) ||
		!slices.Contains(fileCat, `column public.outbox_relay_retry.slot_name text not_null=f default=`) ||
		!slices.Contains(fileCat, `column public.outbox_relay_retry.last_resort bytea not_null=f default=`) {
		t.Errorf("004_retry.sql did not upgrade the old table:\n%s", strings.Join(fileCat, "\n"))
	}
	for _, c := range []struct {
		conn *pgx.Conn
		tb   sql.Table
	}{{fromFile, def}, {fromGo, qualified}} {
		var n int
		if err := c.conn.QueryRow(ctx, `SELECT count(*) FROM `+c.tb.Quoted()+` WHERE event_key = 'old'`).Scan(&n); err != nil || n != 1 {
			t.Errorf("old row in %s after upgrade: %d, %v; want kept", c.tb, n, err)
		}
	}
}

// TestRetryTableConfiguredName creates the table under an awkward, long,
// schema-qualified name: quoting and index-name truncation must hold, and a
// second run must be a no-op.
func TestRetryTableConfiguredName(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, newDatabase(t))
	if _, err := conn.Exec(ctx, `CREATE SCHEMA "My App"`); err != nil {
		t.Fatal(err)
	}
	name := `My App.Re"try ` + strings.Repeat("x", 50)
	table, err := sql.ParseTable(name)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		for _, s := range sql.RetryTable(table) {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}
	got := retryCatalog(t, conn)
	indexes := 0
	for _, line := range got {
		if strings.HasPrefix(line, "index ") {
			indexes++
		}
	}
	// primary key and the three of RetryTable: a third run
	// would add more if truncation made the names differ between runs.
	if indexes != 4 {
		t.Errorf("RetryTable(%q) created %d indexes; want 4:\n%s", name, indexes, strings.Join(got, "\n"))
	}
	want := `column ` + table.Schema + `.` + table.Name + `.event_key text not_null=t default=`
	if !slices.Contains(got, want) {
		t.Errorf("catalog lacks %q; has:\n%s", want, strings.Join(got, "\n"))
	}
}

// retryCatalog is catalog plus the check constraints, which the retry table
// relies on to keep status to its two values.
func retryCatalog(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	lines := catalog(t, conn)
	rows, err := conn.Query(context.Background(), `
SELECT format('check %s %s', c.relname, pg_get_constraintdef(k.oid))
FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
WHERE k.contype = 'c' ORDER BY 1`)
	if err != nil {
		t.Fatalf("read constraints: %v", err)
	}
	checks, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read constraints: %v", err)
	}
	return append(lines, checks...)
}
