package backoff

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestRetryIf: RetryIf retries what retryable accepts until it succeeds,
// logging the first failure and the success after retrying; an error it
// does not accept is returned at once, as it is; a cancelled context ends
// the waiting with an error naming what was retried.
func TestRetryIf(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	ctx := context.Background()
	calls := 0
	err := Persist(ctx, log, "save the row", func() error {
		if calls++; calls < 3 {
			return errors.New("connection refused")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Persist = %v after %d calls; want nil after 3", err, calls)
	}
	for _, want := range []string{`msg="save the row: failed, retrying" attempt=1 err="connection refused"`, `msg="save the row: done after retrying" attempts=3`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
	if strings.Contains(logs.String(), "attempt=2 ") {
		t.Errorf("log has the second failure; want the first and every tenth:\n%s", logs.String())
	}

	fatal := errors.New("permission denied")
	calls = 0
	err = RetryIf(ctx, log, "save", func(err error) bool { return err != fatal }, func() error { calls++; return fatal })
	if err != fatal || calls != 1 {
		t.Errorf("RetryIf of a refused error = %v after %d calls; want it, unwrapped, after 1", err, calls)
	}

	cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
	defer cancel()
	err = Persist(cctx, log, "save the row", func() error { return errors.New("down") })
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "save the row: ") {
		t.Errorf("Persist until the context ends = %v; want the context's error, prefixed with what", err)
	}
}
