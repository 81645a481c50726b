package admin

import (
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestPublicationRecreatedAfterSlot: a publication dropped and recreated
// while events were written cannot decode them from the slot's position (the
// walsender reads the catalog as it was then). setup and check say so, with
// the current WAL position to start past it; recreating it without anything
// written in between is harmless and passes.
func TestPublicationRecreatedAfterSlot(t *testing.T) {
	pg, cfg := testDB(t)
	dsn, slot := pg.DSN, cfg.Slot
	k := withKafka(t, &cfg)
	mustSetup(t, cfg, true, "Setup")
	insert := `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (gen_random_uuid(), 'Order', '1', 'Created', '{}')`
	recreate := []string{`DROP PUBLICATION outbox_relay`, `CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'insert')`}
	walNow := func() pglogrepl.LSN {
		t.Helper()
		lsn, err := pglogrepl.ParseLSN(testenv.QueryString(t, dsn, "SELECT pg_current_wal_lsn()::text"))
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}

	// Nothing written while it was missing: the slot decodes fine.
	testenv.ExecAs(t, dsn, recreate...)
	testenv.ExecAs(t, dsn, insert)
	if failed, out := runCheck(t, cfg, k); failed != 0 || !strings.Contains(out, "ok    slot decoding: "+slot+" can decode with publication outbox_relay") {
		t.Errorf("Check after a harmless recreation = %d failed; want 0\n%s", failed, out)
	}

	// An event written while it was missing: every start would fail.
	testenv.ExecAs(t, dsn, recreate[0], insert, recreate[1], insert)
	before := walNow()
	failed, out := runCheck(t, cfg, k)
	after := walNow()
	if failed == 0 {
		t.Errorf("Check = 0 failed; want failures")
	}
	// The server's WAL moves meanwhile (other tests share it): the position
	// printed is the one check read, between before and after.
	m := regexp.MustCompile("`outbox-relay run --start-lsn ([0-9A-F]+/[0-9A-F]+) --force`").FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("check output lacks `outbox-relay run --start-lsn X/Y --force`; got:\n%s", out)
	}
	got, err := pglogrepl.ParseLSN(m[1])
	if err != nil {
		t.Fatalf("parse LSN %q: %v", m[1], err)
	}
	if got < before || got > after {
		t.Errorf("check printed --start-lsn %s; want the current WAL position, between %s and %s", got, before, after)
	}
	testenv.WantLines(t, "check", out,
		"FAIL  slot decoding: publication outbox_relay was created after the position of slot "+slot,
		"the slot cannot decode past that point with this publication",
		"events committed in between are skipped: re-insert or replay them",
		"pg_drop_replication_slot('"+slot+"')")
	out, err = runSetup(t, cfg, false)
	if err == nil || !strings.Contains(out, "slot "+slot+": publication outbox_relay was created after the position of slot") {
		t.Errorf("Setup = %v; want an error, reporting the publication at the slot's position\n%s", err, out)
	}
	// Checking changed nothing: the slot still stands where it stood.
	if got := testenv.QueryString(t, dsn, "SELECT active::text FROM pg_replication_slots WHERE slot_name = $1", slot); got != "false" {
		t.Errorf("slot active after check = %s; want false", got)
	}
}
