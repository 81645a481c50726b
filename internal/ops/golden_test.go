package ops_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it after review)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// volatile names the JSON fields whose values change from run to run, with
// the placeholder that replaces a non-null value. Null stays null, so the
// golden file still pins which fields are present and which are absent.
var volatile = map[string]string{
	"slot_name": "<slot>", "checked_at": "<time>", "active_pid": "<pid>", "client_addr": "<addr>",
	"backend_start": "<time>", "confirmed_flush_lsn": "<lsn>", "restart_lsn": "<lsn>",
	"current_wal_lsn": "<lsn>", "lsn": "<lsn>", "saved_at": "<time>", "last_commit_time": "<time>",
	"oldest_undelivered_at": "<time>", "lag_bytes": "<bytes>", "behind_bytes": "<bytes>", "retained_wal_bytes": "<bytes>",
	"safe_wal_size_bytes": "<bytes>", "seconds": "<seconds>", "last_delivered_age_seconds": "<seconds>",
	"oldest_pending_age_seconds": "<seconds>",
	// The dev servers set max_slot_wal_keep_size (scripts/dev.sh: what check
	// recommends), so the files show it, and safe_wal_size, as bytes.
	"max_slot_wal_keep_size": "<setting>", "max_slot_wal_keep_size_bytes": "<bytes>",
	"resume_lsn": "<lsn>", "snapshot_lsn": "<lsn>", "snapshot_xmin": "<xid>",
	"retention_horizon_missing": "<reason>", "table": "<table>",
}

func normalise(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if p, ok := volatile[k]; ok && x != nil {
				if _, isObj := x.(map[string]any); !isObj {
					v[k] = p
					continue
				}
			}
			v[k] = normalise(x)
		}
	case []any:
		for i := range v {
			v[i] = normalise(v[i])
		}
	}
	return v
}

// normalisedJSON renders r with ops.WriteJSON, as `--json` does, and replaces
// volatile values.
func normalisedJSON(t *testing.T, r any) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := ops.WriteJSON(&buf, r); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	if n := bytes.Count(buf.Bytes(), []byte("\n")); n != 1 {
		t.Errorf("WriteJSON wrote %d lines; want 1 (one object per line in --watch)", n)
	}
	var v any
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatalf("WriteJSON wrote invalid JSON: %v", err)
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(normalise(v)); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestLagJSONGolden(t *testing.T) {
	f := newFixture(t)
	f.createRetryTable(t)
	f.insertRetry(t, "pending", 0)
	f.insertRetry(t, "dead", 0)
	f.exec(t, "INSERT INTO "+f.table("outbox_relay_checkpoint")+" (slot_name, lsn, last_commit_time) VALUES ($1, pg_current_wal_lsn(), now() - interval '1 minute')", f.cfg.Slot)
	f.insertEvents(t, 10, 10*time.Second)
	golden(t, "lag_behind.json", normalisedJSON(t, f.lag(t)))

	g := newFixture(t) // nothing saved, no retry table, empty outbox
	golden(t, "lag_fresh.json", normalisedJSON(t, g.lag(t)))
}

func TestStatusJSONGolden(t *testing.T) {
	f := newFixture(t)
	r, err := ops.Status(context.Background(), f.conn, f.cfg)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	golden(t, "status_stopped.json", normalisedJSON(t, r))

	f.exec(t, "INSERT INTO "+f.table("outbox_relay_checkpoint")+" (slot_name, lsn, last_commit_time) VALUES ($1, pg_current_wal_lsn(), now())", f.cfg.Slot)
	stop := startStreaming(t, f, "outbox-relay/0.9.0")
	defer stop()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r, err = ops.Status(context.Background(), f.conn, f.cfg); err != nil || r.Streaming {
			break
		}
	}
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	// The walsender state moves from "startup" to "catchup" to "streaming" on its own time.
	r.Slot.WalsenderState = nil
	golden(t, "status_streaming.json", normalisedJSON(t, r))
}

type textWriter interface{ WriteText(io.Writer) error }

// Fixed reports for the human-readable output, which has no volatile parts
// when the input is fixed.
func ptr[T any](v T) *T { return &v }

