package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

// TestCheckNeighbours: another relay's rows in the shared retry and
// checkpoint tables, another slot and another publication of the outbox are
// legitimate: check says what they mean in warn lines and still passes,
// setup says so too. Retry rows of an earlier version that may be another
// relay's fail check and setup (run would refuse to start), naming the
// UPDATE; once assigned, both pass.
func TestCheckNeighbours(t *testing.T) {
	dsn, slot := dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	other := uniqueName(t, "billing")
	execSQL(t, dsn,
		`INSERT INTO outbox_relay_checkpoint (slot_name, lsn) VALUES ('`+other+`', '0/1')`,
		`INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, outbox_table, slot_name)
VALUES ('lsn:0/1:0', 'billing/X', 'dead', now(), 'public.outbox', '`+other+`')`,
		`CREATE PUBLICATION debezium_pub FOR TABLE public.outbox`,
		`SELECT pg_create_logical_replication_slot('`+other+`', 'pgoutput')`)

	code, out, errOut := run(t, "check")
	if code != exitcode.OK {
		t.Fatalf("check with neighbours: exit = %d; want 0 (they are legitimate)\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "check", out,
		"warn  neighbours: retry table outbox_relay_retry also holds rows of other slots: "+other+" (1): isolation is by slot",
		"warn  neighbours: checkpoint table outbox_relay_checkpoint also holds the checkpoints of slots "+other,
		"warn  neighbours: slots "+other+" parked events of this relay's outbox tables",
		"outbox.retention waits for them: it deletes only rows every other slot of the database has read, unless outbox.retention_ignore_slots names one of them",
		"warn  neighbours: other publications publish this relay's outbox tables: public.outbox by debezium_pub",
		"warn  neighbours: other logical replication slots in this database: "+other+" (pgoutput, inactive)")
	code, out, errOut = run(t, "setup")
	if code != exitcode.OK || !strings.Contains(out, "neighbour: retry table outbox_relay_retry also holds rows of other slots") {
		t.Errorf("setup with neighbours = exit %d; want 0 and the neighbours said\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	// A row of an earlier version, while another slot shares the tables.
	execSQL(t, dsn, `INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, outbox_table)
VALUES ('lsn:0/2:0', 'orders/A', 'pending', now(), 'public.outbox')`)
	code, out, _ = run(t, "check")
	if code == exitcode.OK || !strings.Contains(out, "FAIL  retry table: retry table outbox_relay_retry holds 1 rows of an earlier version that belong to no slot") ||
		!strings.Contains(out, `UPDATE "outbox_relay_retry" SET slot_name`) {
		t.Errorf("check with a row of no slot = exit %d; want a FAIL naming the UPDATE:\n%s", code, out)
	}
	code, out, _ = run(t, "setup")
	if code == exitcode.OK || !strings.Contains(out, "belong to no slot") {
		t.Errorf("setup with a row of no slot = exit %d; want a problem:\n%s", code, out)
	}
	execSQL(t, dsn, `UPDATE outbox_relay_retry SET slot_name = '`+slot+`' WHERE slot_name IS NULL AND outbox_table = 'public.outbox'`)
	if code, out, errOut := run(t, "check"); code != exitcode.OK || strings.Contains(out, "no slot") {
		t.Errorf("check after assigning the row = exit %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
