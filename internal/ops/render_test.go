package ops_test

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

func TestBytes(t *testing.T) {
	tests := []struct {
		n    int64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {-512, "-512 B"}, {1024, "1.0 KiB"},
		{16 << 20, "16.0 MiB"}, {-3 << 20, "-3.0 MiB"}, {1 << 50, "1.0 PiB"}, {1 << 60, "1024.0 PiB"},
	}
	for _, tt := range tests {
		if got := ops.Bytes(tt.n); got != tt.want {
			t.Errorf("Bytes(%d) = %q; want %q", tt.n, got, tt.want)
		}
	}
	if got := ops.BytesOrNA(nil); got != "n/a" {
		t.Errorf("BytesOrNA(nil) = %q; want n/a", got)
	}
}

func TestRoughDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"}, {999 * time.Millisecond, "0s"}, {45 * time.Second, "45s"},
		{12*time.Minute + 59*time.Second, "12m"}, {47 * time.Hour, "47h"}, {49 * time.Hour, "2d"},
	}
	for _, tt := range tests {
		if got := ops.RoughDuration(tt.d); got != tt.want {
			t.Errorf("RoughDuration(%s) = %q; want %q", tt.d, got, tt.want)
		}
	}
}
