package admin

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// runSetup runs Setup with cfg and returns what it wrote.
func runSetup(t *testing.T, cfg Config, createOutbox bool) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Setup(context.Background(), cfg, createOutbox, &out)
	return out.String(), err
}

// mustSetup is runSetup failing the test unless Setup returns nil; what
// names the run in the failure.
func mustSetup(t *testing.T, cfg Config, createOutbox bool, what string) string {
	t.Helper()
	out, err := runSetup(t, cfg, createOutbox)
	if err != nil {
		t.Fatalf("%s = %v; want nil\noutput:\n%s", what, err, out)
	}
	return out
}

func TestSetupTwice(t *testing.T) {
	pg, cfg := testDB(t)
	dsn, slot := pg.DSN, cfg.Slot

	out := mustSetup(t, cfg, true, "first Setup")
	testenv.WantLines(t, "first setup", out,
		"outbox table public.outbox: created",
		"checkpoint table outbox_relay_checkpoint: created",
		"checkpoint history table outbox_relay_checkpoint_history: created",
		"publication outbox_relay: created for public.outbox, inserts only",
		"slot "+slot+": created (pgoutput) at ")

	out = mustSetup(t, cfg, true, "second Setup")
	testenv.WantLines(t, "second setup", out,
		"outbox table public.outbox: already exists",
		"checkpoint table outbox_relay_checkpoint: already exists",
		"checkpoint history table outbox_relay_checkpoint_history: already exists",
		"publication outbox_relay: already exists, covers public.outbox",
		"slot "+slot+": already exists (pgoutput)")
	if strings.Contains(out, "created") {
		t.Errorf("second setup created something:\n%s", out)
	}

	// What users rely on: the publication has the table, inserts only, and
	// the slot decodes with pgoutput in this database.
	got := testenv.QueryString(t, dsn, `SELECT format('%s %s %s %s', p.pubinsert, p.pubupdate, p.pubdelete,
	    (SELECT string_agg(schemaname||'.'||tablename, ',') FROM pg_publication_tables WHERE pubname = p.pubname))
	  FROM pg_publication p WHERE pubname = 'outbox_relay'`)
	if want := "t f f public.outbox"; got != want {
		t.Errorf("publication = %q; want %q", got, want)
	}
	got = testenv.QueryString(t, dsn, `SELECT plugin || ' ' || database FROM pg_replication_slots WHERE slot_name = $1`, slot)
	if want := "pgoutput " + testenv.QueryString(t, dsn, "SELECT current_database()"); got != want {
		t.Errorf("slot = %q; want %q", got, want)
	}
}

// A problem Setup cannot fix is an error after the checks passed (not
// ErrNothingCreated: it created what it could), which the CLI exits 1 on.
func TestSetupMissingOutbox(t *testing.T) {
	pg, cfg := testDB(t)
	dsn, slot := pg.DSN, cfg.Slot
	out, err := runSetup(t, cfg, false)
	if err == nil || errors.Is(err, ErrNothingCreated) {
		t.Errorf("Setup without the outbox table = %v; want an error of its problems", err)
	}
	testenv.WantLines(t, "setup", out,
		"outbox table public.outbox: missing; create it with `outbox-relay setup --create-outbox-table`",
		"checkpoint table outbox_relay_checkpoint: created",
		"publication outbox_relay: not created: the outbox table is missing",
		"slot "+slot+": not created until the problems above are fixed")
	// No slot may be left behind retaining WAL.
	if n := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1`, slot); n != "0" {
		t.Errorf("slots named %s after a failed setup = %s; want 0", slot, n)
	}
}

func TestSetupPublicationOfOtherTable(t *testing.T) {
	pg, cfg := testDB(t)
	pg.Exec(t, `CREATE TABLE other (id int)`)
	pg.Exec(t, `CREATE PUBLICATION outbox_relay FOR TABLE other`)
	out, err := runSetup(t, cfg, true)
	if err == nil || errors.Is(err, ErrNothingCreated) {
		t.Errorf("Setup with a publication of another table = %v; want an error of its problems", err)
	}
	testenv.WantLines(t, "setup", out,
		"publication outbox_relay: already exists but does not cover public.outbox (it covers public.other); fix: ALTER PUBLICATION \"outbox_relay\" ADD TABLE \"public\".\"outbox\"")
	// Not altered silently.
	if got := testenv.QueryString(t, pg.DSN, `SELECT string_agg(tablename, ',') FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); got != "other" {
		t.Errorf("publication tables after setup = %q; want %q (unchanged)", got, "other")
	}
}

