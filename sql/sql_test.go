package sql_test

import (
	"context"
	"io/fs"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/sql"
)

func TestParseTable(t *testing.T) {
	tests := []struct {
		in, quoted string
		wantErr    bool
	}{
		{"outbox", `"outbox"`, false},
		{"public.outbox", `"public"."outbox"`, false},
		{"App.Outbox", `"App"."Outbox"`, false},
		{`we"ird.ta ble`, `"we""ird"."ta ble"`, false},
		{"", "", true},
		{"a.b.c", "", true},
		{".outbox", "", true},
		{"public.", "", true},
	}
	for _, tt := range tests {
		got, err := sql.ParseTable(tt.in)
		if (err != nil) != tt.wantErr {
			t.Errorf("ParseTable(%q) error = %v; want error %v", tt.in, err, tt.wantErr)
			continue
		}
		if err == nil && got.Quoted() != tt.quoted {
			t.Errorf("ParseTable(%q).Quoted() = %q; want %q", tt.in, got.Quoted(), tt.quoted)
		}
		if err == nil && got.String() != tt.in {
			t.Errorf("ParseTable(%q).String() = %q; want %q", tt.in, got.String(), tt.in)
		}
	}
}

func TestValidSlotName(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{"outbox_relay", true},
		{"relay2", true},
		{"", false},
		{"Outbox", false},
		{"out-box", false},
		{strings.Repeat("a", 64), false},
	}
	for _, tt := range tests {
		if err := sql.ValidSlotName(tt.in); (err == nil) != tt.ok {
			t.Errorf("ValidSlotName(%q) = %v; want ok %v", tt.in, err, tt.ok)
		}
	}
}

func TestLiteral(t *testing.T) {
	if got, want := sql.Literal(`it's`), `'it''s'`; got != want {
		t.Errorf("Literal(%q) = %q; want %q", `it's`, got, want)
	}
}

