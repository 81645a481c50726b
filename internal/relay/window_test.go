package relay

import (
	"context"
	"testing"
	"time"
)

func TestWindowLimits(t *testing.T) {
	w := newWindow(10, 100)
	if !w.tryTake(6, 60, false) {
		t.Fatalf("tryTake(6, 60) on an empty window = false; want true")
	}
	if w.tryTake(5, 10, false) {
		t.Errorf("tryTake(5, 10) with 6/10 events held = true; want false")
	}
	if w.tryTake(1, 50, false) {
		t.Errorf("tryTake(1, 50) with 60/100 bytes held = true; want false")
	}
	if !w.tryTake(4, 40, false) {
		t.Errorf("tryTake(4, 40) filling the window exactly = false; want true")
	}
	w.giveBytes(100)
	if w.tryTake(1, 0, false) {
		t.Errorf("tryTake(1, 0) with all events still held = true; want false: events are given back only at checkpoints")
	}
	w.giveEvents(10)
	if ev, b := w.usage(); ev != 0 || b != 0 {
		t.Errorf("usage() = %d, %d; want 0, 0", ev, b)
	}
}

func TestWindowOversizedTakeWhenEmpty(t *testing.T) {
	w := newWindow(10, 100)
	if !w.tryTake(50, 5000, false) {
		t.Fatalf("tryTake(50, 5000) on an empty window = false; want true, or a huge transaction would stall forever")
	}
	if w.tryTake(1, 1, false) {
		t.Errorf("tryTake(1, 1) after an oversized take = true; want false")
	}
}

func TestWindowTakeBlocksUntilGive(t *testing.T) {
	w := newWindow(2, 100)
	w.tryTake(2, 10, false)
	got := make(chan error, 1)
	go func() { got <- w.take(context.Background(), 1, 10, false) }()
	select {
	case err := <-got:
		t.Fatalf("take on a full window returned %v before anything was given back", err)
	case <-time.After(50 * time.Millisecond):
	}
	w.giveEvents(1)
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("take after giveEvents = %v; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("take still blocked 5s after giveEvents")
	}
}

func TestWindowTakeCancelled(t *testing.T) {
	w := newWindow(1, 100)
	w.tryTake(1, 1, false)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.take(ctx, 1, 1, false); err != context.DeadlineExceeded {
		t.Fatalf("take on a full window with an expiring ctx = %v; want context.DeadlineExceeded", err)
	}
}

// Inside a transaction only the byte limit holds: its events cannot be
// checkpointed before its end, so waiting for them would deadlock.
func TestWindowOpenTransactionIgnoresEventLimit(t *testing.T) {
	w := newWindow(10, 100)
	w.tryTake(10, 10, false)
	if w.tryTake(5, 10, false) {
		t.Errorf("tryTake(5, 10) at a transaction boundary with the event limit reached = true; want false")
	}
	if !w.tryTake(5, 10, true) {
		t.Errorf("tryTake(5, 10) inside a transaction with room for the bytes = false; want true")
	}
	if w.tryTake(1, 90, true) {
		t.Errorf("tryTake(1, 90) inside a transaction past the byte limit = true; want false")
	}
}
