// Package backoff computes the waits between retries: exponential, capped,
// with jitter over the upper half.
//
// The wait before retry n (counting from 0) is d = lo·2ⁿ capped at hi, then
// drawn uniformly from [d/2, d]. Jitter keeps relays, workers or rows that
// failed together from retrying in step against a recovering server; keeping
// the lower half out keeps the wait from collapsing to nothing, so the cap
// still bounds how often a dead server is asked.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Delay returns the wait before retry attempt (0 for the first): lo·2^attempt,
// capped at hi, jittered into its upper half. A negative attempt counts as 0;
// hi below lo caps at hi. It never overflows, whatever attempt is.
func Delay(lo, hi time.Duration, attempt int) time.Duration {
	d := lo
	for i := 0; i < attempt && d < hi; i++ {
		if d > hi/2 {
			d = hi
			break
		}
		d *= 2
	}
	return Jitter(min(d, hi))
}

// Jitter returns a duration drawn uniformly from [d/2, d]; 0 for d ≤ 0.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

// A Backoff hands out the waits of one series of retries: Next returns
// Delay(Min, Max, n) for n = 0, 1, 2, …; Reset starts over (after a success).
// The zero value with Min and Max set is ready to use. Not safe for
// concurrent use.
type Backoff struct {
	Min, Max time.Duration
	attempt  int
}

// Next returns the wait before the next retry and counts it.
func (b *Backoff) Next() time.Duration {
	d := Delay(b.Min, b.Max, b.attempt)
	if b.attempt < 64 { // beyond, every wait is Max anyway
		b.attempt++
	}
	return d
}

// Reset makes the next wait Min-sized again.
func (b *Backoff) Reset() { b.attempt = 0 }

// Sleep waits for d, or until ctx is done, and then returns ctx's error: the
// wait between two attempts of anything that must stop with its context.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
