package main

import (
	"testing"

	"github.com/spf13/pflag"
)

// TestMaxRetainedWALSetting: postgres.max_retained_wal is 1GB unless set,
// and "off" or "0" turn it off: what check reports it as (internal/admin's
// TestCheckWALBound says what check makes of each).
func TestMaxRetainedWALSetting(t *testing.T) {
	for _, tt := range []struct {
		env  string // "": unset
		want int64
	}{
		{"", 1 << 30},
		{"off", 0},
		{"0", 0},
	} {
		minimalEnv(t)
		if tt.env != "" {
			t.Setenv("RELAY_POSTGRES_MAX_RETAINED_WAL", tt.env)
		}
		c, err := loadConfig("", pflag.NewFlagSet("t", pflag.ContinueOnError))
		if err != nil {
			t.Fatalf("RELAY_POSTGRES_MAX_RETAINED_WAL=%q: loadConfig: %v", tt.env, err)
		}
		if got := (&env{cfg: c}).adminConfig().MaxRetainedWAL; got != tt.want {
			t.Errorf("RELAY_POSTGRES_MAX_RETAINED_WAL=%q: admin's MaxRetainedWAL = %d; want %d", tt.env, got, tt.want)
		}
	}
}
