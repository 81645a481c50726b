package admin

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// runSetup runs Setup with cfg and returns what it wrote.
func runSetup(t *testing.T, cfg Config, createOutbox bool) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := Setup(context.Background(), cfg, createOutbox, &out)
	return out.String(), err
}

func TestSetupTwice(t *testing.T) {
	pg, cfg := testDB(t)
	dsn, slot := pg.DSN, cfg.Slot

	out, err := runSetup(t, cfg, true)
	if err != nil {
		t.Fatalf("first Setup = %v; want nil\noutput:\n%s", err, out)
	}
	wantLines(t, "first setup", out,
		"outbox table public.outbox: created",
		"checkpoint table outbox_relay_checkpoint: created",
		"checkpoint history table outbox_relay_checkpoint_history: created",
		"publication outbox_relay: created for public.outbox, inserts only",
		"slot "+slot+": created (pgoutput) at ")

	out, err = runSetup(t, cfg, true)
	if err != nil {
		t.Fatalf("second Setup = %v; want nil\noutput:\n%s", err, out)
	}
	wantLines(t, "second setup", out,
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
	got := queryString(t, dsn, `SELECT format('%s %s %s %s', p.pubinsert, p.pubupdate, p.pubdelete,
	    (SELECT string_agg(schemaname||'.'||tablename, ',') FROM pg_publication_tables WHERE pubname = p.pubname))
	  FROM pg_publication p WHERE pubname = 'outbox_relay'`)
	if want := "t f f public.outbox"; got != want {
		t.Errorf("publication = %q; want %q", got, want)
	}
	got = queryString(t, dsn, `SELECT plugin || ' ' || database FROM pg_replication_slots WHERE slot_name = $1`, slot)
	if want := "pgoutput " + queryString(t, dsn, "SELECT current_database()"); got != want {
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
	wantLines(t, "setup", out,
		"outbox table public.outbox: missing; create it with `outbox-relay setup --create-outbox-table`",
		"checkpoint table outbox_relay_checkpoint: created",
		"publication outbox_relay: not created: the outbox table is missing",
		"slot "+slot+": not created until the problems above are fixed")
	// No slot may be left behind retaining WAL.
	if n := queryString(t, dsn, `SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = $1`, slot); n != "0" {
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
	wantLines(t, "setup", out,
		"publication outbox_relay: already exists but does not cover public.outbox (it covers public.other); fix: ALTER PUBLICATION \"outbox_relay\" ADD TABLE \"public\".\"outbox\"")
	// Not altered silently.
	if got := queryString(t, pg.DSN, `SELECT string_agg(tablename, ',') FROM pg_publication_tables WHERE pubname = 'outbox_relay'`); got != "other" {
		t.Errorf("publication tables after setup = %q; want %q (unchanged)", got, "other")
	}
}
