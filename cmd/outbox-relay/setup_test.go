package main

import (
	"bytes"
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/sql"
)

// dbEnv points the relay's config at a fresh database and a unique slot.
// Kafka is never contacted by setup; the address only satisfies validation.
func dbEnv(t *testing.T) (dsn, slot string) {
	t.Helper()
	cleanEnv(t)
	dsn = newDatabase(t)
	slot = uniqueName(t, "relay_cmd")
	t.Setenv("RELAY_POSTGRES_DSN", dsn)
	t.Setenv("RELAY_POSTGRES_SLOT", slot)
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9")
	return dsn, slot
}

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = execute(args, &o, &e)
	return code, o.String(), e.String()
}

func execSQL(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("exec %q: %v", s, err)
		}
	}
}

func queryString(t *testing.T, dsn, q string, args ...any) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, q, args...).Scan(&s); err != nil {
		t.Fatalf("query %q: %v", q, err)
	}
	return s
}

func wantLines(t *testing.T, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s output lacks %q; got:\n%s", what, w, out)
		}
	}
}

// TestSetupProblemsExit: a setup that reports problems it cannot fix exits 1
// (what it prints and leaves behind: internal/admin's TestSetupMissingOutbox).
func TestSetupProblemsExit(t *testing.T) {
	dbEnv(t)
	if code, out, errOut := run(t, "setup"); code != exitcode.Failure {
		t.Errorf("setup without the outbox table: exit = %d; want %d\nstdout:\n%s\nstderr:\n%s", code, exitcode.Failure, out, errOut)
	}
}

func TestSetupConfiguredNames(t *testing.T) {
	dsn, slot := dbEnv(t)
	execSQL(t, dsn, `CREATE SCHEMA app`)
	t.Setenv("RELAY_OUTBOX_TABLE", "app.Events")
	t.Setenv("RELAY_CHECKPOINT_TABLE", "app.relay_state")
	t.Setenv("RELAY_POSTGRES_PUBLICATION", "Events Pub")
	t.Setenv("RELAY_OUTBOX_COLUMNS_PAYLOAD", "body")
	code, out, errOut := run(t, "setup", "--create-outbox-table")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "setup", out,
		"outbox table app.Events: created",
		"checkpoint table app.relay_state: created",
		"publication Events Pub: created for app.Events",
		"slot "+slot+": created")
	got := queryString(t, dsn, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
	  WHERE attrelid = '"app"."Events"'::regclass AND attnum > 0`)
	if want := "id,aggregate_type,aggregate_id,event_type,body,headers,created_at"; got != want {
		t.Errorf("columns of app.Events = %q; want %q", got, want)
	}
}

// A Debezium user's table: setup creates Debezium's documented layout, check
// accepts it under outbox.layout: debezium, and under the relay's layout names
// the column mapping that fixes it (never a layout change: that would change
// the messages, the relay layout's three headers).
func TestSetupDebeziumLayout(t *testing.T) {
	dsn, _ := dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	t.Setenv("RELAY_OUTBOX_LAYOUT", "debezium")
	code, out, errOut := run(t, "setup", "--create-outbox-table")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "setup", out, "outbox table public.outbox: created (debezium layout)")
	got := queryString(t, dsn, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute
	  WHERE attrelid = 'public.outbox'::regclass AND attnum > 0`)
	want := "id uuid,aggregatetype character varying(255),aggregateid character varying(255),type character varying(255),payload jsonb,created_at timestamp with time zone"
	if got != want {
		t.Errorf("columns = %q; want %q (Debezium's documented table, and created_at)", got, want)
	}
	if code, out, errOut := run(t, "check"); code != exitcode.OK || !strings.Contains(out, "ok    outbox table: public.outbox has the mapped columns") {
		t.Errorf("check with outbox.layout=debezium: exit %d\n%s%s", code, out, errOut)
	}

	t.Setenv("RELAY_OUTBOX_LAYOUT", "relay")
	code, out, _ = run(t, "check")
	if code != exitcode.Failure || !strings.Contains(out, `FAIL  outbox table: public.outbox: no column "aggregate_type" (outbox.columns.aggregate_type)`) ||
		!strings.Contains(out, `map them: set outbox.columns.aggregate_type: aggregatetype, outbox.columns.aggregate_id: aggregateid, outbox.columns.event_type: type, outbox.columns.headers: "-" (no headers column)`) ||
		strings.Contains(out, "outbox.layout") {
		t.Errorf("check of a Debezium table with the relay layout: exit %d; want 1 naming the column mapping that keeps the relay layout's messages, never a layout change\n%s", code, out)
	}

	t.Setenv("RELAY_OUTBOX_LAYOUT", "debezum")
	code, _, errOut = run(t, "check")
	if code != exitcode.Usage || !strings.Contains(errOut, `outbox.layout "debezum" is not a layout`) {
		t.Errorf("check with a misspelt layout: exit %d; want 2 naming the layouts\n%s", code, errOut)
	}
}

