package relay

import (
	"context"
	"sync"
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
}

func newWindow(maxEvents, maxBytes int) *window {
	return &window{maxEvents: maxEvents, maxBytes: maxBytes, changed: make(chan struct{})}
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
