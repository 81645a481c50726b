package ops

import (
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

// Thresholds are the limits of `lag --max-bytes` and `--max-seconds`. A zero
// field is not checked.
type Thresholds struct {
	MaxBytes   int64   // limit on LagReport.BehindBytes (lag_bytes plus the transaction being read)
	MaxSeconds float64 // limit on LagReport.TimeLag.Seconds
}

// ThresholdError reports which thresholds a LagReport exceeded.
type ThresholdError struct {
	Exceeded []string // one phrase per exceeded threshold
}

func (e *ThresholdError) Error() string {
	return "lag threshold exceeded: " + strings.Join(e.Exceeded, "; ")
}

// ExitCode is the process exit code for this error: exitcode.Threshold (3),
// so that a probe can tell a relay that is behind from a failed check (1) and
// a broken setup (2).
func (e *ThresholdError) ExitCode() int { return exitcode.Threshold }

// Check returns a *ThresholdError when r exceeds t, else nil. The time lag is
// checked only when it is known: an "unknown" time lag (empty outbox table)
// never exceeds --max-seconds, so pair it with --max-bytes.
func (t Thresholds) Check(r *LagReport) error {
	var ex []string
	switch {
	case t.MaxBytes <= 0:
	case r.Reading != nil && r.BehindBytes != nil && *r.BehindBytes > t.MaxBytes:
		ex = append(ex, fmt.Sprintf("behind_bytes %d > %d (lag_bytes %d and %d bytes read of the transaction committed at %s, not yet confirmed)",
			*r.BehindBytes, t.MaxBytes, *r.LagBytes, r.Reading.Bytes, r.Reading.CommitLSN))
	case r.LagBytes != nil && *r.LagBytes > t.MaxBytes:
		ex = append(ex, fmt.Sprintf("lag_bytes %d > %d", *r.LagBytes, t.MaxBytes))
	}
	if t.MaxSeconds > 0 && r.TimeLag.Seconds != nil && *r.TimeLag.Seconds > t.MaxSeconds {
		ex = append(ex, fmt.Sprintf("time_lag.seconds %.3f > %g", *r.TimeLag.Seconds, t.MaxSeconds))
	}
	for _, tl := range r.Tables {
		if s := tl.TimeLag.Seconds; t.MaxSeconds > 0 && s != nil && *s > t.MaxSeconds {
			ex = append(ex, fmt.Sprintf("tables[%s].time_lag.seconds %.3f > %g", tl.Table, *s, t.MaxSeconds))
		}
	}
	if len(ex) == 0 {
		return nil
	}
	return &ThresholdError{Exceeded: ex}
}
