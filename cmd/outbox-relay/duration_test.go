package main

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
)

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{
		"10s": 10 * time.Second, "250ms": 250 * time.Millisecond, "1m30s": 90 * time.Second, "720h": 30 * day,
		"7d": 7 * day, "30d": 30 * day, "1.5d": 36 * time.Hour, "2d12h": 60 * time.Hour, "0d": 0, "1d30m": day + 30*time.Minute,
		"-1d": -day, "0": 0,
	}
	for in, want := range good {
		if got, err := parseDuration(in); err != nil || got != want {
			t.Errorf("parseDuration(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "7", "7 d", "d7", "7dd", "1e3d", "+7d", "0x1d", "Infd", "NaNd", "7d-1h", "7d+1h", "7d3", "1.2.3d", "7days", "200000d"} {
		if got, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) = %s; want an error", in, got)
		} else if !strings.Contains(err.Error(), in) {
			t.Errorf("parseDuration(%q) error %q does not quote the input", in, err)
		}
	}
	if got, want := daysText(relay.DefaultHistoryKeep), "30d"; got != want {
		t.Errorf("daysText(%s) = %q; want %q", relay.DefaultHistoryKeep, got, want)
	}
	if got, want := daysText(36*time.Hour), "36h"; got != want {
		t.Errorf("daysText(36h) = %q; want %q", got, want)
	}
}

// TestRetentionConfig: the retention and history keys, their defaults, the
// day suffix, and their errors.
func TestRetentionConfig(t *testing.T) {
	cleanEnv(t)
	c, err := load(t, writeFile(t, "c.yaml", minimal))
	if err != nil {
		t.Fatal(err)
	}
	rc := c.relayConfig(slog.New(slog.DiscardHandler))
	if rc.Retention.Retention != 0 || rc.Retention.Interval != time.Minute || rc.Retention.BatchSize != 1000 ||
		rc.Retention.Pause != 100*time.Millisecond || rc.Retention.StatementTimeout != 5*time.Second ||
		rc.Retention.Partitions != retention.PartitionsDelete ||
		rc.HistoryInterval != time.Minute || rc.HistoryKeep != 30*day {
		t.Errorf("defaults: retention %+v, history every %s kept %s; want off, 1m, 1000, 100ms, 5s, delete, 1m, 30d",
			rc.Retention, rc.HistoryInterval, rc.HistoryKeep)
	}

	c, err = load(t, writeFile(t, "c.yaml", minimal+"outbox:\n  retention: 7d\n  retention_batch_size: 50\n  retention_partitions: Drop\ncheckpoint:\n  history_keep: 2d12h\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rc := c.relayConfig(slog.New(slog.DiscardHandler)); rc.Retention.Retention != 7*day || rc.Retention.BatchSize != 50 || rc.HistoryKeep != 60*time.Hour || rc.Retention.Partitions != retention.PartitionsDrop ||
		rc.Retention.Slot != "outbox_relay" || rc.Retention.Table != "public.outbox" {
		t.Errorf("retention 7d, batch 50, partitions Drop, history_keep 2d12h: got %+v, keep %s", rc.Retention, rc.HistoryKeep)
	}
	t.Setenv("RELAY_OUTBOX_RETENTION", "off")
	if c, err := load(t, writeFile(t, "c.yaml", minimal+"outbox:\n  retention: 7d\n")); err != nil || c.Retention.Retention != 0 {
		t.Errorf("RELAY_OUTBOX_RETENTION=off over a file's 7d: retention %v, %v; want off", c.Retention.Retention, err)
	}

	for _, tt := range []struct{ env, value, want string }{
		{"RELAY_OUTBOX_RETENTION", "a week", `outbox.retention: "a week" is not a duration; write it like 10s, 250ms, 1m30s, 12h or 7d`},
		{"RELAY_OUTBOX_RETENTION", "-1d", "outbox.retention: -24h0m0s is negative"},
		{"RELAY_OUTBOX_RETENTION_BATCH_SIZE", "1000000", "outbox.retention_batch_size: 1000000 is out of range; allowed 1 to 100000"},
		{"RELAY_OUTBOX_RETENTION_BATCH_SIZE", "-1", "outbox.retention_batch_size: -1 is negative"},
		{"RELAY_OUTBOX_RETENTION_PAUSE", "-1ms", "outbox.retention_pause: -1ms is negative"},
		{"RELAY_OUTBOX_RETENTION_STATEMENT_TIMEOUT", "5", `outbox.retention_statement_timeout: "5" is not a duration`},
		{"RELAY_OUTBOX_RETENTION_INTERVAL", "-1m", "outbox.retention_interval: -1m0s is negative"},
		{"RELAY_OUTBOX_RETENTION_PARTITIONS", "truncate", `outbox.retention_partitions: "truncate" is not one of delete (rows, the default), drop or detach`},
		{"RELAY_CHECKPOINT_HISTORY_KEEP", "30s", "checkpoint.history_keep: 30s is shorter than checkpoint.history_interval (1m0s)"},
		{"RELAY_CHECKPOINT_HISTORY_INTERVAL", "often", `checkpoint.history_interval: "often" is not a duration`},
	} {
		t.Run(tt.env+"="+tt.value, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv(tt.env, tt.value)
			if _, err := load(t, writeFile(t, "c.yaml", minimal)); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("loadConfig with %s=%s: %v; want an error containing %q", tt.env, tt.value, err, tt.want)
			}
		})
	}
}
