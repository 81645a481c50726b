package ops

import (
	"errors"
	"fmt"
	"strings"
)

// Exit codes of `outbox-relay lag`, for cron jobs and probes. 2 is left to the
// CLI's "bad flags or configuration", so that a probe can tell a broken setup
// from a relay that is behind.
const (
	ExitOK        = 0 // nothing exceeded
	ExitError     = 1 // the check itself failed
	ExitThreshold = 3 // a --max-bytes or --max-seconds threshold was exceeded
)

// Thresholds are the limits of `lag --max-bytes` and `--max-seconds`. A zero
// field is not checked.
type Thresholds struct {
	MaxBytes   int64   // limit on LagReport.LagBytes
	MaxSeconds float64 // limit on LagReport.TimeLag.Seconds
}

// ThresholdError reports which thresholds a LagReport exceeded.
type ThresholdError struct {
	Exceeded []string // one phrase per exceeded threshold
}

func (e *ThresholdError) Error() string {
	return "lag threshold exceeded: " + strings.Join(e.Exceeded, "; ")
}

// ExitCode is the process exit code for this error: ExitThreshold. The CLI's
// main maps any error with an ExitCode method to that code.
func (e *ThresholdError) ExitCode() int { return ExitThreshold }

// Check returns a *ThresholdError when r exceeds t, else nil. The time lag is
// checked only when it is known: an "unknown" time lag (empty outbox table)
// never exceeds --max-seconds, so pair it with --max-bytes.
func (t Thresholds) Check(r *LagReport) error {
	var ex []string
	if t.MaxBytes > 0 && r.LagBytes != nil && *r.LagBytes > t.MaxBytes {
		ex = append(ex, fmt.Sprintf("lag_bytes %d > %d", *r.LagBytes, t.MaxBytes))
	}
	if t.MaxSeconds > 0 && r.TimeLag.Seconds != nil && *r.TimeLag.Seconds > t.MaxSeconds {
		ex = append(ex, fmt.Sprintf("time_lag.seconds %.3f > %g", *r.TimeLag.Seconds, t.MaxSeconds))
	}
	if len(ex) == 0 {
		return nil
	}
	return &ThresholdError{Exceeded: ex}
}

// ExitCode maps the error of a lag check to the documented exit code: nil is
// ExitOK, a *ThresholdError is ExitThreshold, anything else ExitError.
func ExitCode(err error) int {
	var te *ThresholdError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &te):
		return ExitThreshold
	default:
		return ExitError
	}
}