var (
	now        = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	activeSlot = ops.Slot{
		Active: true, ActivePID: ptr(int32(4242)), ApplicationName: ptr("outbox-relay/1.4.0"),
		ClientAddr: ptr("10.0.0.7"), BackendStart: ptr(now.Add(-90 * time.Minute)), WalsenderState: ptr("streaming"),
		ConfirmedFlushLSN: ptr("0/5000000"), RestartLSN: ptr("0/4F00000"), WALStatus: ptr("reserved"),
	}
	idleSlot = ops.Slot{
		ConfirmedFlushLSN: ptr("0/5000000"), RestartLSN: ptr("0/1000000"), WALStatus: ptr("unreserved"),
		SafeWALSizeBytes: ptr(int64(-3 << 20)),
	}
	lostSlot   = ops.Slot{ConfirmedFlushLSN: ptr("0/5000000"), WALStatus: ptr("lost")}
	checkpoint = &ops.Checkpoint{LSN: "0/5000000", SavedAt: ptr(now.Add(-1500 * time.Millisecond)), LastCommitTime: ptr(now.Add(-2 * time.Second))}
)

func TestTextGolden(t *testing.T) {
	reports := []struct {
		file string
		r    textWriter
	}{
		{"lag_behind.txt", &ops.LagReport{
			SlotName: "outbox_relay", CheckedAt: now, Slot: activeSlot, CurrentWALLSN: "0/6000000",
			LagBytes: ptr(int64(16 << 20)), RetainedWALBytes: ptr(int64(17 << 20)), Checkpoint: checkpoint, MaxSlotWALKeepSize: "-1",
			TimeLag: ops.TimeLag{State: ops.StateBehind, OldestUndeliveredAt: ptr(now.Add(-12500 * time.Millisecond)),
				Seconds: ptr(12.5), LastDeliveredAgeSeconds: ptr(2.0)},
			Retry: &ops.Retry{Pending: 3, Dead: 1, OldestPendingAgeSeconds: ptr(330.0)},
		}},
		{"lag_at_risk.txt", &ops.LagReport{
			SlotName: "outbox_relay", CheckedAt: now, Slot: idleSlot, CurrentWALLSN: "0/40000000",
			LagBytes: ptr(int64(0x3B000000)), RetainedWALBytes: ptr(int64(0x3F000000)),
			TimeLag:            ops.TimeLag{State: ops.StateUnknown},
			MaxSlotWALKeepSize: "1GB", MaxSlotWALKeepSizeBytes: ptr(int64(1 << 30)),
		}},
		{"lag_lost.txt", &ops.LagReport{
			SlotName: "outbox_relay", CheckedAt: now, Slot: lostSlot, CurrentWALLSN: "0/40000000",
			LagBytes: ptr(int64(0x3B000000)), Checkpoint: checkpoint,
			TimeLag:            ops.TimeLag{State: ops.StateBehind, Seconds: ptr(75.0), OldestUndeliveredAt: ptr(now.Add(-75 * time.Second)), LastDeliveredAgeSeconds: ptr(2.0)},
			MaxSlotWALKeepSize: "1MB", MaxSlotWALKeepSizeBytes: ptr(int64(1 << 20)),
		}},
		{"lag_caught_up.txt", &ops.LagReport{
			SlotName: "outbox_relay", CheckedAt: now, Slot: activeSlot, CurrentWALLSN: "0/5000100",
			LagBytes: ptr(int64(256)), RetainedWALBytes: ptr(int64(1 << 20)), Checkpoint: checkpoint, MaxSlotWALKeepSize: "-1",
			TimeLag: ops.TimeLag{State: ops.StateCaughtUp, Seconds: ptr(0.0), LastDeliveredAgeSeconds: ptr(3600.0)},
			Retry:   &ops.Retry{},
		}},
		{"status_streaming.txt", &ops.StatusReport{SlotName: "outbox_relay", CheckedAt: now, Streaming: true,
			Version: ptr("1.4.0"), Slot: activeSlot, Checkpoint: checkpoint}},
		{"status_stopped.txt", &ops.StatusReport{SlotName: "outbox_relay", CheckedAt: now, Slot: idleSlot}},
	}
	for _, tt := range reports {
		t.Run(tt.file, func(t *testing.T) {
			var b strings.Builder
			if err := tt.r.WriteText(&b); err != nil {
				t.Fatalf("WriteText: %v", err)
			}
			golden(t, tt.file, []byte(b.String()))
		})
	}
}
