package metrics

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

func TestSampler(t *testing.T) {
	// The DSN first: testenv.Postgres may wait for a fault test of another package,
	// which must not use up the test's own time.
	dsn := testenv.Postgres(t).DSN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatalf("pgxpool.New: %v", err)
	}
	defer pool.Close()
	id := testenv.UniqueName(t, "h5metrics")
	exec := func(stmt string) {
		t.Helper()
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatalf("exec %q: %v", stmt, err)
		}
	}
	t.Cleanup(func() {
		ctx := context.Background()
		pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", id)
		pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+sql.Ident(id)+" CASCADE")
	})
	exec("CREATE SCHEMA " + sql.Ident(id))
	exec(sql.CreateSlot(id))

	m := New()
	retryTable := id + ".outbox_relay_retry"
	s, err := NewSampler(m, pool, SamplerConfig{Slot: id, RetryTable: retryTable, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewSampler: %v", err)
	}
	if err := s.Sample(ctx); err != nil {
		t.Fatalf("Sample: %v", err)
	}
	_, body := get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_slot_active 0\n", "outbox_relay_slot_lag_bytes ", "outbox_relay_slot_retained_wal_bytes ",
		// A fresh slot's WAL is reserved; every other status is exported as 0.
		`outbox_relay_slot_wal_status{status="reserved"} 1` + "\n", `outbox_relay_slot_wal_status{status="lost"} 0` + "\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("after Sample, /metrics lacks %q", want)
		}
	}
	// The sampled gauges, not the worker's counters (retry_attempts_total, ...).
	for _, gauge := range []string{"outbox_relay_retry_pending_events", "outbox_relay_retry_dead_events", "outbox_relay_retry_oldest_pending_age_seconds"} {
		if strings.Contains(body, gauge+" ") {
			t.Errorf("after Sample without a retry table, /metrics has %s; want it absent", gauge)
		}
	}

	// WAL written after the slot was created is lag.
	exec("CREATE TABLE " + sql.Ident(id) + ".filler AS SELECT i, repeat('x', 500) AS pad FROM generate_series(1, 2000) i")
	for _, stmt := range sql.RetryTable(sql.Table{Schema: id, Name: "outbox_relay_retry"}) {
		exec(stmt)
	}
	// The slot's rows, and one of another slot sharing the table: not counted.
	exec("INSERT INTO " + sql.Ident(id) + `.outbox_relay_retry (event_key, aggregate, status, next_attempt_at, first_failed_at, slot_name)
		VALUES ('a', 'x/1', 'dead', now(), now(), '` + id + `'), ('b', 'x/2', 'pending', now(), now() - interval '2 minutes', '` + id + `'),
		('c', 'y/1', 'dead', now(), now(), 'other_slot')`)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	// Wait until Run has sampled the retry table written above (the assertions below
	// say what is missing if it never does).
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, body := get(t, m.Handler(nil), "/metrics"); strings.Contains(body, "outbox_relay_retry_dead_events 1\n") {
			break
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run after cancel = %v; want nil", err)
	}
	var lag float64
	for _, mf := range must(m.Registry().Gather()) {
		if mf.GetName() == "outbox_relay_slot_lag_bytes" {
			lag = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	if lag < 1_000_000 {
		t.Errorf("outbox_relay_slot_lag_bytes = %g after writing 1 MB of WAL; want >= 1e6", lag)
	}
	_, body = get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_retry_pending_events 1\n", "outbox_relay_retry_dead_events 1\n", "outbox_relay_retry_oldest_pending_age_seconds 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("after Run, /metrics lacks %q", want)
		}
	}

	// A slot that disappears removes the slot gauges and counts the error.
	exec("SELECT pg_drop_replication_slot('" + id + "')")
	if err := s.Sample(ctx); !errors.Is(err, pgslot.ErrNotFound) {
		t.Errorf("Sample(dropped slot) = %v; want the slot-not-found error", err)
	}
	_, body = get(t, m.Handler(nil), "/metrics")
	if strings.Contains(body, "outbox_relay_slot_wal_status") {
		t.Errorf("after a failed sample, /metrics still has outbox_relay_slot_wal_status; want it absent")
	}
	if strings.Contains(body, "outbox_relay_slot_lag_bytes") || !strings.Contains(body, "outbox_relay_sample_errors_total 1\n") {
		t.Errorf("after a failed sample, /metrics = slot gauges present %v, errors line present %v; want absent, 1",
			strings.Contains(body, "outbox_relay_slot_lag_bytes"), strings.Contains(body, "outbox_relay_sample_errors_total 1\n"))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
