package ops_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

func TestThresholdsCheck(t *testing.T) {
	behind := &ops.LagReport{LagBytes: ptr(int64(1000)), TimeLag: ops.TimeLag{State: ops.StateBehind, Seconds: ptr(30.0)}}
	unknown := &ops.LagReport{LagBytes: ptr(int64(1000)), TimeLag: ops.TimeLag{State: ops.StateUnknown}}
	// lag_bytes small while the relay reads a large transaction (issue 34).
	reading := &ops.LagReport{LagBytes: ptr(int64(1000)), BehindBytes: ptr(int64(5_001_000)),
		Reading: &ops.Reading{CommitLSN: "0/16B3748", Events: 20000, Bytes: 5_000_000}, TimeLag: ops.TimeLag{State: ops.StateBehind, Seconds: ptr(30.0)}}
	tests := []struct {
		name string
		th   ops.Thresholds
		r    *ops.LagReport
		want int
		says string
	}{
		{"no thresholds", ops.Thresholds{}, behind, exitcode.OK, ""},
		{"bytes equal is not over", ops.Thresholds{MaxBytes: 1000}, behind, exitcode.OK, ""},
		{"bytes over", ops.Thresholds{MaxBytes: 999}, behind, exitcode.Threshold, "lag_bytes 1000 > 999"},
		{"seconds over", ops.Thresholds{MaxSeconds: 29.5}, behind, exitcode.Threshold, "time_lag.seconds 30.000 > 29.5"},
		{"both over", ops.Thresholds{MaxBytes: 1, MaxSeconds: 1}, behind, exitcode.Threshold, "lag_bytes 1000 > 1; time_lag.seconds"},
		{"unknown time lag is not checked", ops.Thresholds{MaxSeconds: 1}, unknown, exitcode.OK, ""},
		{"unknown time lag, bytes still checked", ops.Thresholds{MaxSeconds: 1, MaxBytes: 10}, unknown, exitcode.Threshold, "lag_bytes"},
		{"transaction being read counts", ops.Thresholds{MaxBytes: 1_000_000}, reading, exitcode.Threshold,
			"behind_bytes 5001000 > 1000000 (lag_bytes 1000 and 5000000 bytes read of the transaction committed at 0/16B3748"},
		{"transaction being read within the limit", ops.Thresholds{MaxBytes: 5_001_000}, reading, exitcode.OK, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.th.Check(tt.r)
			if got := exitcode.Of(err); got != tt.want {
				t.Errorf("exitcode.Of(%+v.Check()) = %d (%v); want %d", tt.th, got, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.says) {
				t.Errorf("%+v.Check() = %q; want it to say %q", tt.th, err, tt.says)
			}
		})
	}
}

// TestExitCodes checks the codes ops's errors carry to main, which maps any
// error through exitcode.Of.
func TestExitCodes(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("slot %q: %w", "s", pgslot.ErrNotFound), exitcode.Failure},
		{fmt.Errorf("lag: %w", &ops.ThresholdError{Exceeded: []string{"x"}}), exitcode.Threshold},
		{fmt.Errorf("lag: %w", &ops.SlotLostError{Slot: "s"}), exitcode.Failure},
	}
	for _, tt := range tests {
		if got := exitcode.Of(tt.err); got != tt.want {
			t.Errorf("exitcode.Of(%v) = %d; want %d", tt.err, got, tt.want)
		}
	}
}
