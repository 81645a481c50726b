package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// startStreaming holds the fixture's slot with a replication connection named
// like a relay, and returns a func that lets go of it.
func startStreaming(t *testing.T, f *fixture, applicationName string) func() {
	t.Helper()
	return testenv.HoldSlot(t, f.dsn, f.cfg.Slot, f.schema, applicationName)
}

func TestStatus(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()

	r, err := ops.Status(ctx, f.conn, f.cfg)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if r.Streaming || r.Version != nil || r.Checkpoint != nil {
		t.Errorf("Status() = streaming %v, version %v, checkpoint %+v; want not streaming, no version, no checkpoint", r.Streaming, r.Version, r.Checkpoint)
	}

	f.exec(t, "INSERT INTO "+f.table("outbox_relay_checkpoint")+" (slot_name, lsn, last_commit_time) VALUES ($1, '0/1234', now())", f.cfg.Slot)
	stop := startStreaming(t, f, "outbox-relay/1.2.3-test")
	defer stop()
	// The walsender marks the slot active as it starts decoding.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r, err = ops.Status(ctx, f.conn, f.cfg); err != nil {
			t.Fatalf("Status: %v", err)
		}
		if r.Streaming || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !r.Streaming || !r.Slot.Active || r.Slot.ActivePID == nil {
		t.Fatalf("Status() = streaming %v, active %v, pid %v; want streaming with a pid", r.Streaming, r.Slot.Active, r.Slot.ActivePID)
	}
	if r.Version == nil || *r.Version != "1.2.3-test" {
		t.Errorf("Status().Version = %v; want 1.2.3-test", r.Version)
	}
	if r.Slot.BackendStart == nil || r.CheckedAt.Sub(*r.Slot.BackendStart) > time.Minute || r.CheckedAt.Before(*r.Slot.BackendStart) {
		t.Errorf("Status().Slot.BackendStart = %v; want just before %v", r.Slot.BackendStart, r.CheckedAt)
	}
	if r.Checkpoint == nil || r.Checkpoint.LSN != "0/1234" || r.Checkpoint.SavedAt == nil {
		t.Errorf("Status().Checkpoint = %+v; want lsn 0/1234 with saved_at", r.Checkpoint)
	}
	l := f.lag(t)
	if !l.Slot.Active || l.Slot.ApplicationName == nil || *l.Slot.ApplicationName != "outbox-relay/1.2.3-test" {
		t.Errorf("Lag().Slot = active %v, application_name %v; want active, outbox-relay/1.2.3-test", l.Slot.Active, l.Slot.ApplicationName)
	}
}

func TestVersion(t *testing.T) {
	tests := []struct{ name, want string }{
		{"outbox-relay/1.4.0", "1.4.0"},
		{"outbox-relay/v0.1.0-dirty", "v0.1.0-dirty"},
		{"outbox-relay", ""},
		{"outbox-relay/", ""},
		{"pg_recvlogical", ""},
	}
	for _, tt := range tests {
		got := ""
		if v := ops.Version(tt.name); v != nil {
			got = *v
		}
		if got != tt.want {
			t.Errorf("Version(%q) = %q; want %q", tt.name, got, tt.want)
		}
	}
}
