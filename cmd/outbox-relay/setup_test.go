package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// dbEnv points the relay's config at a fresh database and a unique slot.
// Kafka is never contacted by setup; the address only satisfies validation.
func dbEnv(t *testing.T) (dsn, slot string) {
	t.Helper()
	cleanEnv(t)
	dsn = testenv.Postgres(t).DSN
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

// TestSetupProblemsExit: a setup that reports problems it cannot fix exits 1
// (what it prints and leaves behind: internal/admin's TestSetupMissingOutbox).
func TestSetupProblemsExit(t *testing.T) {
	dbEnv(t)
	if code, out, errOut := run(t, "setup"); code != exitcode.Failure {
		t.Errorf("setup without the outbox table: exit = %d; want %d\nstdout:\n%s\nstderr:\n%s", code, exitcode.Failure, out, errOut)
	}
}

// TestSetupConfiguredNames: names set in the environment reach setup through
// the command's configuration (adminConfig), a payload column among them;
// kept here as setup's one run from configuration to catalog.
func TestSetupConfiguredNames(t *testing.T) {
	dsn, slot := dbEnv(t)
	testenv.ExecAs(t, dsn, `CREATE SCHEMA app`)
	t.Setenv("RELAY_OUTBOX_TABLE", "app.Events")
	t.Setenv("RELAY_CHECKPOINT_TABLE", "app.relay_state")
	t.Setenv("RELAY_POSTGRES_PUBLICATION", "Events Pub")
	t.Setenv("RELAY_OUTBOX_COLUMNS_PAYLOAD", "body")
	code, out, errOut := run(t, "setup", "--create-outbox-table")
	if code != exitcode.OK {
		t.Fatalf("setup exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	testenv.WantLines(t, "setup", out,
		"outbox table app.Events: created",
		"checkpoint table app.relay_state: created",
		"publication Events Pub: created for app.Events",
		"slot "+slot+": created")
	got := testenv.QueryString(t, dsn, `SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute
	  WHERE attrelid = '"app"."Events"'::regclass AND attnum > 0`)
	if want := "id,aggregate_type,aggregate_id,event_type,body,headers,created_at"; got != want {
		t.Errorf("columns of app.Events = %q; want %q", got, want)
	}
}

// TestSetupLayoutMisspelt: a layout that is none is a usage error naming the
// layouts (what setup and check make of each layout: internal/admin's
// TestSetupDebeziumLayout).
func TestSetupLayoutMisspelt(t *testing.T) {
	dbEnv(t)
	t.Setenv("RELAY_OUTBOX_LAYOUT", "debezum")
	code, _, errOut := run(t, "check")
	if code != exitcode.Usage || !strings.Contains(errOut, `outbox.layout "debezum" is not a layout`) {
		t.Errorf("check with a misspelt layout: exit %d; want 2 naming the layouts\n%s", code, errOut)
	}
}
