package main

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/replay"
)

func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Time
	}{
		{"24h", now.Add(-24 * time.Hour)},
		{"7d", now.Add(-7 * 24 * time.Hour)},
		{"2026-11-21T09:00:00Z", time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)},
		{"2026-11-21T09:00:00+02:00", time.Date(2026, 11, 21, 7, 0, 0, 0, time.UTC)},
		{"2026-11-21 09:00:00", time.Date(2026, 11, 21, 9, 0, 0, 0, time.UTC)},
		{"2026-11-21", time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)},
	}
	for _, tt := range tests {
		if got, err := parseWhen(tt.in, now); err != nil || !got.Equal(tt.want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"yesterday", "-5m", "0s", "2026-13-01"} {
		if _, err := parseWhen(bad, now); err == nil {
			t.Errorf("parseWhen(%q) = nil error", bad)
		}
	}
}

// Usage errors exit 2 before anything connects.
func TestReplayUsage(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@127.0.0.1:9/none")
	for _, args := range [][]string{
		{"replay", "--from", "24h", "--from-lsn", "0/1"},
		{"replay", "--from", "soon", "--dry-run"},
		{"replay", "--from-lsn", "1/2/3", "--dry-run"},
		{"replay", "--rate", "-1", "--dry-run"},
		{"replay"}, // no kafka.brokers and not a dry run
	} {
		code, _, errOut := run(t, args...)
		if code != exitcode.Usage || !strings.Contains(errOut, "outbox-relay:") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 with the reason", args, code, errOut)
		}
	}
}

// TestReplayProgressOnce: off a terminal, the last page's progress line is
// not logged a second time when the run is done (it was, with the same
// figures).
func TestReplayProgressOnce(t *testing.T) {
	var buf bytes.Buffer
	p := newProgressWriter(io.Discard, &env{log: slog.New(slog.NewTextHandler(&buf, nil))}, "r1")
	p.update(replay.Progress{Total: 10, Sent: 10, SentThisRun: 10, Started: time.Now()})
	p.update(replay.Progress{Total: 10, Sent: 10, SentThisRun: 10, Started: time.Now(), Done: true})
	if n := strings.Count(buf.String(), "replay progress"); n != 1 {
		t.Errorf("progress lines logged = %d; want 1:\n%s", n, buf.String())
	}
}
