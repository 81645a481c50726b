package relay

import (
	"context"
	"sync"

	"github.com/outbox-relay/outbox-relay/event"
)

// window bounds what the pipeline holds. Bytes are taken when a batch is read
// and given back when Kafka has acknowledged it (memory); events are given back
// only when a saved checkpoint covers them, so that the events a crash can
// resend are never more than the event limit.
//
// A single take larger than a limit is let through when the window is empty,
// so an oversized batch slows the pipeline down instead of stalling it.
//
// The event limit applies at transaction boundaries only (inTxn false): the
// events of an open transaction cannot be covered by a checkpoint before its
// end is read, so holding its rest back behind them would deadlock. Bytes are
// given back at acknowledgement, so their limit always applies. A crash can
// thus resend at most maxEvents plus the largest transaction.
type window struct {
	maxEvents, maxBytes int

	mu      sync.Mutex
	events  int
	bytes   int
	changed chan struct{} // closed and replaced on every give

	// spare holds chunk buffers the writer is done with, for the route
	// stage to fill again: a chunk's events are ~270 bytes each, and a
	// fresh buffer per chunk was a third of the relay's allocations. A few
	// at most: more are left to the garbage collector.
	spare chan []event.Event
}

// eventOverhead is what the window's bytes count for each row beside its
// bytes: what the relay holds of an event besides its columns (its 280-byte
// envelope, its headers and strings, its retry row when it is diverted).
// Without it, small events made the byte window a count of tens of
// thousands of events: 200,000 rows of ~100 bytes in one transaction (where
// the event limit does not apply) held ~80,000 events, ~40 MB beside the
// window (issue 34: the relay at or over its memory bound of 80 MiB while
// 100,000 aggregates were parked).
const eventOverhead = 512

func newWindow(maxEvents, maxBytes int) *window {
	return &window{maxEvents: maxEvents, maxBytes: maxBytes, changed: make(chan struct{}),
		spare: make(chan []event.Event, 2)}
}

// spareEvents returns an empty buffer for a chunk's events, or nil when none
// is spare.
func (w *window) spareEvents() []event.Event {
	select {
	case evs := <-w.spare:
		return evs
	default:
		return nil
	}
}

// recycle hands back a chunk's buffer once nothing reads its events any
// more. It is cleared first, so that it pins no rows while it waits.
func (w *window) recycle(evs []event.Event) {
	clear(evs)
	select {
	case w.spare <- evs[:0]:
	default:
	}
}

// tryTake takes events and bytes if they fit now.
func (w *window) tryTake(events, bytes int, inTxn bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.takeLocked(events, bytes, inTxn)
}

func (w *window) takeLocked(events, bytes int, inTxn bool) bool {
	fitsEvents := inTxn || w.events+events <= w.maxEvents || w.events == 0
	fitsBytes := w.bytes+bytes <= w.maxBytes || w.bytes == 0
	if !fitsEvents || !fitsBytes {
		return false
	}
	w.events += events
	w.bytes += bytes
	return true
}

// take blocks until events and bytes fit or ctx is done.
func (w *window) take(ctx context.Context, events, bytes int, inTxn bool) error {
	for {
		w.mu.Lock()
		if w.takeLocked(events, bytes, inTxn) {
			w.mu.Unlock()
			return nil
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *window) giveBytes(n int)  { w.give(0, n) }
func (w *window) giveEvents(n int) { w.give(n, 0) }

func (w *window) give(events, bytes int) {
	if events == 0 && bytes == 0 {
		return
	}
	w.mu.Lock()
	w.events -= events
	w.bytes -= bytes
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// usage reports what is held, for metrics.
func (w *window) usage() (events, bytes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.events, w.bytes
}
