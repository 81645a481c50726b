package ops_test

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

func mustLSN(t *testing.T, s *string) pglogrepl.LSN {
	t.Helper()
	if s == nil {
		t.Fatal("LSN is null")
	}
	l, err := pglogrepl.ParseLSN(*s)
	if err != nil {
		t.Fatalf("ParseLSN(%q): %v", *s, err)
	}
	return l
}

// TestLagGrowsAndRecovers follows a slot that nobody consumes: lag grows as
// events are inserted, and returns to caught up once the slot is advanced and
// a checkpoint is saved, as a relay would.
func TestLagGrowsAndRecovers(t *testing.T) {
	f := newFixture(t)

	r := f.lag(t)
	if r.Slot.Active || r.Slot.ActivePID != nil {
		t.Errorf("Lag().Slot.Active = %v, pid %v; want inactive, no pid", r.Slot.Active, r.Slot.ActivePID)
	}
	if r.Checkpoint != nil {
		t.Errorf("Lag().Checkpoint = %+v; want nil before anything is saved", r.Checkpoint)
	}
	if r.TimeLag.State != ops.StateUnknown || r.TimeLag.Seconds != nil {
		t.Errorf("Lag().TimeLag = %+v; want unknown with null seconds for an empty outbox", r.TimeLag)
	}
	if r.Retry != nil {
		t.Errorf("Lag().Retry = %+v; want nil without a retry table", r.Retry)
	}
	if r.Slot.WALStatus == nil || *r.Slot.WALStatus != "reserved" {
		t.Errorf("Lag().Slot.WALStatus = %v; want reserved", r.Slot.WALStatus)
	}

	const age = 30 * time.Second
	f.insertEvents(t, 500, age)
	f.insertEvents(t, 500, age/2)
	r = f.lag(t)
	cur, err := pglogrepl.ParseLSN(r.CurrentWALLSN)
	if err != nil {
		t.Fatalf("ParseLSN(%q): %v", r.CurrentWALLSN, err)
	}
	if want := int64(cur - mustLSN(t, r.Slot.ConfirmedFlushLSN)); r.LagBytes == nil || *r.LagBytes != want {
		t.Errorf("Lag().LagBytes = %v; want current - confirmed_flush = %d", r.LagBytes, want)
	}
	// 1000 rows of >300 bytes are at least 300 kB of WAL.
	if *r.LagBytes < 300_000 {
		t.Errorf("Lag().LagBytes = %d after inserting 1000 events; want >= 300000", *r.LagBytes)
	}
	if r.RetainedWALBytes == nil || *r.RetainedWALBytes < *r.LagBytes {
		t.Errorf("Lag().RetainedWALBytes = %v; want >= lag %d", r.RetainedWALBytes, *r.LagBytes)
	}
	if r.TimeLag.State != ops.StateBehind || r.TimeLag.Seconds == nil {
		t.Fatalf("Lag().TimeLag = %+v; want behind", r.TimeLag)
	}
	if s := *r.TimeLag.Seconds; math.Abs(s-age.Seconds()) > 5 {
		t.Errorf("Lag().TimeLag.Seconds = %.1f; want ≈ %.0f (age of the oldest row)", s, age.Seconds())
	}
	lagBefore := *r.LagBytes

	// What a relay does after Kafka acknowledged everything: confirm the
	// position to the server and save its checkpoint with the commit time.
	var target string
	if err := f.conn.QueryRow(context.Background(), "SELECT end_lsn::text FROM pg_replication_slot_advance($1, pg_current_wal_lsn())", f.cfg.Slot).Scan(&target); err != nil {
		t.Fatalf("advance slot: %v", err)
	}
	f.exec(t, "INSERT INTO "+f.table("outbox_relay_checkpoint")+" (slot_name, lsn, last_commit_time, saved_at) VALUES ($1, $2::pg_lsn, now(), now())", f.cfg.Slot, target)

	r = f.lag(t)
	if got := *r.Slot.ConfirmedFlushLSN; got != target {
		t.Errorf("Lag().Slot.ConfirmedFlushLSN = %q; want the advanced %q", got, target)
	}
	if *r.LagBytes >= lagBefore {
		t.Errorf("Lag().LagBytes = %d after advancing; want < %d", *r.LagBytes, lagBefore)
	}
	if r.Checkpoint == nil || r.Checkpoint.LSN != target || r.Checkpoint.SavedAt == nil {
		t.Errorf("Lag().Checkpoint = %+v; want lsn %q with saved_at", r.Checkpoint, target)
	}
	if r.TimeLag.State != ops.StateCaughtUp || r.TimeLag.Seconds == nil || *r.TimeLag.Seconds != 0 {
		t.Errorf("Lag().TimeLag = %+v; want caught_up, 0 seconds", r.TimeLag)
	}
	if s := r.TimeLag.LastDeliveredAgeSeconds; s == nil || *s < 0 || *s > 5 {
		t.Errorf("Lag().TimeLag.LastDeliveredAgeSeconds = %v; want ≈ 0", s)
	}

	// An event committed after the checkpoint is behind again.
	time.Sleep(20 * time.Millisecond)
	f.insertEvents(t, 1, 0)
	if r = f.lag(t); r.TimeLag.State != ops.StateBehind {
		t.Errorf("Lag().TimeLag.State = %q after a new insert; want behind", r.TimeLag.State)
	}
}

