package sql_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
		for _, s := range sql.RetryTable(table) {
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
		`index CREATE UNIQUE INDEX outbox_relay_retry_event_key_key ON public.outbox_relay_retry USING btree (event_key)`,
		`index CREATE INDEX outbox_relay_retry_status_next_attempt_at_idx ON public.outbox_relay_retry USING btree (status, next_attempt_at)`,
		`index CREATE INDEX outbox_relay_retry_aggregate_seq_idx ON public.outbox_relay_retry USING btree (aggregate, seq)`,
		`check outbox_relay_retry CHECK ((status = ANY (ARRAY['pending'::text, 'dead'::text])))`,
	} {
		if !slices.Contains(a, want) {
			t.Errorf("catalog after file lacks %q; has:\n%s", want, strings.Join(a, "\n"))
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
	// primary key, unique event_key, and the two of RetryTable: a third run
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
