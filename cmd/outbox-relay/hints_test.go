package main

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// TestHints: the conditions the packages report without naming a command
// get the command line's fix, as the operator saw it before the packages
// stopped spelling commands.
func TestHints(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want []string
	}{
		{"slot missing", fmt.Errorf("start: %w", replication.ErrSlotMissing), []string{`"outbox-relay setup"`}},
		{"slot not found", fmt.Errorf("verify: %w", pgslot.ErrNotFound), []string{`"outbox-relay setup"`}},
		{"plugin", replication.ErrSlotPlugin, []string{`"outbox-relay setup"`, "postgres.slot"}},
		{"publication missing", replication.ErrPublicationMissing, []string{`"outbox-relay setup"`, `"outbox-relay check"`}},
		{"publication after the slot", replication.ErrPublicationAfterSlot, []string{"--start-lsn", "--force", `"outbox-relay check"`}},
		{"idempotence refused", sink.ErrIdempotenceNotAllowed, []string{"kafka.idempotence: false"}},
		{"start beyond the WAL", &relay.FutureStartError{Requested: 2, Current: 1}, []string{"--start-lsn", "--force"}},
		{"failover on Postgres 15", pgslot.FailoverUnsupported(150007), []string{"postgres.failover: false", "postgres.on_slot_loss: refill"}},
		{"outbox missing", fmt.Errorf("%w: public.outbox", relay.ErrOutboxMissing), []string{"setup --create-outbox-table", "outbox.table"}},
		{"no slot at wal_level replica", fmt.Errorf("%w: replication slot \"s\" does not exist, and no logical slot can be created while wal_level = replica", relay.ErrWALLevel),
			[]string{"wal_level = logical", "restart Postgres"}},
		{"slot recreated", &pgslot.GapError{Slot: "s", Cause: pgslot.CauseSlotAhead, From: 1, To: 2}, []string{`"outbox-relay recover"`, "postgres.on_slot_loss: refill", "--dry-run"}},
		{"slot lost", &pgslot.GapError{Slot: "s", Cause: pgslot.CauseSlotLost, From: 1}, []string{`"outbox-relay recover"`, "max_slot_wal_keep_size", "outbox-relay lag"}},
		{"another system", &pgslot.GapError{Slot: "s", Cause: pgslot.CauseOtherSystem, From: 1, LastCommitTime: time.Date(2026, 11, 24, 10, 30, 15, 0, time.UTC)},
			[]string{`"outbox-relay replay --from 2026-11-24T10:29:15Z"`, "postgres.dsn", "DELETE FROM <checkpoint.table>"}},
		{"SASL refused", &kafkaclient.AuthError{Field: "SASL.Password", Reason: "refused: set {SASL.Username} and {SASL.Password} to credentials the cluster knows"},
			[]string{"kafka.sasl.password: refused: set kafka.sasl.username and kafka.sasl.password"}},
		{"metrics port in use", fmt.Errorf("run: %w", &field.Error{Field: "MetricsListen", Reason: "metrics listen: listen tcp 127.0.0.1:9187: bind: address already in use"}),
			[]string{"metrics.listen", "--metrics-listen", "RELAY_METRICS_LISTEN"}},
		{"refill without history", &relay.RefillError{Gap: &pgslot.GapError{Cause: pgslot.CauseSlotMissing}, NoHistory: true, ReplayFrom: "2026-11-24T10:29:15Z"},
			[]string{`"outbox-relay replay --from 2026-11-24T10:29:15Z"`, `"outbox-relay setup"`, "checkpoint set", "--yes"}},
	}
	for _, tt := range tests {
		got := hint(tt.err)
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: hint(%v) = %q; want it to name %s", tt.name, tt.err, got, w)
			}
		}
	}
	if got := hint(&pgslot.GapError{Cause: pgslot.CauseSuperseded}); got != "" {
		t.Errorf("hint(superseded *GapError) = %q; want none (the fix is on the servers, and the gap says it)", got)
	}
}