// A Debezium user's table: setup creates Debezium's documented layout, check
// accepts it under outbox.layout: debezium, and under the relay's layout names
// the column mapping that fixes it (never a layout change: that would change
// the messages, the relay layout's three headers).
func TestSetupDebeziumLayout(t *testing.T) {
	pg, relayCfg := testDB(t)
	cfg := relayCfg
	k := withKafka(t, &cfg)
	relayCfg.Kafka = cfg.Kafka
	dbz, err := sql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Layout, cfg.Columns = sql.LayoutDebezium, dbz
	cfg.Router.Columns, cfg.Router.Headers = dbz, sql.LayoutDebezium.Headers()
	out := mustSetup(t, cfg, true, "Setup")
	testenv.WantLines(t, "setup", out, "outbox table public.outbox: created (debezium layout)")
	got := testenv.QueryString(t, pg.DSN, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute
	  WHERE attrelid = 'public.outbox'::regclass AND attnum > 0`)
	want := "id uuid,aggregatetype character varying(255),aggregateid character varying(255),type character varying(255),payload jsonb,created_at timestamp with time zone"
	if got != want {
		t.Errorf("columns = %q; want %q (Debezium's documented table, and created_at)", got, want)
	}
	if failed, out := runCheck(t, cfg, k); failed != 0 || !strings.Contains(out, "ok    outbox table: public.outbox has the mapped columns") {
		t.Errorf("Check with the debezium layout = %d failed\n%s", failed, out)
	}

	failed, out := runCheck(t, relayCfg, k)
	if failed == 0 || !strings.Contains(out, `FAIL  outbox table: public.outbox: no column "aggregate_type" (outbox.columns.aggregate_type)`) ||
		!strings.Contains(out, `map them: set outbox.columns.aggregate_type: aggregatetype, outbox.columns.aggregate_id: aggregateid, outbox.columns.event_type: type, outbox.columns.headers: "-" (no headers column)`) ||
		strings.Contains(out, "outbox.layout") {
		t.Errorf("Check of a Debezium table with the relay layout = %d failed; want failures naming the column mapping that keeps the relay layout's messages, never a layout change\n%s", failed, out)
	}
}

// TestSetupPartitionedOutbox: on an outbox partitioned by created_at, setup
// creates the publication with publish_via_partition_root, and fixes one an
// older setup made without it, saying so; check fails on the old one with
// the exact statement and passes on the fixed one.
func TestSetupPartitionedOutbox(t *testing.T) {
	pg, cfg := testDB(t)
	k := withKafka(t, &cfg)
	pg.Exec(t, `CREATE TABLE outbox (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
    event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	pg.Exec(t, `CREATE TABLE outbox_2026_11 PARTITION OF outbox FOR VALUES FROM ('2026-11-01') TO ('2026-12-01')`)
	pg.Exec(t, `CREATE TABLE outbox_default PARTITION OF outbox DEFAULT`)
	pg.Exec(t, `CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert')`)
	viaRoot := func() string {
		return testenv.QueryString(t, pg.DSN, `SELECT pubviaroot::text FROM pg_publication WHERE pubname = 'outbox_relay'`)
	}

	failed, out := runCheck(t, cfg, k)
	if failed == 0 {
		t.Errorf("Check with partitions published under their own names = 0 failed; want failures")
	}
	testenv.WantLines(t, "check", out,
		"FAIL  publication: outbox_relay publishes the partitions of the partitioned public.outbox under their own names",
		`ALTER PUBLICATION "outbox_relay" SET (publish_via_partition_root = true) (or run `+"`outbox-relay setup`)")
	if got := viaRoot(); got != "false" {
		t.Fatalf("check changed the publication: pubviaroot = %s", got)
	}

	out = mustSetup(t, cfg, false, "Setup")
	testenv.WantLines(t, "setup", out,
		"publication outbox_relay: already exists, covers the partitioned public.outbox; set publish_via_partition_root = true")
	if got := viaRoot(); got != "true" {
		t.Errorf("after setup pubviaroot = %s; want true", got)
	}
	failed, out = runCheck(t, cfg, k)
	if failed != 0 || strings.Contains(out, "FAIL") {
		t.Errorf("Check after setup = %d failed; want 0 and no FAIL\n%s", failed, out)
	}
	testenv.WantLines(t, "check after setup", out,
		"ok    publication: outbox_relay covers the partitioned public.outbox (its partitions under its name) and publishes inserts",
		"ok    outbox table: public.outbox has the mapped columns with usable types")

	// A fresh publication is made with the option.
	pg.Exec(t, `DROP PUBLICATION outbox_relay`)
	mustSetup(t, cfg, false, "Setup")
	if got := viaRoot(); got != "true" {
		t.Errorf("publication created by setup: pubviaroot = %s; want true", got)
	}
}

// TestSetupMessages: with outbox.source messages, setup needs no outbox
// table (the archive is optional) and creates a publication of no table;
// check agrees; an archive in the publication is a problem for both.
func TestSetupMessages(t *testing.T) {
	pg, cfg := testDB(t)
	slot := cfg.Slot
	if v := testenv.QueryString(t, pg.DSN, `SHOW server_version_num`); v < "140000" {
		t.Skipf("Postgres %s: pgoutput sends logical decoding messages from 14 on", v)
	}
	// outbox.source: messages, with its default message prefix.
	cfg.MessagesOnly, cfg.Messages = true, true
	// Check's Kafka is not what this test is about; as in cmd, nothing
	// listens there.
	k := kafkaAt(t, &cfg, "127.0.0.1:9")
	out := mustSetup(t, cfg, false, "Setup")
	testenv.WantLines(t, "setup", out,
		"outbox table public.outbox: none; events come from logical decoding messages",
		"publication outbox_relay: created for no table",
		"slot "+slot+": created (pgoutput) at ")
	if n := testenv.QueryString(t, pg.DSN, `SELECT count(*)::text FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); n != "0" {
		t.Errorf("the publication covers %s tables; want none", n)
	}
	_, out = runCheck(t, cfg, k)
	testenv.WantLines(t, "check", out, "does not exist: events come from logical decoding messages", "the server's pgoutput sends logical decoding messages")

	// An archive the publication covers would stop the relay at its first row.
	pg.Exec(t, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb)`)
	pg.Exec(t, `ALTER PUBLICATION outbox_relay ADD TABLE outbox`)
	out, err := runSetup(t, cfg, false)
	if err == nil || errors.Is(err, ErrNothingCreated) {
		t.Errorf("Setup with the archive published = %v; want an error of its problems", err)
	}
	testenv.WantLines(t, "setup", out, `publication outbox_relay: covers public.outbox, whose inserts would stop a relay that reads messages only; fix: ALTER PUBLICATION "outbox_relay" DROP TABLE "public"."outbox"`)
	failed, out := runCheck(t, cfg, k)
	if failed == 0 {
		t.Errorf("Check with the archive published = 0 failed; want a failure")
	}
	testenv.WantLines(t, "check", out, `covers public.outbox, whose inserts stop a relay that reads messages only`)
}

// TestSetupTables: setup creates every table of outbox.tables in its layout
// and one publication of all; check then passes them, and names a table the
// publication does not cover.
func TestSetupTables(t *testing.T) {
	pg, cfg := testDB(t)
	k := withKafka(t, &cfg)
	pg.Exec(t, `CREATE SCHEMA billing`)
	dbz, err := sql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	// outbox.tables: [{table: billing.outbox, layout: debezium}, {table: shipping_events}]
	cfg.Tables = []Table{
		{Name: sql.Table{Schema: "billing", Name: "outbox"}, Layout: sql.LayoutDebezium, Columns: dbz,
			Router: router.Config{Columns: dbz, Headers: sql.LayoutDebezium.Headers()}},
		{Name: sql.Table{Schema: "public", Name: "shipping_events"}, Layout: sql.LayoutRelay, Columns: cfg.Columns,
			Router: router.Config{Columns: cfg.Columns, Headers: sql.LayoutRelay.Headers()}},
	}
	out := mustSetup(t, cfg, true, "Setup")
	testenv.WantLines(t, "setup", out,
		"outbox table billing.outbox: created (debezium layout)",
		"outbox table public.shipping_events: created (relay layout)",
		"publication outbox_relay: created for public.outbox, billing.outbox, public.shipping_events")
	if got := testenv.QueryString(t, pg.DSN, `SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY schemaname, tablename) FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); got != "billing.outbox,public.outbox,public.shipping_events" {
		t.Errorf("the publication covers %s; want the three tables", got)
	}
	if got := testenv.QueryString(t, pg.DSN, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'billing.outbox'::regclass AND attnum > 0`); !strings.Contains(got, "aggregatetype") {
		t.Errorf("billing.outbox has columns %s; want Debezium's", got)
	}
	_, out = runCheck(t, cfg, k)
	testenv.WantLines(t, "check", out, "billing.outbox has the mapped columns", "covers the outbox table public.shipping_events")

	pg.Exec(t, `ALTER PUBLICATION outbox_relay DROP TABLE shipping_events`)
	failed, out := runCheck(t, cfg, k)
	if failed == 0 {
		t.Errorf("Check with a table out of the publication = 0 failed; want a failure")
	}
	testenv.WantLines(t, "check", out, `does not cover the outbox table public.shipping_events; ALTER PUBLICATION "outbox_relay" ADD TABLE "public"."shipping_events"`)
}

// TestSetupChecksFirst: setup runs the checks of what it cannot create
// before it creates anything. A role without REPLICATION (what a default
// wal_level = replica or full slots would do alike) gets check's FAIL lines
// and ErrNothingCreated, and the database is left as it was: no table, no
// publication, no slot (issue 37 item 6: setup created five tables and the
// publication, then failed on the slot).
func TestSetupChecksFirst(t *testing.T) {
	base := testenv.Postgres(t) // the superuser's DSN; the role must outlive the test's database
	admin := testenv.SuperuserDSN(t, base.DSN)
	role, password := testenv.LeastPrivilegedRole(t, admin)
	testenv.ExecAs(t, admin, `ALTER ROLE `+sql.Ident(role)+` NOREPLICATION`)
	pg, cfg := testDB(t)
	dsn, slot := pg.DSN, cfg.Slot
	su := testenv.SuperuserDSN(t, dsn)
	// Everything but REPLICATION: it could create all of it.
	testenv.ExecAs(t, su, `GRANT CREATE ON DATABASE `+sql.Ident(testenv.QueryString(t, dsn, `SELECT current_database()`))+` TO `+sql.Ident(role),
		`GRANT CREATE, USAGE ON SCHEMA public TO `+sql.Ident(role))
	cfg.DSN = testenv.WithUser(t, dsn, "postgres://"+url.UserPassword(role, password).String()+"@x/")

	out, err := runSetup(t, cfg, true)
	if !errors.Is(err, ErrNothingCreated) {
		t.Errorf("Setup by a role without REPLICATION = %v; want ErrNothingCreated\n%s", err, out)
	}
	for _, want := range []string{"FAIL  role: " + role + " has neither REPLICATION nor superuser; ALTER ROLE", "FAIL  replication connection: "} {
		if !strings.Contains(out, want) {
			t.Errorf("Setup's output lacks %q (check's FAIL line)\noutput:\n%s", want, out)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "nothing") || !strings.Contains(err.Error(), "run setup again") {
		t.Errorf("Setup's error does not say nothing was created and to run it again: %v", err)
	}
	if strings.Contains(out, "created") {
		t.Errorf("Setup printed that it created something:\n%s", out)
	}
	if n := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'`); n != "0" {
		t.Errorf("setup that failed its checks left %s relations in public; want none", n)
	}
	if n := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM pg_publication`); n != "0" {
		t.Errorf("setup that failed its checks left %s publications; want none", n)
	}
	if n := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1`, slot); n != "0" {
		t.Errorf("setup that failed its checks created the slot")
	}
}
