package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestCheckBroken: check exits 1 on a failed check, and a line about a
// setting names its key (the error's text through operatorText). What Check
// finds in other broken databases: internal/admin's TestCheckBroken.
func TestCheckBroken(t *testing.T) {
	tests := []struct {
		name  string
		setup []string // run in the fresh database
		env   map[string]string
		want  []string
	}{
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dsn, slot := dbEnv(t)
			t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			testenv.ExecAs(t, dsn, tt.setup...)
			code, out, _ := run(t, "check")
			if code != exitcode.Failure {
				t.Errorf("check exit = %d; want %d", code, exitcode.Failure)
			}
			for _, w := range tt.want {
				testenv.WantLines(t, "check", out, strings.ReplaceAll(w, "%SLOT%", slot))
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
	testenv.WantLines(t, "check", out, "FAIL  postgres: connect to postgres postgres://relay:xxxxx@127.0.0.1:9/app", "FAIL  kafka: ")
	if strings.Contains(out+errOut, "hunter2") {
		t.Errorf("check output contains the password:\n%s%s", out, errOut)
	}
}
