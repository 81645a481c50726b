package relay_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	outboxevent "github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
)

// slowSink is the stream's transactional sink with every Send delayed, so
// that a Postgres transaction of many chunks takes longer to write than a
// short kafka.transaction_timeout. (The broker looks for timed-out
// transactions only every transaction.abort.timed.out.transaction.cleanup.interval.ms,
// 10 s by default and not dynamic, so a transaction must be written for well
// over 10 s to be aborted for sure; a real one that slow would be hundreds
// of thousands of rows on this shared machine.) cap, when set, is what
// MaxTransactionTimeout answers: a broker whose transaction.max.timeout.ms
// is that.
type slowSink struct {
	*sink.Kafka
	delay time.Duration
	cap   time.Duration
	hold  chan struct{} // when not nil, every Send waits until it is closed
	inits atomic.Int32
	sent  atomic.Int64 // events handed to Send, held or not
}

func (s *slowSink) Send(ctx context.Context, evs []outboxevent.Event) sink.Delivery {
	s.sent.Add(int64(len(evs)))
	if s.hold != nil {
		select {
		case <-s.hold:
		case <-ctx.Done():
		}
	}
	t := time.NewTimer(s.delay)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
	return s.Kafka.Send(ctx, evs)
}

func (s *slowSink) InitTransactions(ctx context.Context) error {
	s.inits.Add(1)
	return s.Kafka.InitTransactions(ctx)
}

func (s *slowSink) MaxTransactionTimeout(ctx context.Context) (time.Duration, error) {
	if s.cap > 0 {
		return s.cap, nil
	}
	return s.Kafka.MaxTransactionTimeout(ctx)
}

// logBuffer is a log that tests read, besides t.Log.
type logBuffer struct {
	t  testing.TB
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines counts the lines of the log that hold every one of subs.
func (l *logBuffer) lines(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.b.String(), "\n") {
		if containsAll(line, subs...) {
			n++
		}
	}
	return n
}

// timeoutRelay starts a relay whose stream writes through a slowSink
// (0.7 s a Send), with exactly-once delivery, a transaction timeout of 1 s
// and chunks of 50 events, metrics served on an address of its own; it
// returns the relay, its sink, its log, its cancel, Run's outcome (a test
// that reads it puts it back for the cleanup) and the metrics address.
func (f *fixture) timeoutRelay(t *testing.T, cap time.Duration) (*relay.Relay, *slowSink, *logBuffer, context.CancelFunc, chan error, string) {
	t.Helper()
	return f.timeoutRelayWith(t, cap, func(*relay.Config) {})
}

// timeoutRelayWith is timeoutRelay with edit applied to the configuration.
func (f *fixture) timeoutRelayWith(t *testing.T, cap time.Duration, edit func(*relay.Config)) (*relay.Relay, *slowSink, *logBuffer, context.CancelFunc, chan error, string) {
	t.Helper()
	cfg := f.eosConfig(t)
	cfg.Sink.TransactionTimeout = time.Second
	cfg.TransactionMaxEvents = 50
	cfg.MetricsListen = testenv.FreeAddr(t)
	logs := &logBuffer{t: t}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	edit(&cfg)
	r, slow, cancel, done := f.startSlow(t, cfg, 700*time.Millisecond, cap)
	return r, slow, logs, cancel, done, cfg.MetricsListen
}

// startSlow starts a relay of cfg whose stream writes through a slowSink
// of delay and cap.
func (f *fixture) startSlow(t *testing.T, cfg relay.Config, delay, cap time.Duration) (*relay.Relay, *slowSink, context.CancelFunc, chan error) {
	t.Helper()
	return f.startSlowSink(t, cfg, &slowSink{delay: delay, cap: cap})
}