// TestFieldErrorKeys: a package's *field.Error reaches the operator under the
// key of the field, and the fields it mentions by their keys.
func TestFieldErrorKeys(t *testing.T) {
	for field, key := range map[string]string{
		"Sink.BatchBytes": "kafka.batch_bytes", "Sink.TLS.CAFile": "kafka.tls.ca_file", "Replication.WalSenderTimeout": "postgres.wal_sender_timeout",
		"Router.Columns.Payload": "outbox.columns.payload", "Retention.BatchSize": "outbox.retention_batch_size", "Retry.BackoffMax": "retry.backoff_max",
		"HistoryKeep": "checkpoint.history_keep", "Sink.DisableIdempotence": "kafka.idempotence", "Table": "outbox.table",
	} {
		if got := keyOf(field); got != key {
			t.Errorf("keyOf(%q) = %q; want %q", field, got, key)
		}
	}
	fe := &field.Error{Field: "HistoryKeep", Reason: "1m is shorter than {HistoryInterval} (1h)"}
	if got, want := keyText(fe), "checkpoint.history_keep: 1m is shorter than checkpoint.history_interval (1h)"; got != want {
		t.Errorf("keyText(%v) = %q; want %q", fe, got, want)
	}
	// Every setting whose field lies in the relay's Config has its path.
	keys := map[string]bool{}
	for _, k := range fieldKeys() {
		keys[k] = true
	}
	var c config
	lo := reflect.ValueOf(&c.Config).Pointer()
	hi := lo + reflect.TypeOf(c.Config).Size()
	for _, s := range settings {
		if s.field == nil {
			continue
		}
		if p := reflect.ValueOf(s.field(&c)).Pointer(); p >= lo && p < hi && !keys[s.key] {
			t.Errorf("%s: its field is in relay.Config, but fieldKeys does not map it", s.key)
		}
	}
}

// TestIgnoredKeyWarns: kafka.batch_timeout is accepted, and the log says it
// is ignored.
func TestIgnoredKeyWarns(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_KAFKA_BATCH_TIMEOUT", "5ms")
	c, err := load(t, writeFile(t, "c.yaml", minimal))
	if err != nil {
		t.Fatalf("loadConfig with kafka.batch_timeout: %v; want it accepted", err)
	}
	var log bytes.Buffer
	l, _ := newLogger(&log, "info", "text")
	c.warnIgnored(l)
	if !strings.Contains(log.String(), "kafka.batch_timeout") || !strings.Contains(log.String(), "ignored") {
		t.Errorf("log = %q; want a warning naming kafka.batch_timeout as ignored", log.String())
	}
}

// TestLagMissingSlotHint: a slot that does not exist (and never delivered)
// is named by the library and fixed by setup, as the operator reads it.
func TestLagMissingSlotHint(t *testing.T) {
	_, slot := dbEnv(t)
	if code, _, stderr := run(t, "setup", "--create-outbox-table"); code != 0 {
		t.Fatalf("setup = %d: %s", code, stderr)
	}
	t.Setenv("RELAY_POSTGRES_SLOT", slot+"_missing")
	code, _, stderr := run(t, "lag")
	for _, want := range []string{slot + "_missing", "does not exist", `to fix: run "outbox-relay setup"`} {
		if code == 0 || !strings.Contains(stderr, want) {
			t.Errorf("lag with a missing slot = %d, stderr %q; want a failure naming %q", code, stderr, want)
		}
	}
}

// TestOperatorText: a package's *field.Error inside a run error reads with
// the key, wherever it is wrapped.
func TestOperatorText(t *testing.T) {
	fe := field.Within("Retention", field.Errorf("Retention", `set, but the outbox table has no "created_at" column: add it, or set {Retention} to "" (off)`))
	err := fmt.Errorf("start: %w", fe)
	want := `start: outbox.retention: set, but the outbox table has no "created_at" column: add it, or set outbox.retention to "" (off)`
	if got := operatorText(err); got != want {
		t.Errorf("operatorText(%v) = %q; want %q", err, got, want)
	}
}

// TestRunMetricsPortInUse: run on a set-up database whose metrics address
// another process holds exits 1 naming the key and the flag that chose it.
func TestRunMetricsPortInUse(t *testing.T) {
	dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	code, _, errOut := run(t, "run", "--metrics-listen", ln.Addr().String())
	if code != exitcode.Failure {
		t.Errorf("run with metrics.listen in use: exit = %d; want %d\n%s", code, exitcode.Failure, errOut)
	}
	for _, w := range []string{"outbox-relay: metrics.listen: ", "address already in use", "--metrics-listen"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("run with metrics.listen in use: stderr = %q; want it to contain %q", errOut, w)
		}
	}
}
