package backoff_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/backoff"
)

func TestDelay(t *testing.T) {
	const ms = time.Millisecond
	tests := []struct {
		name    string
		lo, hi  time.Duration
		attempt int
		want    time.Duration // before jitter
	}{
		{"first", 100 * ms, 5 * time.Second, 0, 100 * ms},
		{"doubles", 100 * ms, 5 * time.Second, 3, 800 * ms},
		{"capped", 100 * ms, 5 * time.Second, 10, 5 * time.Second},
		{"huge attempt", time.Second, 5 * time.Minute, math.MaxInt, 5 * time.Minute},
		{"negative attempt", time.Second, time.Minute, -3, time.Second},
		{"cap near overflow", time.Duration(math.MaxInt64 / 3), time.Duration(math.MaxInt64), 5, time.Duration(math.MaxInt64)},
		{"hi below lo", time.Second, 500 * ms, 0, 500 * ms},
		{"zero", 0, time.Second, 4, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 200 {
				got := backoff.Delay(tt.lo, tt.hi, tt.attempt)
				if got < tt.want/2 || got > tt.want {
					t.Fatalf("Delay(%s, %s, %d) = %s; want within [%s, %s]", tt.lo, tt.hi, tt.attempt, got, tt.want/2, tt.want)
				}
			}
		})
	}
}

func TestJitterSpreads(t *testing.T) {
	const d = time.Second
	seen := map[bool]bool{}
	for range 1000 {
		got := backoff.Jitter(d)
		if got < d/2 || got > d {
			t.Fatalf("Jitter(%s) = %s; want within [%s, %s]", d, got, d/2, d)
		}
		seen[got < 3*d/4] = true
	}
	if len(seen) != 2 {
		t.Errorf("Jitter(%s) 1000 times never fell into both quarters of the upper half", d)
	}
	if got := backoff.Jitter(-time.Second); got != 0 {
		t.Errorf("Jitter(-1s) = %s; want 0", got)
	}
}

func TestBackoff(t *testing.T) {
	b := backoff.Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for i, ceil := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		ceil *= time.Millisecond
		if got := b.Next(); got < ceil/2 || got > ceil {
			t.Errorf("Next() #%d = %s; want within [%s, %s]", i, got, ceil/2, ceil)
		}
	}
	for range 100 { // the count stops growing; the waits stay at Max
		b.Next()
	}
	if got := b.Next(); got < 500*time.Millisecond {
		t.Errorf("Next() after many = %s; want at least 500ms", got)
	}
	b.Reset()
	if got := b.Next(); got > 100*time.Millisecond {
		t.Errorf("Next() after Reset = %s; want at most 100ms", got)
	}
}

func TestSleep(t *testing.T) {
	if err := backoff.Sleep(context.Background(), time.Millisecond); err != nil {
		t.Errorf("Sleep(1ms) = %v; want nil", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := backoff.Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) || time.Since(start) > time.Second {
		t.Errorf("Sleep(1h) on a cancelled context = %v after %s; want context.Canceled at once", err, time.Since(start))
	}
}