// startSlowSink starts a relay of cfg whose stream writes through slow
// (its Kafka made here).
func (f *fixture) startSlowSink(t *testing.T, cfg relay.Config, slow *slowSink) (*relay.Relay, *slowSink, context.CancelFunc, chan error) {
	t.Helper()
	cfg.Sink.Logger = cfg.Logger
	scfg := cfg.Sink
	if cfg.Delivery == relay.DeliveryExactlyOnce {
		scfg.TransactionalID = relay.TransactionalID(cfg.Replication.Slot)
	}
	k, err := sink.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := sink.New(cfg.Sink)
	if err != nil {
		t.Fatal(err)
	}
	slow.Kafka = k
	r, err := relay.New(cfg, relay.Sinks{Stream: slow, Retry: retry})
	if err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Errorf("relay did not stop within a minute of cancel")
		}
		k.Close()
		retry.Close()
	})
	return r, slow, cancel, done
}

// waitNotReady polls r.Ready until it fails with a message holding every
// one of want.
func waitNotReady(t *testing.T, r *relay.Relay, timeout time.Duration, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = r.Ready(context.Background())
		if last != nil && containsAll(last.Error(), want...) {
			return last.Error()
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("Ready = %v within %s; want an error naming %q", last, timeout, want)
	return ""
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// timeoutWords are what the operator must read: the setting, the broker's
// cap, and that no other relay is to blame.
var timeoutWords = []string{"kafka.transaction_timeout", "transaction.max.timeout.ms", "no other relay fenced it"}

// TestExactlyOnceTransactionTimeout: a Postgres transaction that takes
// longer to write than kafka.transaction_timeout (1000 events in 20 chunks,
// each Send slowed by 0.7 s, against 1 s) is aborted by the broker, which
// bumps the producer's epoch. The relay must not take that for another
// relay and loop: it reports it (not ready, a log line naming the settings),
// writes the transaction again once with the timeout raised to the
// broker's transaction.max.timeout.ms, and a read_committed consumer reads
// every event once; later transactions go with the configured timeout.
// Before the fix the relay stood by, took the slot back and wrote the
// transaction again with 1 s, forever, ready all along.
func TestExactlyOnceTransactionTimeout(t *testing.T) {
	f := newFixture(t)
	r, slow, logs, _, done, metrics := f.timeoutRelay(t, 0)
	f.insertTx(t, f.makeEvents(1000))
	msg := waitNotReady(t, r, 45*time.Second, timeoutWords...)
	if !strings.Contains(msg, "writing it again with a transaction timeout of") {
		t.Errorf("Ready = %q; want it to say it is written again with the timeout raised", msg)
	}
	// While it is written again: /readyz 503, and the stall metrics say so.
	httpGet(t, "http://"+metrics+"/readyz", 503)
	for deadline := time.Now().Add(10 * time.Second); ; {
		body := httpGet(t, "http://"+metrics+"/metrics", 200)
		stalled, failing := sumMetric(body, "outbox_relay_stalled_seconds"), sumMetric(body, `outbox_relay_health_failing{check="stalled"}`)
		if stalled > 0 && failing == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("outbox_relay_stalled_seconds = %v, health_failing{check=\"stalled\"} = %v while the transaction is written again; want > 0 and 1", stalled, failing)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	f.waitCommitted(t, 1000, 2*time.Minute)
	f.insertTx(t, f.makeEvents(10))
	f.waitCommitted(t, 1010, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	if err := r.Ready(context.Background()); err != nil && strings.Contains(err.Error(), "kafka.transaction_timeout") {
		t.Errorf("Ready after the transaction was delivered = %v; want the timeout problem gone", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v; want it still running", err)
	default:
	}
	if n := logs.lines("level=ERROR", "Kafka aborted the transaction holding the Postgres transaction"); n != 1 {
		t.Errorf("the log says %d times that Kafka aborted the transaction; want once (one retry with the raised timeout)", n)
	}
	if n := logs.lines("another relay leads the slot"); n != 0 {
		t.Errorf("the log blames another relay %d times; want never", n)
	}
	// The first take, the one with the raised timeout, and the one back to
	// kafka.transaction_timeout once the transaction passed.
	if n := slow.inits.Load(); n != 3 {
		t.Errorf("InitTransactions called %d times; want 3", n)
	}
	if n := logs.lines("kafka transactional producer", " transaction_timeout=1s"); n != 2 {
		t.Errorf("the producer took the id %d times with transaction_timeout=1s; want 2 (the first, and after the transaction passed)", n)
	}
	got := f.readCommitted(t)
	if rep := f.check(t, got); len(got) != 1010 || rep != (report{}) {
		t.Fatalf("read_committed reads %d events; want 1010 exactly once: lost %d, duplicates %d, order violations %d, mismatches %d; first: %s",
			len(got), rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
}

// TestExactlyOnceTransactionTimeoutAtCap: the same transaction against a
// broker whose transaction.max.timeout.ms is the configured timeout (the
// sink's answer replaced): the relay cannot raise it, so it stops at the
// first abort with the documented exit code and a message that names both
// settings and the fix, instead of writing it again and again.
func TestExactlyOnceTransactionTimeoutAtCap(t *testing.T) {
	f := newFixture(t)
	_, slow, _, _, done, _ := f.timeoutRelay(t, time.Second)
	f.insertTx(t, f.makeEvents(1000))
	var err error
	select {
	case err = <-done:
		done <- err // for the cleanup
	case <-time.After(90 * time.Second):
		t.Fatal("Run still running 90 s after the transaction; want it stopped at the first abort")
	}
	var te *relay.TxnTimeoutError
	if !errors.As(err, &te) || exitcode.Of(err) != exitcode.TxnTimeout {
		t.Fatalf("Run = %v (exit code %d); want a *relay.TxnTimeoutError, exit code %d", err, exitcode.Of(err), exitcode.TxnTimeout)
	}
	if msg := err.Error(); !containsAll(msg, append(timeoutWords, "at the broker's cap", "raise the brokers' transaction.max.timeout.ms")...) {
		t.Errorf("Run = %q; want it to name the settings, the cap and the fix", msg)
	}
	if n := slow.inits.Load(); n != 1 {
		t.Errorf("InitTransactions called %d times; want 1 (no second attempt)", n)
	}
	if got := f.readCommitted(t); len(got) != 0 {
		t.Errorf("read_committed reads %d events; want 0", len(got))
	}
}

// TestExactlyOnceTransactionTimeoutStopped: stopped (SIGTERM) while the
// transaction is written again, Run returns the timeout's error, with its
// exit code, not a clean stop or another relay's fencing.
func TestExactlyOnceTransactionTimeoutStopped(t *testing.T) {
	f := newFixture(t)
	// The stop must come while the transaction is written again: once the
	// producer with the raised timeout is up. Whether the new stream has read
	// the transaction by then is a race; the short drain (the 20 slow chunks
	// take 14 s) keeps it from finishing the write either way.
	r, _, logs, cancel, done, _ := f.timeoutRelayWith(t, 0, func(c *relay.Config) { c.ShutdownTimeout = 2 * time.Second })
	f.insertTx(t, f.makeEvents(1000))
	waitNotReady(t, r, 45*time.Second, timeoutWords...)
	deadline := time.Now().Add(45 * time.Second)
	for logs.lines("kafka transactional producer", "transaction_timeout=15m0s") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the relay did not start writing the aborted transaction again (no producer with the raised timeout) within 45s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	var err error
	select {
	case err = <-done:
		done <- err // for the cleanup
	case <-time.After(time.Minute):
		t.Fatal("Run did not stop within a minute of cancel")
	}
	var te *relay.TxnTimeoutError
	if !errors.As(err, &te) || !te.Stopped || exitcode.Of(err) != exitcode.TxnTimeout {
		t.Fatalf("Run after cancel = %v (exit code %d); want a stopped *relay.TxnTimeoutError, exit code %d", err, exitcode.Of(err), exitcode.TxnTimeout)
	}
	if msg := err.Error(); !containsAll(msg, append(timeoutWords, "stopped while writing it again")...) {
		t.Errorf("Run = %q; want it to name the settings and say it stopped while writing it again", msg)
	}
}
