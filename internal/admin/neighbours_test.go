package admin

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestCheckNeighbours: another relay's rows in the shared retry and
// checkpoint tables, another slot and another publication of the outbox are
// legitimate: check says what they mean in warn lines and still passes,
// setup says so too. Retry rows of an earlier version that may be another
// relay's fail check and setup (run would refuse to start), naming the
// UPDATE; once assigned, both pass.
func TestCheckNeighbours(t *testing.T) {
	pg, cfg := testDB(t)
	slot := cfg.Slot
	k := withKafka(t, &cfg)
	mustSetup(t, cfg, true, "Setup")
	other := testenv.UniqueName(t, "billing")
	for _, s := range []string{
		`INSERT INTO outbox_relay_checkpoint (slot_name, lsn) VALUES ('` + other + `', '0/1')`,
		`INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, outbox_table, slot_name)
VALUES ('lsn:0/1:0', 'billing/X', 'dead', now(), 'public.outbox', '` + other + `')`,
		`CREATE PUBLICATION debezium_pub FOR TABLE public.outbox`,
		`SELECT pg_create_logical_replication_slot('` + other + `', 'pgoutput')`,
	} {
		pg.Exec(t, s)
	}

	failed, out := runCheck(t, cfg, k)
	if failed != 0 {
		t.Fatalf("Check with neighbours = %d failed; want 0 (they are legitimate)\n%s", failed, out)
	}
	testenv.WantLines(t, "check", out,
		"warn  neighbours: retry table outbox_relay_retry also holds rows of other slots: "+other+" (1): isolation is by slot",
		"warn  neighbours: checkpoint table outbox_relay_checkpoint also holds the checkpoints of slots "+other,
		"warn  neighbours: slots "+other+" parked events of this relay's outbox tables",
		"outbox.retention waits for them: it deletes only rows every other slot of the database has read, unless outbox.retention_ignore_slots names one of them",
		"warn  neighbours: other publications publish this relay's outbox tables: public.outbox by debezium_pub",
		"warn  neighbours: other logical replication slots in this database: "+other+" (pgoutput, inactive)")
	out, err := runSetup(t, cfg, false)
	if err != nil || !strings.Contains(out, "neighbour: retry table outbox_relay_retry also holds rows of other slots") {
		t.Errorf("Setup with neighbours = %v; want nil and the neighbours said\n%s", err, out)
	}

	// A row of an earlier version, while another slot shares the tables.
	pg.Exec(t, `INSERT INTO outbox_relay_retry (event_key, aggregate, status, next_attempt_at, outbox_table)
VALUES ('lsn:0/2:0', 'orders/A', 'pending', now(), 'public.outbox')`)
	failed, out = runCheck(t, cfg, k)
	if failed == 0 || !strings.Contains(out, "FAIL  retry table: retry table outbox_relay_retry holds 1 rows of an earlier version that belong to no slot") ||
		!strings.Contains(out, `UPDATE "outbox_relay_retry" SET slot_name`) {
		t.Errorf("Check with a row of no slot = %d failed; want a FAIL naming the UPDATE:\n%s", failed, out)
	}
	out, err = runSetup(t, cfg, false)
	if err == nil || !strings.Contains(out, "belong to no slot") {
		t.Errorf("Setup with a row of no slot = %v; want a problem:\n%s", err, out)
	}
	pg.Exec(t, `UPDATE outbox_relay_retry SET slot_name = '`+slot+`' WHERE slot_name IS NULL AND outbox_table = 'public.outbox'`)
	if failed, out := runCheck(t, cfg, k); failed != 0 || strings.Contains(out, "no slot") {
		t.Errorf("Check after assigning the row = %d failed; want 0\n%s", failed, out)
	}
}
