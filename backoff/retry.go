package backoff

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// Persist runs write until it succeeds or ctx is done, with capped
// exponential backoff and jitter (100 ms to 5 s), logging the first failure
// and every tenth. It is for writes that must be durable before the caller
// may go on (a checkpoint, a retry row before its LSN is confirmed): giving
// up is not an option, waiting is.
func Persist(ctx context.Context, log *slog.Logger, what string, write func() error) error {
	return RetryIf(ctx, log, what, nil, write)
}

// RetryIf runs fn until it succeeds, ctx is done, or it fails with an error
// retryable does not accept (nil accepts all), as Persist does. fn's own
// error is returned as it is; ctx's is wrapped in what.
func RetryIf(ctx context.Context, log *slog.Logger, what string, retryable func(error) bool, fn func() error) error {
	bo := Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil {
			if attempt > 1 {
				log.Info(what+": done after retrying", "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		if retryable != nil && !retryable(err) {
			return err
		}
		if attempt == 1 || attempt%10 == 0 {
			log.Warn(what+": failed, retrying", "attempt", attempt, "err", err)
		}
		if err := Sleep(ctx, bo.Next()); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
}
