package relay_test

import (
	"context"
	"testing"
	"time"

	outboxevent "github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/sink"
)

// blockedTxnSink is a transactional stream sink (sink.Kafka with a
// transactional id) whose broker can be made unreachable with its
// blockedSink: while blocked, every call that talks to Kafka waits (an
// abort fails at once: the relay bounds it anyway).
type blockedTxnSink struct {
	*blockedSink
	k *sink.Kafka
}

func (s *blockedTxnSink) InitTransactions(ctx context.Context) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.k.InitTransactions(ctx)
}

func (s *blockedTxnSink) Commit(ctx context.Context) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	return s.k.Commit(ctx)
}

func (s *blockedTxnSink) Abort(ctx context.Context) error {
	if s.blocked() {
		return errBlocked
	}
	return s.k.Abort(ctx)
}

func (s *blockedTxnSink) LastCommitted(ctx context.Context, topic string, key []byte) ([]byte, bool, error) {
	if err := s.wait(ctx); err != nil {
		return nil, false, err
	}
	return s.k.LastCommitted(ctx, topic, key)
}

func (s *blockedTxnSink) SetTransactionTimeout(d time.Duration) { s.k.SetTransactionTimeout(d) }

func (s *blockedTxnSink) MaxTransactionTimeout(ctx context.Context) (time.Duration, error) {
	if err := s.wait(ctx); err != nil {
		return 0, err
	}
	return s.k.MaxTransactionTimeout(ctx)
}

// TestWALBufferExactlyOnce: with exactly-once delivery the WAL bound
// applies too. With the broker unreachable and other tables writing WAL,
// the relay buffers and confirms its slot past events Kafka never took;
// when the broker is back, a read_committed consumer reads every event in
// per-aggregate commit order; each buffered event's messages carry the
// outbox-relay-delivery: at-least-once header (the buffered range is
// delivered at least once), and no message without it is repeated: the
// events streamed live before and after are read exactly once.
func TestWALBufferExactlyOnce(t *testing.T) {
	f := newFixture(t)
	cfg, stream, drain := f.eosBufferRelay(t, false)
	block := func() { stream.block(); drain.block() }
	unblock := func() { stream.unblock(); drain.unblock() }
	if _, err := relay.New(cfg, relay.Sinks{Stream: stream, Retry: eosSink(t, cfg, false)}); err == nil {
		t.Errorf("relay.New with exactly-once, a WAL bound and no drain sink = nil error; want one naming Sinks.Drain")
	}
	live := map[string]bool{} // streamed live: exactly once, unmarked
	insertLive := func(n int) {
		evs := f.makeEvents(n)
		for _, e := range evs {
			live[e.ID] = true
		}
		f.insertTx(t, evs)
	}

	insertLive(20)
	f.waitCommitted(t, 20, time.Minute)

	block()
	buffered := map[string]bool{} // read while Kafka was away: through the buffer
	for i := range 30 {
		evs := f.makeEvents(10)
		for _, e := range evs {
			buffered[e.ID] = true
		}
		f.insertTx(t, evs)
		f.noiseWAL(t, 1)
		if i%10 == 9 {
			time.Sleep(time.Second)
		}
	}
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], 60*time.Second)
	f.bufferedPast(t, ends[len(ends)-1])

	// Back: events keep coming while the buffer drains (to the buffer, or
	// live once the relay left buffering).
	unblock()
	for deadline := time.Now().Add(90 * time.Second); ; {
		held := f.walBuffered(t)
		if held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the WAL buffer still holds %d events 90s after Kafka came back", held)
		}
		f.insertTx(t, f.makeEvents(2))
		time.Sleep(50 * time.Millisecond)
	}
	// Live again (no longer buffering, the buffer drained): these are
	// written in Kafka transactions.
	waitFor(t, 90*time.Second, "the relay streaming live again", func() (bool, string) {
		return gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active") == 0, "outbox_relay_wal_buffer_active is 1"
	})
	insertLive(10)
	got := f.waitCommittedWhole(t)
	unmarked := map[string]int{}
	dups := 0
	seen := map[string]bool{}
	for _, d := range got {
		id := d.Headers["id"]
		if seen[id] {
			dups++
		}
		seen[id] = true
		mark, ok := d.Headers[outboxevent.HeaderDelivery]
		switch {
		case buffered[id] && mark != outboxevent.DeliveryAtLeastOnce:
			t.Errorf("buffered event %s read with %s = %q (present %v); want %q", id, outboxevent.HeaderDelivery, mark, ok, outboxevent.DeliveryAtLeastOnce)
		case live[id] && ok:
			t.Errorf("event %s streamed live read with %s = %q; want no such header", id, outboxevent.HeaderDelivery, mark)
		case ok && mark != outboxevent.DeliveryAtLeastOnce:
			t.Errorf("event %s: %s = %q; want %q or none", id, outboxevent.HeaderDelivery, mark, outboxevent.DeliveryAtLeastOnce)
		}
		if !ok {
			unmarked[id]++
		}
	}
	for id, n := range unmarked {
		if n > 1 {
			t.Errorf("event %s read %d times without %s: only a message marked at least once may repeat", id, n, outboxevent.HeaderDelivery)
		}
	}
	for id := range live {
		if unmarked[id] != 1 {
			t.Errorf("event %s streamed live read %d times unmarked; want exactly once", id, unmarked[id])
		}
	}
	t.Logf("%d messages read_committed, %d duplicates (all marked), %d buffered events", len(got), dups, len(buffered))
}