// TestSetupPartitionedOutbox: on an outbox partitioned by created_at, setup
// creates the publication with publish_via_partition_root, and fixes one an
// older setup made without it, saying so; check fails on the old one with
// the exact statement and passes on the fixed one.
func TestSetupPartitionedOutbox(t *testing.T) {
	dsn, _ := dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	execSQL(t, dsn,
		`CREATE TABLE outbox (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
    event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE outbox_2026_11 PARTITION OF outbox FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')`,
		`CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`,
		`CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert')`)
	viaRoot := func() string {
		return queryString(t, dsn, `SELECT pubviaroot::text FROM pg_publication WHERE pubname = 'outbox_relay'`)
	}

	code, out, _ := run(t, "check")
	if code != exitcode.Failure {
		t.Errorf("check with partitions published under their own names: exit = %d; want %d", code, exitcode.Failure)
	}
	wantLines(t, "check", out,
		"FAIL  publication: outbox_relay publishes the partitions of the partitioned public.outbox under their own names",
		`ALTER PUBLICATION "outbox_relay" SET (publish_via_partition_root = true) (or run `+"`outbox-relay setup`)")
	if got := viaRoot(); got != "false" {
		t.Fatalf("check changed the publication: pubviaroot = %s", got)
	}

	code, out, errOut := run(t, "setup")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	wantLines(t, "setup", out,
		"publication outbox_relay: already exists, covers the partitioned public.outbox; set publish_via_partition_root = true")
	if got := viaRoot(); got != "true" {
		t.Errorf("after setup pubviaroot = %s; want true", got)
	}
	code, out, errOut = run(t, "check")
	if code != exitcode.OK || strings.Contains(out, "FAIL") {
		t.Errorf("check after setup: exit = %d; want 0 and no FAIL\n%s%s", code, out, errOut)
	}
	wantLines(t, "check after setup", out,
		"ok    publication: outbox_relay covers the partitioned public.outbox (its partitions under its name) and publishes inserts",
		"ok    outbox table: public.outbox has the mapped columns with usable types")

	// A fresh publication is made with the option.
	execSQL(t, dsn, `DROP PUBLICATION outbox_relay`)
	if code, out, errOut := run(t, "setup"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	if got := viaRoot(); got != "true" {
		t.Errorf("publication created by setup: pubviaroot = %s; want true", got)
	}
}

// TestSetupMessages: with outbox.source messages, setup needs no outbox
// table (the archive is optional) and creates a publication of no table;
// check agrees; an archive in the publication is a problem for both.
func TestSetupMessages(t *testing.T) {
	dsn, slot := dbEnv(t)
	if v := queryString(t, dsn, `SHOW server_version_num`); v < "140000" {
		t.Skipf("Postgres %s: pgoutput sends logical decoding messages from 14 on", v)
	}
	t.Setenv("RELAY_OUTBOX_SOURCE", "messages")
	code, out, errOut := run(t, "setup")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "setup", out,
		"outbox table public.outbox: none; events come from logical decoding messages",
		"publication outbox_relay: created for no table",
		"slot "+slot+": created (pgoutput) at ")
	if n := queryString(t, dsn, `SELECT count(*)::text FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); n != "0" {
		t.Errorf("the publication covers %s tables; want none", n)
	}
	code, out, _ = run(t, "check")
	wantLines(t, "check", out, "does not exist: events come from logical decoding messages", "the server's pgoutput sends logical decoding messages")

	// An archive the publication covers would stop the relay at its first row.
	execSQL(t, dsn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb)`,
		`ALTER PUBLICATION outbox_relay ADD TABLE outbox`)
	code, out, _ = run(t, "setup")
	if code != exitcode.Failure {
		t.Errorf("setup with the archive published: exit = %d; want %d", code, exitcode.Failure)
	}
	wantLines(t, "setup", out, `publication outbox_relay: covers public.outbox, whose inserts would stop a relay that reads messages only; fix: ALTER PUBLICATION "outbox_relay" DROP TABLE "public"."outbox"`)
	code, out, _ = run(t, "check")
	if code == exitcode.OK {
		t.Errorf("check with the archive published: exit 0; want a failure")
	}
	wantLines(t, "check", out, `covers public.outbox, whose inserts stop a relay that reads messages only`)
}

