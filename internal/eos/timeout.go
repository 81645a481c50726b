package eos

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// A transaction slower than kafka.transaction_timeout (exactly-once):
//
// A Postgres transaction is written in one Kafka transaction, however many
// chunks it takes: a checkpoint never falls inside it. When writing it
// takes longer than the transaction timeout the Kafka transaction was opened
// with, the coordinator aborts it and bumps the producer's epoch, and the
// relay's next request is refused as a fenced producer's. Read as fencing,
// that made the relay stand by, take the slot back, and write the same
// transaction again, to be aborted again: a livelock, ready all along.
//
// So a term whose Kafka transaction ends refused (fenced or not
// committable) after being open at least its timeout (sink.TxnTimeoutError)
// first asks Postgres whether another relay took the slot over (the lease's
// epoch). If one did, it stands by as before. If not, nobody fenced it: the
// broker aborted it on its timeout. Then (Timeouts.aborted):
//
//   - the condition is reported until a Kafka commit passes that Postgres
//     transaction: /readyz fails, health_failing{check="stalled"} is 1 and
//     stalled_seconds counts from when its first aborted attempt opened,
//     and Run logs a line naming kafka.transaction_timeout and the
//     broker's transaction.max.timeout.ms;
//   - when the broker's transaction.max.timeout.ms (DescribeConfigs) is
//     above the timeout the attempt had, the transaction is written again
//     with that cap as its timeout, for that transaction only: once a
//     commit passes it, the next transactions are written with
//     kafka.transaction_timeout again;
//   - otherwise (the cap reached, or it cannot be read) Run stops with a
//     *TxnTimeoutError that says how to fix it (exit code
//     exitcode.TxnTimeout), as it does when stopped (SIGTERM) while such a
//     transaction is being written again.
//
// The state outlives terms (each attempt is a term), so the Relay holds it
// (Timeouts), and each term's Session is given it.

// A TxnTimeoutError says that the broker aborted, on its transaction
// timeout, the Kafka transaction that held the Postgres transaction
// committed at CommitLSN (with exactly-once delivery), while this relay still
// led the slot. Run returns it when the timeout cannot be raised further, or
// when it is stopped while the transaction is written again. Its exit code
// is exitcode.TxnTimeout.
type TxnTimeoutError struct {
	CommitLSN  pglogrepl.LSN // the first Postgres transaction of the aborted Kafka transaction
	Open       time.Duration // how long the Kafka transaction had been open when the broker refused it
	Timeout    time.Duration // the transaction timeout it had
	Configured time.Duration // kafka.transaction_timeout
	Max        time.Duration // the broker's transaction.max.timeout.ms; 0 when unknown (MaxErr)
	MaxErr     error
	Aborts     int           // attempts the broker aborted so far
	Retrying   time.Duration // the timeout it is being written again with; 0 when not
	Stopped    bool          // Run was stopped while it was written again
}

func (e *TxnTimeoutError) Error() string {
	head := fmt.Sprintf("exactly-once: Kafka aborted the transaction holding the Postgres transaction committed at %s after it had been open for %s, longer than its transaction timeout %s (kafka.transaction_timeout is %s; ",
		e.CommitLSN, e.Open.Round(time.Millisecond), e.Timeout, e.Configured)
	if e.MaxErr != nil {
		head += fmt.Sprintf("the broker's transaction.max.timeout.ms is unknown: %v", e.MaxErr)
	} else {
		head += fmt.Sprintf("the broker's transaction.max.timeout.ms is %s", e.Max)
	}
	head += fmt.Sprintf("); this relay still leads the slot, so no other relay fenced it (attempts aborted: %d)", e.Aborts)
	fix := "raise the brokers' transaction.max.timeout.ms and kafka.transaction_timeout above the time the transaction takes to write, make the outbox's Postgres transactions smaller, or use delivery: at-least-once"
	switch {
	case e.Stopped:
		return head + fmt.Sprintf("; stopped while writing it again: the next start writes it again with kafka.transaction_timeout unless raised: %s", fix)
	case e.Retrying > 0:
		return head + fmt.Sprintf("; writing it again with a transaction timeout of %s (the broker's cap), for this transaction only; if that is not enough either, %s", e.Retrying, fix)
	case e.MaxErr != nil:
		return head + "; cannot raise the timeout without knowing the cap (grant the principal DESCRIBE_CONFIGS on the cluster to let the relay raise it for such a transaction), stopping: " + fix
	}
	return head + "; the timeout is at the broker's cap, stopping: " + fix
}