func TestLagRetryTable(t *testing.T) {
	f := newFixture(t)
	f.createRetryTable(t)
	r := f.lag(t)
	if r.Retry == nil || r.Retry.Pending != 0 || r.Retry.Dead != 0 || r.Retry.OldestPendingAgeSeconds != nil {
		t.Errorf("Lag().Retry = %+v; want 0 pending, 0 dead, null age for an empty retry table", r.Retry)
	}
	f.insertRetry(t, "pending", 60*time.Second)
	f.insertRetry(t, "pending", 10*time.Second)
	f.insertRetry(t, "dead", time.Hour)
	// Another relay's rows (another slot sharing the table) are its own.
	f.insertRetryOf(t, "other_slot", "pending", 2*time.Hour)
	f.insertRetryOf(t, "other_slot", "dead", time.Hour)
	r = f.lag(t)
	if r.Retry == nil || r.Retry.Pending != 2 || r.Retry.Dead != 1 {
		t.Fatalf("Lag().Retry = %+v; want 2 pending, 1 dead (the slot's own, not another slot's)", r.Retry)
	}
	if s := r.Retry.OldestPendingAgeSeconds; s == nil || math.Abs(*s-60) > 5 {
		t.Errorf("Lag().Retry.OldestPendingAgeSeconds = %v; want ≈ 60", s)
	}
}

func TestLagMissingSlot(t *testing.T) {
	f := newFixture(t)
	cfg := f.cfg
	cfg.Slot = f.cfg.Slot + "_missing"
	_, err := ops.Lag(context.Background(), f.conn, cfg)
	if !errors.Is(err, pgslot.ErrNotFound) {
		t.Fatalf("Lag(missing slot) error = %v; want pgslot.ErrNotFound", err)
	}
	// The slot is named here; the fix (setup) is the command line's hint,
	// TestLagMissingSlotHint in cmd/outbox-relay.
	if !strings.Contains(err.Error(), cfg.Slot) {
		t.Errorf("Lag(missing slot) error = %q; want it to name %q", err, cfg.Slot)
	}
	if _, err := ops.Status(context.Background(), f.conn, cfg); !errors.Is(err, pgslot.ErrNotFound) {
		t.Errorf("Status(missing slot) error = %v; want pgslot.ErrNotFound", err)
	}
}

func TestLagMissingOutboxTable(t *testing.T) {
	f := newFixture(t)
	cfg := f.cfg
	cfg.Table = f.schema + ".nope"
	if _, err := ops.Lag(context.Background(), f.conn, cfg); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("Lag(missing outbox table) error = %v; want one naming the table", err)
	}
}

// TestLagMessagesWithoutArchive: a relay that reads logical decoding
// messages may keep no archive table; its time lag is then unknown.
func TestLagMessagesWithoutArchive(t *testing.T) {
	f := newFixture(t)
	cfg := f.cfg
	cfg.Table, cfg.TableOptional = f.schema+".nope", true
	r, err := ops.Lag(context.Background(), f.conn, cfg)
	if err != nil || r.TimeLag.State != ops.StateUnknown {
		t.Fatalf("Lag(messages, no archive) = %+v, %v; want the time lag unknown", r, err)
	}
}