// TestSetupTables: setup creates every table of outbox.tables in its layout
// and one publication of all; check then passes them, and names a table the
// publication does not cover.
func TestSetupTables(t *testing.T) {
	dsn, _ := dbEnv(t)
	execSQL(t, dsn, `CREATE SCHEMA billing`)
	t.Setenv("RELAY_OUTBOX_TABLES", `[{table: billing.outbox, layout: debezium}, {table: shipping_events}]`)
	code, out, errOut := run(t, "setup", "--create-outbox-table")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "setup", out,
		"outbox table billing.outbox: created (debezium layout)",
		"outbox table public.shipping_events: created (relay layout)",
		"publication outbox_relay: created for public.outbox, billing.outbox, public.shipping_events")
	if got := queryString(t, dsn, `SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY schemaname, tablename) FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); got != "billing.outbox,public.outbox,public.shipping_events" {
		t.Errorf("the publication covers %s; want the three tables", got)
	}
	if got := queryString(t, dsn, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'billing.outbox'::regclass AND attnum > 0`); !strings.Contains(got, "aggregatetype") {
		t.Errorf("billing.outbox has columns %s; want Debezium's", got)
	}
	_, out, _ = run(t, "check")
	wantLines(t, "check", out, "billing.outbox has the mapped columns", "covers the outbox table public.shipping_events")

	execSQL(t, dsn, `ALTER PUBLICATION outbox_relay DROP TABLE shipping_events`)
	code, out, _ = run(t, "check")
	if code == exitcode.OK {
		t.Errorf("check with a table out of the publication: exit 0; want a failure")
	}
	wantLines(t, "check", out, `does not cover the outbox table public.shipping_events; ALTER PUBLICATION "outbox_relay" ADD TABLE "public"."shipping_events"`)
}

// TestSetupChecksFirst: setup runs the checks of what it cannot create
// before it creates anything. A role without REPLICATION (what a default
// wal_level = replica or full slots would do alike) gets check's FAIL lines
// and exit 1, and the database is left as it was: no table, no publication,
// no slot (issue 37 item 6: setup created five tables and the publication,
// then failed on the slot).
func TestSetupChecksFirst(t *testing.T) {
	cleanEnv(t)
	base := newDatabase(t) // the superuser's DSN; the role must outlive the test's database
	admin := superuserDSN(t, base)
	role, password := leastPrivilegedRole(t, admin)
	execSQL(t, admin, `ALTER ROLE `+sql.Ident(role)+` NOREPLICATION`)
	dsn, slot := dbEnv(t)
	su := superuserDSN(t, dsn)
	// Everything but REPLICATION: it could create all of it.
	execSQL(t, su, `GRANT CREATE ON DATABASE `+sql.Ident(queryString(t, dsn, `SELECT current_database()`))+` TO `+sql.Ident(role),
		`GRANT CREATE, USAGE ON SCHEMA public TO `+sql.Ident(role))
	t.Setenv("RELAY_POSTGRES_DSN", withUser(t, dsn, "postgres://"+url.UserPassword(role, password).String()+"@x/"))

	code, out, errOut := run(t, "setup", "--create-outbox-table")
	if code != exitcode.Failure {
		t.Errorf("setup by a role without REPLICATION = exit %d; want %d\n%s%s", code, exitcode.Failure, out, errOut)
	}
	for _, want := range []string{"FAIL  role: " + role + " has neither REPLICATION nor superuser; ALTER ROLE", "FAIL  replication connection: "} {
		if !strings.Contains(out, want) {
			t.Errorf("setup's output lacks %q (check's FAIL line)\nstdout:\n%s\nstderr:\n%s", want, out, errOut)
		}
	}
	if !strings.Contains(errOut, "nothing") || !strings.Contains(errOut, "run setup again") {
		t.Errorf("setup's error does not say nothing was created and to run it again:\n%s", errOut)
	}
	if strings.Contains(out, "created") {
		t.Errorf("setup printed that it created something:\n%s", out)
	}
	if n := queryString(t, dsn, `SELECT count(*)::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != "0" {
		t.Errorf("setup that failed its checks left %s relations in public; want none", n)
	}
	if n := queryString(t, dsn, `SELECT count(*)::text FROM pg_publication`); n != "0" {
		t.Errorf("setup that failed its checks left %s publications; want none", n)
	}
	if n := queryString(t, dsn, `SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1`, slot); n != "0" {
		t.Errorf("setup that failed its checks created the slot")
	}
}