// ExitCode is exitcode.TxnTimeout.
func (e *TxnTimeoutError) ExitCode() int { return exitcode.TxnTimeout }

// A TimeoutSink is a TxnSink whose transaction timeout the relay can raise:
// sink.Kafka's SetTransactionTimeout (used by the next InitTransactions) and
// MaxTransactionTimeout (the broker's transaction.max.timeout.ms). Called
// from the writer's goroutine only.
type TimeoutSink interface {
	SetTransactionTimeout(d time.Duration)
	MaxTransactionTimeout(ctx context.Context) (time.Duration, error)
}

// Timeouts is the Relay's watch over exactly-once transactions that
// outlive their timeout (see the top of this file). Safe for concurrent
// use: the writer records, Ready and the metrics read.
type Timeouts struct {
	configured time.Duration // kafka.transaction_timeout
	log        *slog.Logger

	mu     sync.Mutex
	stuck  *TxnTimeoutError // the transaction the broker aborted, until a commit passes it; nil: none
	since  time.Time        // when its first aborted attempt opened
	raised bool             // the sink's timeout is above configured
}

// NewTimeouts watches transactions opened with configured
// (kafka.transaction_timeout; 0: the sink's default).
func NewTimeouts(configured time.Duration, log *slog.Logger) *Timeouts {
	if configured <= 0 {
		configured = kafkaclient.DefaultTransactionTimeout
	}
	return &Timeouts{configured: configured, log: log}
}

// aborted records that the broker aborted, on its timeout (te), the Kafka
// transaction that began with the Postgres transaction committed at lsn,
// while the term still led. It raises s's timeout to the broker's cap when
// that is above te's and returns an error wrapping ErrRestart (write it
// again), or the *TxnTimeoutError to stop with.
func (w *Timeouts) aborted(ctx context.Context, s TimeoutSink, lsn pglogrepl.LSN, te *sink.TxnTimeoutError) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	maxT, merr := s.MaxTransactionTimeout(cctx)
	cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	e := &TxnTimeoutError{CommitLSN: lsn, Open: te.Open, Timeout: te.Timeout, Configured: w.configured, Max: maxT, MaxErr: merr, Aborts: 1}
	if w.stuck != nil && w.stuck.CommitLSN == lsn {
		e.Aborts = w.stuck.Aborts + 1
	} else {
		w.since = time.Now().Add(-te.Open)
	}
	w.stuck = e
	if merr != nil || maxT <= te.Timeout {
		return e
	}
	e.Retrying = maxT
	s.SetTransactionTimeout(maxT)
	w.raised = true
	return fmt.Errorf("%w: %w", ErrRestart, e)
}

// passed is called after a Kafka commit up to end: a transaction the
// broker aborted before it is delivered. It reports whether the sink's
// timeout was raised for it and must go back to kafka.transaction_timeout
// (reset, then a new InitTransactions).
func (w *Timeouts) passed(end pglogrepl.LSN) (reset bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stuck == nil || end <= w.stuck.CommitLSN {
		return false
	}
	w.log.Info("exactly-once: the transaction the broker had aborted on its timeout is delivered",
		"commit_lsn", w.stuck.CommitLSN.String(), "attempts_aborted", w.stuck.Aborts,
		"took", time.Since(w.since).Round(time.Second).String())
	w.stuck = nil
	reset, w.raised = w.raised, false
	return reset
}

// reset sets s's timeout back to kafka.transaction_timeout.
func (w *Timeouts) reset(s TimeoutSink) { s.SetTransactionTimeout(w.configured) }

// Problem returns why the relay is not ready and how long it has been
// stalled on a transaction the broker aborted, "" and 0 when none.
func (w *Timeouts) Problem(now time.Time) (string, time.Duration) {
	if w == nil {
		return "", 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stuck == nil {
		return "", 0
	}
	return w.stuck.Error(), now.Sub(w.since)
}

// Stopped turns err, the error of a stop (stop: err wraps context.Canceled,
// or the drain was writing when its time ran out) while a transaction the
// broker aborted is written again, into its *TxnTimeoutError: the operator
// learns why the relay made no progress, and the exit code says it. Other
// errors pass unchanged.
func (w *Timeouts) Stopped(err error, stop bool) error {
	if w == nil || !stop {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stuck == nil {
		return err
	}
	e := *w.stuck
	e.Stopped = true
	return &e
}
