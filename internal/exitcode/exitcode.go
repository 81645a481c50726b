// Package exitcode holds outbox-relay's process exit codes, the ones the
// docs/commands.md documents, and maps a command's error to its code.
package exitcode

import (
	"errors"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// Exit codes. A probe or cron job can tell a broken setup (Usage) from a
// failure (Failure) and from a relay that is merely behind (Threshold).
const (
	OK        = 0
	Failure   = 1 // a command failed, check found a problem, lag's slot is lost
	Usage     = 2 // bad flags, flag values, arguments or configuration: nothing was started
	Threshold = 3 // lag: a --max-bytes or --max-seconds threshold was exceeded
	// Gap: the slot does not continue from the relay's checkpoint (recreated,
	// invalidated, another system or timeline: DESIGN invariant 14). run
	// refuses to stream; the message names the uncovered range and the fix.
	Gap = 4
	// Incomplete: recover, a refill or replay --from-lsn found that rows of
	// its range may be gone: retention (of some slot) recorded deleting rows
	// of transactions the range needs. What was left was sent; the message
	// names the slot whose retention pruned them.
	Incomplete = 5
)

// A Coder is an error that carries its exit code.
type Coder interface {
	error
	ExitCode() int
}

// Of returns the exit code for err: OK for nil, the code of the first Coder
// in its chain, Gap for a slot gap (pgslot.ErrGap: the library does not know
// about exit codes), else Failure.
func Of(err error) int {
	if err == nil {
		return OK
	}
	if errors.Is(err, pgslot.ErrGap) {
		return Gap
	}
	var c Coder
	if errors.As(err, &c) {
		return c.ExitCode()
	}
	return Failure
}