// TestFilesMatchGo runs the embedded files in one database and the Go-built
// statements with default names in another, and compares what they created.
func TestFilesMatchGo(t *testing.T) {
	ctx := context.Background()
	fromFiles := connect(t, newDatabase(t))
	fromGo := connect(t, newDatabase(t))

	all, err := fs.Glob(sql.Files, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	// The files this test covers; later files (004_retry.sql) have their own.
	names := []string{"001_outbox.sql", "002_relay.sql", "003_slot.sql"}
	for _, n := range names {
		if !slices.Contains(all, n) {
			t.Fatalf("embedded files = %q; want them to include %q", all, n)
		}
	}
	// Twice: the files must be idempotent.
	for range 2 {
		for _, name := range names {
			b, err := sql.Files.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			// One simple-protocol call per file, as psql -f would run it.
			if _, err := fromFiles.PgConn().Exec(ctx, string(b)).ReadAll(); err != nil {
				t.Fatalf("run %s: %v", name, err)
			}
		}
	}

	outbox, _ := sql.ParseTable(sql.DefaultOutboxTable)
	checkpoint, _ := sql.ParseTable(sql.DefaultCheckpointTable)
	stmts := sql.OutboxTable(outbox, sql.Columns{}, sql.LayoutRelay)
	stmts = append(stmts, sql.CheckpointTable(checkpoint))
	stmts = append(stmts, sql.CheckpointHistoryTable(checkpoint)...)
	stmts = append(stmts, sql.CreatePublication(sql.DefaultPublication, outbox))
	for _, s := range stmts {
		if _, err := fromGo.Exec(ctx, s); err != nil {
			t.Fatalf("exec %q: %v", s, err)
		}
	}

	a, b := catalog(t, fromFiles), catalog(t, fromGo)
	if len(a) == 0 {
		t.Fatal("the files created nothing")
	}
	if !slices.Equal(a, b) {
		t.Errorf("catalog after files:\n%s\nafter Go statements:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	for _, want := range []string{
		`column public.outbox.id uuid not_null=t default=`,
		`column public.outbox.payload jsonb not_null=f default=`,
		`column public.outbox_relay_checkpoint.lsn pg_lsn not_null=t default=`,
		`column public.outbox_relay_checkpoint_history.snapshot_xmin xid8 not_null=t default=`,
		`index CREATE INDEX outbox_relay_checkpoint_history_snapshot_lsn_idx ON public.outbox_relay_checkpoint_history USING btree (slot_name, snapshot_lsn)`,
		`index CREATE UNIQUE INDEX outbox_relay_checkpoint_history_pkey ON public.outbox_relay_checkpoint_history USING btree (slot_name, lsn)`,
		`index CREATE INDEX outbox_created_at_idx ON public.outbox USING btree (created_at)`,
		`publication outbox_relay insert=t update=f delete=f truncate=f all=f tables=public.outbox`,
	} {
		if !slices.Contains(a, want) {
			t.Errorf("catalog after files lacks %q; has:\n%s", want, strings.Join(a, "\n"))
		}
	}

	// Slot names are global to the server, so the two slots cannot coexist:
	// check and drop the file's before creating Go's.
	const wantSlot = "outbox_relay pgoutput logical"
	if got := slot(t, fromFiles); got != wantSlot {
		t.Errorf("slot after files = %q; want %q", got, wantSlot)
	}
	if _, err := fromFiles.Exec(ctx, `SELECT pg_drop_replication_slot('outbox_relay')`); err != nil {
		t.Fatalf("drop slot: %v", err)
	}
	if _, err := fromGo.Exec(ctx, sql.CreateSlot(sql.DefaultSlot)); err != nil {
		t.Fatalf("create slot: %v", err)
	}
	if got := slot(t, fromGo); got != wantSlot {
		t.Errorf("slot after Go = %q; want %q", got, wantSlot)
	}
}

// slot describes the replication slots of the current database.
func slot(t *testing.T, conn *pgx.Conn) string {
	t.Helper()
	var s string
	err := conn.QueryRow(context.Background(), `SELECT coalesce(string_agg(format('%s %s %s', slot_name, plugin, slot_type), ','), '')
FROM pg_replication_slots WHERE database = current_database()`).Scan(&s)
	if err != nil {
		t.Fatalf("read slots: %v", err)
	}
	return s
}

// TestConfiguredNames creates everything under awkward names: quoting must hold.
func TestConfiguredNames(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, newDatabase(t))
	if _, err := conn.Exec(ctx, `CREATE SCHEMA "My App"`); err != nil {
		t.Fatal(err)
	}
	outbox, err := sql.ParseTable(`My App.Out"box`)
	if err != nil {
		t.Fatal(err)
	}
	checkpoint, _ := sql.ParseTable(`My App.relay checkpoint`)
	stmts := sql.OutboxTable(outbox, sql.Columns{ID: "event_id", Payload: "Body"}, sql.LayoutRelay)
	stmts = append(stmts, sql.CheckpointTable(checkpoint), sql.CreatePublication("My Pub", outbox))
	for range 2 {
		for _, s := range stmts[:3] {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}
	if _, err := conn.Exec(ctx, stmts[3]); err != nil {
		t.Fatalf("exec %q: %v", stmts[3], err)
	}
	got := catalog(t, conn)
	for _, want := range []string{
		`column My App.Out"box.event_id uuid not_null=t default=`,
		`column My App.Out"box.Body jsonb not_null=f default=`,
		`column My App.relay checkpoint.slot_name text not_null=t default=`,
		`publication My Pub insert=t update=f delete=f truncate=f all=f tables=My App.Out"box`,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("catalog lacks %q; has:\n%s", want, strings.Join(got, "\n"))
		}
	}
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// catalog describes the user objects of the current database as sorted lines.
func catalog(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	const q = `
SELECT format('column %s.%s.%s %s not_null=%s default=%s', n.nspname, c.relname, a.attname,
       format_type(a.atttypid, a.atttypmod), a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), ''))
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
UNION ALL
SELECT 'index ' || pg_get_indexdef(i.indexrelid)
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'
UNION ALL
SELECT format('publication %s insert=%s update=%s delete=%s truncate=%s all=%s tables=%s',
       p.pubname, p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.puballtables,
       (SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY 1) FROM pg_publication_tables pt WHERE pt.pubname = p.pubname))
FROM pg_publication p
ORDER BY 1`
	rows, err := conn.Query(context.Background(), q)
	if err != nil {
		t.Fatalf("read catalog: %v", err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read catalog: %v", err)
	}
	return lines
}
