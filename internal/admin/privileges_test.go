package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestPrintSQL: the statements are printed from the configuration alone,
// for the role of the DSN or the one given, without its password.
func TestPrintSQL(t *testing.T) {
	dsn := "postgres://app_relay:secret@127.0.0.1:9/shop?connect_timeout=1"
	cfg := defaultConfig(t, dsn, sql.DefaultSlot)
	cfg.RedactedDSN = "postgres://app_relay:xxxxx@127.0.0.1:9/shop?connect_timeout=1"
	cfg.OutboxTable = sql.Table{Schema: "events", Name: "outbox"}
	cfg.Retention = 7 * 24 * time.Hour
	cfg.RetryTable = sql.Table{Schema: "relay", Name: "retry"}
	var b strings.Builder
	if err := PrintSQL(cfg, "", false, &b); err != nil {
		t.Fatalf("PrintSQL = %v", err)
	}
	out := b.String()
	testenv.WantLines(t, "PrintSQL", out,
		`CREATE TABLE IF NOT EXISTS "relay"."retry" (`,
		`CREATE PUBLICATION "outbox_relay" FOR TABLE "events"."outbox" WITH (publish = 'insert', publish_via_partition_root = true);`,
		`ALTER PUBLICATION "outbox_relay" SET (publish_via_partition_root = true);`,
		`CREATE ROLE "app_relay" LOGIN REPLICATION;`,
		`GRANT CONNECT ON DATABASE "shop" TO "app_relay";`,
		`GRANT USAGE ON SCHEMA "events" TO "app_relay";`,
		`GRANT USAGE ON SCHEMA "public" TO "app_relay";`,
		`GRANT USAGE ON SCHEMA "relay" TO "app_relay";`,
		`GRANT SELECT, DELETE ON TABLE "events"."outbox" TO "app_relay";`,
		`GRANT USAGE ON SEQUENCE "relay"."retry_seq_seq" TO "app_relay";`,
		`SELECT pg_catalog.pg_create_logical_replication_slot('outbox_relay', 'pgoutput')`)
	if strings.Contains(out, "CREATE TABLE IF NOT EXISTS \"events\".\"outbox\"") || strings.Contains(out, "secret") {
		t.Errorf("PrintSQL without createOutbox printed the outbox table, or the password:\n%s", out)
	}

	b.Reset()
	if err := PrintSQL(cfg, "other", false, &b); err != nil || !strings.Contains(b.String(), `GRANT SELECT, INSERT, UPDATE ON TABLE "outbox_relay_checkpoint" TO "other";`) {
		t.Errorf("PrintSQL with role other = %v\n%s", err, b.String())
	}
}

// TestCheckWarnsSuperuser: a superuser works, and check says it need not.
func TestCheckWarnsSuperuser(t *testing.T) {
	pg, cfg := testDB(t)
	cfg.DSN = testenv.SuperuserDSN(t, pg.DSN)
	k := withKafka(t, &cfg)
	mustSetup(t, cfg, true, "Setup")
	failed, out := runCheck(t, cfg, k)
	if failed != 0 {
		t.Errorf("Check as a superuser = %d failed; want 0\n%s", failed, out)
	}
	testenv.WantLines(t, "check", out, "warn  role: postgres is a superuser: the relay does not need superuser", "setup --print-sql")
}
