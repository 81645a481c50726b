// Package sinkapi is the relay's contract with a sink, in terms that are not
// any broker's: what a write returns (nil, the context's error, or a
// *WriteError listing the events that failed on their own, each a Failure
// saying whether writing it again can succeed and why), ErrBehind for an
// event held behind a failed one of its lane, and the Delivery of a
// pipelined write. Package sink (Kafka) implements it; Memory is an
// in-memory sink for tests that need no server. A second sink (NATS, HTTP)
// is a new package returning these types, plus its wiring (see
// docs/contributing.md).
//
// Invariants every sink keeps:
//
//   - Acknowledged means durably accepted by the broker (for Kafka,
//     acks=all). An event a *WriteError does not list was acknowledged.
//   - A broker outage is not an event's failure: a write blocks through it
//     until the context is done.
//   - An event that fails for a reason of its own fails alone, and later
//     events of its lane (topic and key) are not written ahead of it: they
//     fail with ErrBehind, in the same write and in writes sent before the
//     failure was reported.
//
// It imports no broker client and nothing of internal/.
package sinkapi

import (
	"context"
	"errors"
	"fmt"
)

// A Failure is one event that failed on its own, as the sink judged it.
type Failure struct {
	Index int   // into the events passed to Write
	Err   error // what the broker (or the sink) answered; ErrBehind for an event held behind a failed one

	// Permanent is true when writing the event again will fail the same
	// way: too large, invalid or colliding topic name, not authorized to
	// write, corrupt or invalid record. A failure that may pass later, such
	// as a missing topic (one an operator may create, or the broker did not
	// create in time, or the relay may not create), is not permanent; nor is
	// ErrBehind.
	Permanent bool
	// Reason says in plain words why the event was refused and what fixes
	// it: the last_error of a retry-table row. It names no config key.
	Reason string
	// Code names the reason, stable across versions (the sink's Code
	// constants): stored with the retry row as reason_code, so that the CLI
	// says it with the config keys, which a sink does not speak.
	Code string
}

// WriteError lists the events of a Write that failed on their own, by
// ascending Index. Every event not listed was acknowledged.
type WriteError struct {
	Failures []Failure
}

func (e *WriteError) Error() string {
	if len(e.Failures) == 1 {
		return fmt.Sprintf("write message %d: %v", e.Failures[0].Index, e.Failures[0].Err)
	}
	return fmt.Sprintf("write: %d messages failed, first message %d: %v", len(e.Failures), e.Failures[0].Index, e.Failures[0].Err)
}

// Unwrap exposes every failure's error to errors.Is and errors.As.
func (e *WriteError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// ErrBehind is the error of a message that was not written because an
// earlier message with the same topic and key failed: written, it would
// overtake that message. It fails with it, in order.
var ErrBehind = errors.New("not written: an earlier message with the same topic and key failed")

// A Delivery is the outcome to come of a Send.
type Delivery interface {
	// Done is closed once the broker answered the Send's requests (at once
	// for a Send that Wait writes itself): Wait then blocks only to write
	// again what failed.
	Done() <-chan struct{}
	// Wait blocks until every event of the Send is acknowledged, or has
	// failed on its own, and returns what Write returns: nil, ctx's error,
	// or a *WriteError. Deliveries are waited for in the order of their
	// Sends, from the goroutine that sends.
	Wait(ctx context.Context) error
}
