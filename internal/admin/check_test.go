package admin

import (
	"strings"
	"testing"
)

// TestEOSNote: check says what exactly-once delivery gets from the WAL
// buffer only when both are on.
func TestEOSNote(t *testing.T) {
	tests := []struct {
		name  string
		cfg   Config
		marks bool
	}{
		{"at least once", Config{MaxRetainedWAL: 1 << 30}, false},
		{"exactly once, bound off", Config{ExactlyOnce: true}, false},
		{"exactly once with the bound", Config{ExactlyOnce: true, MaxRetainedWAL: 1 << 30}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := eosNote(&tt.cfg)
			if marks := strings.Contains(got, "at least once, marked outbox-relay-delivery: at-least-once"); marks != tt.marks {
				t.Errorf("eosNote(%+v) = %q; want the at-least-once note: %v", tt.cfg, got, tt.marks)
			}
		})
	}
}
