package admin

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/sql"
)

// TestDebeziumTableWithoutEventType: Debezium reads table.field.event.type
// only when something uses it; a Debezium-layout table without a "type"
// column passes setup and check as long as nothing does, and "-" maps no
// column at all. (That "-" with the event_type header is a configuration
// error stays in cmd/outbox-relay's TestDebeziumTableWithoutEventType.)
func TestDebeziumTableWithoutEventType(t *testing.T) {
	pg, cfg := testDB(t)
	k := withKafka(t, &cfg)
	dbz, err := sql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	// outbox.layout: debezium
	cfg.Layout, cfg.Columns = sql.LayoutDebezium, dbz
	cfg.Router.Columns, cfg.Router.Headers = dbz, sql.LayoutDebezium.Headers()
	pg.Exec(t, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now())`)
	mustSetup(t, cfg, false, "Setup of a Debezium table without type")
	if failed, out := runCheck(t, cfg, k); failed != 0 || !strings.Contains(out, "ok    outbox table: public.outbox has the mapped columns") {
		t.Errorf("Check of a Debezium table without type = %d failed; want 0\n%s", failed, out)
	}
	// Once something uses it, it is needed, and check says so.
	cfg.Router.Headers = []string{"id", "event_type"} // message.headers: id,event_type
	if failed, out := runCheck(t, cfg, k); failed == 0 || !strings.Contains(out, `no column "type" (outbox.columns.event_type)`) {
		t.Errorf("Check with the event_type header on a table without type = %d failed; want failures naming the column\n%s", failed, out)
	}
	// "-": no event type column, and nothing may use it.
	cfg.Columns.EventType, cfg.Router.Columns.EventType = sql.NoHeaders, sql.NoHeaders
	cfg.Router.Headers = []string{"id"}
	if failed, out := runCheck(t, cfg, k); failed != 0 {
		t.Errorf("Check with event_type \"-\" = %d failed; want 0\n%s", failed, out)
	}
}

// TestColumnsMappedWrong: a mapping the table cannot satisfy fails check,
// and setup reports it in the same words and creates no slot. (That run
// refuses it at start in these words: cmd/outbox-relay's
// TestColumnsCheckedAtStart.)
func TestColumnsMappedWrong(t *testing.T) {
	pg, cfg := testDB(t)
	slot := cfg.Slot
	k := withKafka(t, &cfg)
	mustSetup(t, cfg, true, "Setup")
	pg.Exec(t, `SELECT pg_drop_replication_slot($1)`, slot)
	cfg.Columns.Payload, cfg.Router.Columns.Payload = "body", "body" // outbox.columns.payload: body
	// The table has a column of that field's name in another layout: the
	// fix maps it.
	const problem = `public.outbox: no column "body" (outbox.columns.payload); map them: set outbox.columns.payload: payload`
	const want = "outbox table " + problem

	if failed, out := runCheck(t, cfg, k); failed == 0 || !strings.Contains(out, "FAIL  outbox table: "+problem) {
		t.Errorf("Check = %d failed; want failures with %q\n%s", failed, want, out)
	}
	out, err := runSetup(t, cfg, false)
	if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "slot "+slot+": not created until the problems above are fixed") {
		t.Errorf("Setup = %v; want an error with %q and no slot\n%s", err, want, out)
	}
}
