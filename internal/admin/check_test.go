package admin

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestEOSNote: check says what exactly-once delivery gets from the WAL
// buffer only when both are on.
func TestEOSNote(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		marks bool
	}{
		{"at least once", Config{MaxRetainedWAL: 1 << 30}, false},
		{"exactly once, bound off", Config{ExactlyOnce: true}, false},
		{"exactly once with the bound", Config{ExactlyOnce: true, MaxRetainedWAL: 1 << 30}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := eosNote(&tt.cfg)
			if marks := strings.Contains(got, "at least once, marked outbox-relay-delivery: at-least-once"); marks != tt.marks {
				t.Errorf("eosNote(%+v) = %q; want the at-least-once note: %v", tt.cfg, got, tt.marks)
			}
		})
	}
}

func TestCheckGood(t *testing.T) {
	_, cfg := testDB(t)
	k := withKafka(t, &cfg)
	mustSetup(t, cfg, true, "Setup")
	failed, out := runCheck(t, cfg, k)
	if failed != 0 {
		t.Fatalf("Check on a set-up database = %d failed; want 0\noutput:\n%s", failed, out)
	}
	testenv.WantLines(t, "check", out,
		"ok    postgres: connected to ",
		"ok    wal_level: logical",
		"ok    max_replication_slots: ",
		"ok    max_wal_senders: ",
		"  role: ", // ok with REPLICATION (the dev servers' relay role), warn for a superuser
		"info  TLS: ",
		"ok    replication connection: system ",
		"ok    outbox table: public.outbox has the mapped columns with usable types",
		"ok    publication: outbox_relay covers public.outbox and publishes inserts",
		"ok    slot: "+cfg.Slot+" uses pgoutput, confirmed up to ",
		"; inactive",
		"ok    checkpoint table: outbox_relay_checkpoint exists; nothing saved yet for "+cfg.Slot,
		"ok    checkpoint history: outbox_relay_checkpoint_history exists; no rows yet for "+cfg.Slot,
		"ok    retry table: outbox_relay_retry exists",
		"ok    replay table: outbox_relay_replay exists",
		"ok    privileges: ",
		"ok    retention: off (outbox.retention)",
		"ok    kafka: ",
		"ok    kafka idempotence: ")
	if strings.Contains(out, "FAIL") {
		t.Errorf("check printed a FAIL:\n%s", out)
	}
}

// TestCheckBroken: what Check finds in a database set up wrong. The cases
// whose lines name a setting through the CLI's words (outbox.retention*,
// rendered by Config.Text) stay in cmd/outbox-relay's TestCheckBroken.
func TestCheckBroken(t *testing.T) {
	tests := []struct {
		name      string
		setup     []string // run in the fresh database
		noHeaders bool     // outbox.columns.headers: "-"
		brokers   []string // nil: the test Kafka's
		want      []string
	}{
		{
			name: "empty database",
			want: []string{
				"ok    wal_level: logical",
				"FAIL  outbox table: public.outbox does not exist; run `outbox-relay setup --create-outbox-table`",
				"FAIL  publication: outbox_relay does not exist; run `outbox-relay setup`",
				"FAIL  slot: %SLOT% does not exist; run `outbox-relay setup`",
				"FAIL  checkpoint table: outbox_relay_checkpoint does not exist; run `outbox-relay setup`",
				"FAIL  checkpoint history: outbox_relay_checkpoint_history does not exist; run `outbox-relay setup`",
			},
		},
		{
			name: "wrong column types and publication",
			setup: []string{
				`CREATE TABLE outbox (id uuid, aggregate_type int, aggregate_id text, event_type text, payload int, created_at timestamptz)`,
				`CREATE TABLE other (id int)`,
				`CREATE PUBLICATION outbox_relay FOR TABLE other WITH (publish = 'update')`,
			},
			want: []string{
				`FAIL  outbox table: public.outbox: column "aggregate_type" is integer, want one of text, character varying, character; column "payload" is integer, want one of jsonb, json, text, bytea; no column "headers" (outbox.columns.headers); map them: set outbox.columns.headers: "-" (no headers column)`,
				`FAIL  publication: outbox_relay does not cover public.outbox (it covers public.other); ALTER PUBLICATION "outbox_relay" ADD TABLE "public"."outbox"`,
			},
		},
		{
			name: "publication without inserts",
			setup: []string{
				`CREATE TABLE outbox (id text, aggregate_type varchar(100), aggregate_id bigint, event_type text, payload bytea)`,
				`CREATE PUBLICATION outbox_relay FOR TABLE outbox WITH (publish = 'delete')`,
			},
			noHeaders: true,
			want: []string{
				"ok    outbox table: public.outbox has the mapped columns with usable types",
				`FAIL  publication: outbox_relay does not publish inserts; ALTER PUBLICATION "outbox_relay" SET (publish = 'insert')`,
			},
		},
		{
			name:    "kafka unreachable",
			brokers: []string{"127.0.0.1:9"},
			want:    []string{"FAIL  kafka: ping kafka 127.0.0.1:9"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pg, cfg := testDB(t)
			var k Kafka
			if tt.brokers == nil {
				k = withKafka(t, &cfg)
			} else {
				k = kafkaAt(t, &cfg, tt.brokers...)
			}
			if tt.noHeaders {
				cfg.Columns.Headers = sql.NoHeaders
				cfg.Router.Columns.Headers = sql.NoHeaders
			}
			for _, s := range tt.setup {
				pg.Exec(t, s)
			}
			failed, out := runCheck(t, cfg, k)
			if failed == 0 {
				t.Errorf("Check = 0 failed; want failures\n%s", out)
			}
			for _, w := range tt.want {
				testenv.WantLines(t, "check", out, strings.ReplaceAll(w, "%SLOT%", cfg.Slot))
			}
		})
	}
}