// TestWALBufferExactlyOnceLeavesBuffering: with exactly-once delivery, a
// relay whose broker is back leaves buffering and streams live again, also
// while another table writes WAL fast enough that the slot retains half
// the bound between xl_running_xacts records. The stream's transactional
// sink writes nothing while the relay buffers (the drain has a sink of its
// own), so it still reports the outage (sink.Kafka learns that Kafka is
// back only by writing to it): the watch of the term that drains and then
// streams live must not take that for Kafka being away. Found by
// internal/faults' TestWALBufferKafkaOutageExactlyOnce: the relay went back
// to buffering at once, "delivery is blocked: connection refused", with the
// broker up; at the retained WAL a busy primary keeps, for good.
func TestWALBufferExactlyOnceLeavesBuffering(t *testing.T) {
	f := newFixture(t)
	cfg, stream, drain := f.eosBufferRelay(t, true)
	f.insertTx(t, f.makeEvents(10))
	f.waitCommitted(t, 10, time.Minute)

	stream.block()
	drain.block()
	waitFor(t, 90*time.Second, "the relay buffering", func() (bool, string) {
		f.insertTx(t, f.makeEvents(5))
		f.noiseWAL(t, 1)
		return gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active") == 1, "outbox_relay_wal_buffer_active is 0"
	})
	stream.unblock()
	drain.unblock()
	// No events from here on: the stream's sink has nothing to write, so
	// only a watch that asks the sink that delivers can tell Kafka is back.
	// The noise keeps the slot's retained WAL over half the bound.
	live := time.Time{}
	waitFor(t, 2*time.Minute, "the relay streaming live for 10s", func() (bool, string) {
		f.noiseWAL(t, 1)
		if gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active") == 1 {
			live = time.Time{}
			return false, "outbox_relay_wal_buffer_active is 1 (buffering, or draining before streaming live)"
		}
		if live.IsZero() {
			live = time.Now()
		}
		return time.Since(live) >= 10*time.Second, "live for less than 10s"
	})
	// Nor does its health take the stale outage for Kafka being away.
	if v := cfg.Metrics.Value("outbox_relay_health_failing", "check", "kafka"); v != 0 {
		t.Errorf("health_failing{check=\"kafka\"} = %v after 10s of streaming live with Kafka up; want 0", v)
	}
	f.insertTx(t, f.makeEvents(10))
	f.waitCommittedWhole(t)
}

// eosBufferRelay runs an exactly-once relay with a 4 MiB WAL bound and
// metrics, whose stream (transactional; sticky as given) and drain sinks
// can be blocked: Kafka away is both sinks that talk to it while
// buffering. It returns the config and those two sinks.
func (f *fixture) eosBufferRelay(t *testing.T, sticky bool) (relay.Config, *blockedTxnSink, *blockedSink) {
	t.Helper()
	cfg := f.eosConfig(t)
	cfg.MaxRetainedWAL = 4 << 20
	cfg.Metrics = metrics.New()
	stream := &blockedTxnSink{blockedSink: &blockedSink{Sink: eosSink(t, cfg, true), sticky: sticky}}
	stream.k = stream.Sink.(*sink.Kafka)
	drain := &blockedSink{Sink: eosSink(t, cfg, false)}
	r, err := relay.New(cfg, relay.Sinks{Stream: stream, Retry: eosSink(t, cfg, false), Drain: drain})
	if err != nil {
		t.Fatal(err)
	}
	runRelay(t, r)
	return cfg, stream, drain
}

// eosSink is a sink of cfg.Sink closed at the test's end; txn makes it the
// stream's transactional one (its id from the slot, as the CLI's).
func eosSink(t *testing.T, cfg relay.Config, txn bool) *sink.Kafka {
	t.Helper()
	scfg := cfg.Sink
	scfg.Logger = cfg.Logger
	if txn {
		scfg.TransactionalID = relay.TransactionalID(cfg.Replication.Slot)
	}
	k, err := sink.New(scfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}
