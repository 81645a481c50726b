package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

func TestCheckGood(t *testing.T) {
	_, slot := dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := run(t, "check")
	if code != exitcode.OK {
		t.Fatalf("check on a set-up database: exit = %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	wantLines(t, "check", out,
		"ok    postgres: connected to ",
		"ok    wal_level: logical",
		"ok    max_replication_slots: ",
		"ok    max_wal_senders: ",
		"  role: ", // ok with REPLICATION (the dev servers' relay role), warn for a superuser
		"info  TLS: ",
		"ok    replication connection: system ",
		"ok    outbox table: public.outbox has the mapped columns with usable types",
		"ok    publication: outbox_relay covers public.outbox and publishes inserts",
		"ok    slot: "+slot+" uses pgoutput, confirmed up to ",
		"; inactive",
		"ok    checkpoint table: outbox_relay_checkpoint exists; nothing saved yet for "+slot,
		"ok    checkpoint history: outbox_relay_checkpoint_history exists; no rows yet for "+slot,
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

func TestCheckBroken(t *testing.T) {
	tests := []struct {
		name  string
		setup []string // run in the fresh database
		env   map[string]string
		want  []string
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
			name: "retention without created_at",
			setup: []string{
				`CREATE TABLE outbox (id uuid, aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb)`,
			},
			env: map[string]string{"RELAY_OUTBOX_RETENTION": "7d"},
			want: []string{
				"ok    outbox table: public.outbox has the mapped columns with usable types",
				`FAIL  retention: outbox.retention: set, but the outbox table public.outbox has no "created_at" column`,
			},
		},
		{
			name: "partition drop on an outbox that is not partitioned",
			setup: []string{
				`CREATE TABLE outbox (id uuid, aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb, created_at timestamptz)`,
			},
			env: map[string]string{"RELAY_OUTBOX_RETENTION": "7d", "RELAY_OUTBOX_RETENTION_PARTITIONS": "drop"},
			want: []string{
				`FAIL  retention: outbox.retention_partitions: drop, but the outbox table public.outbox is not partitioned: set outbox.retention_partitions to delete (rows)`,
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
			env: map[string]string{"RELAY_OUTBOX_COLUMNS_HEADERS": "-"},
			want: []string{
				"ok    outbox table: public.outbox has the mapped columns with usable types",
				`FAIL  publication: outbox_relay does not publish inserts; ALTER PUBLICATION "outbox_relay" SET (publish = 'insert')`,
			},
		},
		{
			name: "kafka unreachable",
			env:  map[string]string{"RELAY_KAFKA_BROKERS": "127.0.0.1:9"},
			want: []string{"FAIL  kafka: ping kafka 127.0.0.1:9"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn, slot := dbEnv(t)
			t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			execSQL(t, dsn, tt.setup...)
			code, out, _ := run(t, "check")
			if code != exitcode.Failure {
				t.Errorf("check exit = %d; want %d", code, exitcode.Failure)
			}
			for _, w := range tt.want {
				wantLines(t, "check", out, strings.ReplaceAll(w, "%SLOT%", slot))
			}
		})
	}
}

func TestCheckUnreachablePostgres(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay:hunter2@127.0.0.1:9/app?connect_timeout=5")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9")
	code, out, errOut := run(t, "check")
	if code != exitcode.Failure {
		t.Errorf("check exit = %d; want %d", code, exitcode.Failure)
	}
	wantLines(t, "check", out, "FAIL  postgres: connect to postgres postgres://relay:xxxxx@127.0.0.1:9/app", "FAIL  kafka: ")
	if strings.Contains(out+errOut, "hunter2") {
		t.Errorf("check output contains the password:\n%s%s", out, errOut)
	}
}