// TestLagSeveralTables gives each table of outbox.tables its time lag.
func TestLagSeveralTables(t *testing.T) {
	f := newFixture(t)
	cfg := f.cfg
	cfg.Tables = []string{cfg.Table}
	r, err := ops.Lag(context.Background(), f.conn, cfg)
	if err != nil || len(r.Tables) != 1 || r.Tables[0].Table != cfg.Table || r.Tables[0].TimeLag.State != r.TimeLag.State {
		t.Fatalf("Lag(two tables) = %+v, %v; want the second table's time lag beside the first's", r, err)
	}
	var out strings.Builder
	if err := ops.RunLag(context.Background(), f.conn, cfg, &out, ops.LagOptions{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "time lag "+cfg.Table) {
		t.Errorf("lag output lacks the line of the second table:\n%s", out.String())
	}
}

// TestRunLagThresholds checks the exit codes that cron jobs and probes rely on.
func TestRunLagThresholds(t *testing.T) {
	f := newFixture(t)
	f.insertEvents(t, 200, 20*time.Second)
	tests := []struct {
		name string
		th   ops.Thresholds
		want int
	}{
		{"none", ops.Thresholds{}, exitcode.OK},
		{"bytes under", ops.Thresholds{MaxBytes: 1 << 40}, exitcode.OK},
		{"bytes over", ops.Thresholds{MaxBytes: 1}, exitcode.Threshold},
		{"seconds under", ops.Thresholds{MaxSeconds: 3600}, exitcode.OK},
		{"seconds over", ops.Thresholds{MaxSeconds: 10}, exitcode.Threshold},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			err := ops.RunLag(context.Background(), f.conn, f.cfg, &out, ops.LagOptions{Thresholds: tt.th})
			if got := exitcode.Of(err); got != tt.want {
				t.Errorf("exitcode.Of(RunLag(%+v)) = %d (%v); want %d", tt.th, got, err, tt.want)
			}
			if !strings.Contains(out.String(), f.cfg.Slot) {
				t.Errorf("RunLag(%+v) printed %q; want the report", tt.th, out.String())
			}
		})
	}
	cfg := f.cfg
	cfg.Slot += "_missing"
	if got := exitcode.Of(ops.RunLag(context.Background(), f.conn, cfg, new(strings.Builder), ops.LagOptions{})); got != exitcode.Failure {
		t.Errorf("exitcode.Of(RunLag(missing slot)) = %d; want %d", got, exitcode.Failure)
	}
}

func TestRunLagWatch(t *testing.T) {
	f := newFixture(t)
	// WAL after the slot's position, so that max-bytes 1 is exceeded: a fresh
	// database may have written none.
	f.insertEvents(t, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Millisecond)
	defer cancel()
	var out strings.Builder
	if err := ops.RunLag(ctx, f.conn, f.cfg, &out, ops.LagOptions{JSON: true, Watch: 100 * time.Millisecond, Thresholds: ops.Thresholds{MaxBytes: 1}}); err != nil {
		t.Fatalf("RunLag(watch) = %v; want nil when ctx is done", err)
	}
	if n := strings.Count(out.String(), `"slot_name"`); n < 2 {
		t.Errorf("RunLag(watch) drew %d reports in 350ms at 100ms; want >= 2:\n%s", n, out.String())
	}

	// In text, an exceeded threshold is shown in each redraw.
	ctx, cancel = context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	out.Reset()
	if err := ops.RunLag(ctx, f.conn, f.cfg, &out, ops.LagOptions{Watch: 100 * time.Millisecond, Thresholds: ops.Thresholds{MaxBytes: 1}}); err != nil {
		t.Fatalf("RunLag(watch, text) = %v; want nil when ctx is done", err)
	}
	if !strings.Contains(out.String(), "THRESHOLD EXCEEDED: lag_bytes") {
		t.Errorf("RunLag(watch, text, max-bytes 1) printed %q; want a THRESHOLD EXCEEDED line", out.String())
	}
}
