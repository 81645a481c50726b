package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ev "github.com/outbox-relay/outbox-relay/event"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// topicOf routes every event to topic, re-read on every call so that a test
// can "fix the config" while the worker runs.
type topicOf struct {
	mu    sync.Mutex
	topic string
	err   error
}

func (r *topicOf) Topic(aggregateType, eventType string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.topic, r.err
}

// delivered records the Worker's Delivered calls.
type delivered struct {
	mu   sync.Mutex
	aggs []string
}

func (d *delivered) add(agg string) {
	d.mu.Lock()
	d.aggs = append(d.aggs, agg)
	d.mu.Unlock()
}

func (d *delivered) has(agg string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Contains(d.aggs, agg)
}

func newSink(t *testing.T, brokers []string, batchBytes int64) *sink.Kafka {
	t.Helper()
	k, err := sink.New(kafkaclient.Config{Brokers: brokers, BatchBytes: batchBytes, AllowAutoTopicCreation: false,
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// fastConfig is a WorkerConfig with waits short enough for tests.
func fastConfig(s *retry.Store, k retry.Sink, topic func(string, string) (string, error)) retry.WorkerConfig {
	return retry.WorkerConfig{
		Store: s, Sink: k, Topic: topic,
		BackoffMin: 100 * time.Millisecond, BackoffMax: 400 * time.Millisecond,
		PollInterval: 50 * time.Millisecond, AttemptTimeout: 5 * time.Second,
	}
}

// startWorker makes a Worker of cfg and runs it until the test ends.
func startWorker(t *testing.T, cfg retry.WorkerConfig) *retry.Worker {
	t.Helper()
	w, err := retry.NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, w)
	return w
}

// run starts w and stops it when the test ends.
func run(t *testing.T, w *retry.Worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run() = %v; want context.Canceled", err)
		}
	})
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func get(t *testing.T, s *retry.Store, id string) retry.Entry {
	t.Helper()
	e, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get(%q): %v", id, err)
	}
	return e
}

func empty(t *testing.T, s *retry.Store) func() bool {
	return func() bool { return len(list(t, s, retry.Filter{})) == 0 }
}

// ids returns the "id" headers of msgs with key key, in topic order.
func ids(msgs []testenv.Message, key string) []string {
	var out []string
	for _, m := range msgs {
		if string(m.Key) != key {
			continue
		}
		for _, h := range m.Headers {
			if h.Key == "id" {
				out = append(out, string(h.Value))
			}
		}
	}
	return out
}

// aggregateEvents returns n events of aggregate key on topic: the first
// failed, the rest waiting behind it.
func aggregateEvents(topic, key string, n int) []retry.Event {
	var events []retry.Event
	for i := 1; i <= n; i++ {
		e := event(topic, key, fmt.Sprintf("%s-%d", key, i))
		e.Waiting = i > 1
		events = append(events, e)
	}
	return events
}

// TestWorkerMissingTopic: A1 failed for a missing topic, A2..A5 wait behind
// it. The worker retries A1 with backoff, leaves A2..A5 alone, and delivers
// all five in order once the topic exists.
func TestWorkerMissingTopic(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	events := aggregateEvents(topic, "A", 5)
	if err := s.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	var dl delivered
	cfg := fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic)
	cfg.Delivered = dl.add
	w := startWorker(t, cfg)

	waitFor(t, 20*time.Second, "A-1 to fail 3 times", func() bool { return get(t, s, "A-1").Attempts >= 3 })
	a1 := get(t, s, "A-1")
	if a1.Status != retry.StatusPending || !strings.Contains(a1.LastError, topic) || !strings.Contains(a1.LastError, "create the topic") {
		t.Errorf("A-1 = status %q, last error %q; want pending, naming the topic and the fix", a1.Status, a1.LastError)
	}
	if a1.ReasonCode != sink.CodeTopicNotCreated {
		t.Errorf("A-1 reason code = %q; want %q, the sink's", a1.ReasonCode, sink.CodeTopicNotCreated)
	}
	if wait := time.Until(a1.NextAttemptAt); wait > 400*time.Millisecond {
		t.Errorf("A-1 next attempt in %s; want at most BackoffMax 400ms", wait)
	}
	for _, id := range []string{"A-2", "A-3", "A-4", "A-5"} {
		if e := get(t, s, id); e.Attempts != 0 || !e.Waiting || e.Status != retry.StatusPending {
			t.Errorf("%s = attempts %d waiting %v status %q; want untouched behind A-1", id, e.Attempts, e.Waiting, e.Status)
		}
	}
	if dl.has("") || len(dl.aggs) != 0 {
		t.Errorf("Delivered called with %q before anything was delivered", dl.aggs)
	}

	kc.CreateTopic(t, topic, 4)
	waitFor(t, 30*time.Second, "the table to empty", empty(t, s))
	if got, want := ids(kc.ReadAll(t, topic), "A"), []string{"A-1", "A-2", "A-3", "A-4", "A-5"}; !slices.Equal(got, want) {
		t.Errorf("topic holds %q; want %q in order", got, want)
	}
	if agg := (ev.Lane{Topic: topic, Key: "A"}).String(); !dl.has(agg) {
		t.Errorf("Delivered calls = %q; want %q", dl.aggs, agg)
	}
	st := w.Stats()
	if st.Succeeded != 5 || st.Attempted < 8 || st.DeadLettered != 0 {
		t.Errorf("Stats() = %+v; want 5 succeeded, ≥8 attempted (3 failures + 5), 0 dead", st)
	}
}

// TestWorkerMissingTopicWaitsPerTopic: many aggregates waiting for one
// missing topic wait for it together. Before, each head was claimed and
// failed on its own, again after its own backoff: 100,000 waiting aggregates
// kept the worker (and Postgres) busy without pause (issue 34). Now one head
// probes the topic per topic backoff, and all are delivered once it exists.
func TestWorkerMissingTopicWaitsPerTopic(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	// A row of another slot's relay, same table and topic: never postponed
	// by this worker (it is not this relay's to touch).
	other, err := retry.NewStore(pg.Pool(t), "", "other_slot")
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Insert(ctx, []retry.Event{event(topic, "B", "B-1")}); err != nil {
		t.Fatal(err)
	}
	otherDue := get(t, other, "B-1").NextAttemptAt
	const aggregates = 200
	var events []retry.Event
	for i := range aggregates {
		events = append(events, aggregateEvents(topic, fmt.Sprintf("A%d", i), 2)...)
	}
	if err := s.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic)
	cfg.BackoffMin, cfg.BackoffMax = time.Second, 2*time.Second
	w := startWorker(t, cfg)

	const span = 4 * time.Second
	time.Sleep(span)
	// One probe per topic backoff (1-2 s) in span; each head on its own
	// would have been tried at least once.
	if st := w.Stats(); st.Attempted < 1 || st.Attempted > 10 {
		t.Errorf("attempts in %s with %d aggregates waiting for missing topic %s = %d; want 1 to 10 (the topic probed, not every row)",
			span, aggregates, topic, st.Attempted)
	}
	if b := get(t, other, "B-1"); !b.NextAttemptAt.Equal(otherDue) || b.Attempts != 0 {
		t.Errorf("another slot's row: next attempt %s (was %s), attempts %d; want it untouched", b.NextAttemptAt, otherDue, b.Attempts)
	}
	kc.CreateTopic(t, topic, 4)
	waitFor(t, 30*time.Second, "the table to empty", empty(t, s))
	msgs := kc.ReadAll(t, topic)
	if len(msgs) != 2*aggregates {
		t.Fatalf("topic holds %d messages; want %d", len(msgs), 2*aggregates)
	}
	for i := range aggregates {
		key := fmt.Sprintf("A%d", i)
		if got, want := ids(msgs, key), []string{key + "-1", key + "-2"}; !slices.Equal(got, want) {
			t.Errorf("aggregate %s: topic holds %q; want %q in order", key, got, want)
		}
	}
}

// TestWorkerDeadAndRequeue: MaxAttempts and MaxAge send a failing row dead;
// a dead row keeps blocking its aggregate; after a requeue it is delivered,
// and the row behind it too.
func TestWorkerDeadAndRequeue(t *testing.T) {
	tests := []struct {
		name string
		edit func(*retry.WorkerConfig)
	}{
		{"max attempts", func(c *retry.WorkerConfig) { c.MaxAttempts = 2 }},
		{"max age", func(c *retry.WorkerConfig) { c.MaxAge = 700 * time.Millisecond }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := newStore(t)
			kc := testenv.Kafka(t)
			topic := testenv.UniqueName(t, "retry")
			if err := s.Insert(ctx, aggregateEvents(topic, "A", 2)); err != nil {
				t.Fatal(err)
			}
			cfg := fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic)
			tt.edit(&cfg)
			w := startWorker(t, cfg)
			waitFor(t, 20*time.Second, "A-1 to go dead", func() bool { return get(t, s, "A-1").Status == retry.StatusDead })
			if st := w.Stats(); st.DeadLettered != 1 {
				t.Errorf("Stats().DeadLettered = %d; want 1", st.DeadLettered)
			}
			kc.CreateTopic(t, topic, 1)
			// Dead blocks: nothing moves until the operator requeues. The
			// wait also outlasts the sink client's metadata cache (kgo's
			// MetadataMinAge, 5s; kafka-go's was 6s), which would otherwise
			// still call the new topic unknown and send the requeued row
			// dead again at once with MaxAttempts 2.
			time.Sleep(6500 * time.Millisecond)
			if n := len(list(t, s, retry.Filter{})); n != 2 {
				t.Fatalf("%d rows left while A-1 is dead; want 2 (A-2 must wait behind it)", n)
			}
			if _, err := s.Requeue(ctx, []string{"A-1"}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 20*time.Second, "the table to empty", empty(t, s))
			if got, want := ids(kc.ReadAll(t, topic), "A"), []string{"A-1", "A-2"}; !slices.Equal(got, want) {
				t.Errorf("topic holds %q; want %q", got, want)
			}
		})
	}
}

// TestWorkerPermanent: a message larger than the broker accepts goes dead
// at once, with a reason that says so; an unroutable event too.
func TestWorkerPermanent(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	kc.CreateTopic(t, topic, 1)
	big := event(topic, "A", "big")
	big.Value = bytes.Repeat([]byte("x"), 2<<20)
	unroutable := event(topic, "B", "unroutable")
	unroutable.AggregateType = "Bad"
	if err := s.Insert(ctx, []retry.Event{big, unroutable}); err != nil {
		t.Fatal(err)
	}
	route := func(aggregateType, eventType string) (string, error) {
		if aggregateType == "Bad" {
			return "", &router.RouteError{Code: router.CodeTopicInvalid, Reason: "topic template yields an illegal name"}
		}
		return topic, nil
	}
	// The sink must send it for the broker to refuse it.
	w := startWorker(t, fastConfig(s, newSink(t, kc.Brokers, 8<<20), route))
	waitFor(t, 20*time.Second, "both rows to go dead", func() bool {
		return len(list(t, s, retry.Filter{Status: retry.StatusDead})) == 2
	})
	if e := get(t, s, "big"); e.Attempts != 1 || !strings.Contains(e.LastError, "larger than Kafka accepts") {
		t.Errorf("big = attempts %d, last error %q; want 1 attempt and a reason about size", e.Attempts, e.LastError)
	}
	if e := get(t, s, "big"); e.ReasonCode != sink.CodeMessageTooLarge {
		t.Errorf("big reason code = %q; want %q", e.ReasonCode, sink.CodeMessageTooLarge)
	}
	if e := get(t, s, "unroutable"); e.Attempts != 1 || !strings.Contains(e.LastError, "illegal name") || e.ReasonCode != router.CodeTopicInvalid {
		t.Errorf("unroutable = attempts %d, last error %q, code %q; want 1 attempt and the router's reason and code", e.Attempts, e.LastError, e.ReasonCode)
	}
	if st := w.Stats(); st.DeadLettered != 2 || st.Succeeded != 0 {
		t.Errorf("Stats() = %+v; want 2 dead, 0 succeeded", st)
	}
}

// TestWorkerKafkaUnreachable: attempts that time out because no broker
// answers are not counted, and nothing goes dead.
func TestWorkerKafkaUnreachable(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if err := s.Insert(ctx, aggregateEvents("orders", "A", 2)); err != nil {
		t.Fatal(err)
	}
	cfg := fastConfig(s, newSink(t, []string{"127.0.0.1:1"}, 0), (&topicOf{topic: "orders"}).Topic)
	cfg.AttemptTimeout = 300 * time.Millisecond
	cfg.MaxAttempts = 1
	cfg.MaxAge = time.Millisecond
	w := startWorker(t, cfg)
	time.Sleep(2 * time.Second)
	for _, e := range list(t, s, retry.Filter{}) {
		if e.Attempts != 0 || e.Status != retry.StatusPending {
			t.Errorf("%s after 2s of outage = attempts %d status %q; want 0, pending", e.EventKey, e.Attempts, e.Status)
		}
	}
	if st := w.Stats(); st != (retry.WorkerStats{}) {
		t.Errorf("Stats() = %+v; want all zero", st)
	}
}

// TestTwoWorkers: two Workers on one table, as two relay processes, deliver
// each of 500 rows across 50 aggregates exactly once and in per-aggregate
// order.
func TestTwoWorkers(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	kc.CreateTopic(t, topic, 4)
	const aggregates, perAggregate = 50, 10
	// Interleaved across aggregates, as the pipeline would insert them.
	var events []retry.Event
	for i := 1; i <= perAggregate; i++ {
		for a := range aggregates {
			key := fmt.Sprintf("agg%02d", a)
			e := event(topic, key, fmt.Sprintf("%s-%d", key, i))
			e.Waiting = i > 1
			events = append(events, e)
		}
	}
	if err := s.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	var workers []*retry.Worker
	for range 2 {
		cfg := fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic)
		cfg.BatchSize = 3 // several batches per aggregate
		workers = append(workers, startWorker(t, cfg))
	}
	waitFor(t, 60*time.Second, "the table to empty", empty(t, s))
	msgs := kc.ReadAll(t, topic)
	if len(msgs) != aggregates*perAggregate {
		t.Errorf("topic holds %d messages; want %d", len(msgs), aggregates*perAggregate)
	}
	for a := range aggregates {
		key := fmt.Sprintf("agg%02d", a)
		var want []string
		for i := 1; i <= perAggregate; i++ {
			want = append(want, fmt.Sprintf("%s-%d", key, i))
		}
		if got := ids(msgs, key); !slices.Equal(got, want) {
			t.Errorf("aggregate %s arrived as %q; want %q", key, got, want)
		}
	}
	s0, s1 := workers[0].Stats(), workers[1].Stats()
	if s0.Succeeded+s1.Succeeded != aggregates*perAggregate || s0.Succeeded == 0 || s1.Succeeded == 0 {
		t.Errorf("workers delivered %d + %d; want %d in all, shared by both", s0.Succeeded, s1.Succeeded, aggregates*perAggregate)
	}
}

// TestWorkerCommittedGate: with Committed set (exactly-once delivery), a row
// whose transaction is not yet committed downstream waits, and holds back
// the rows behind it; a row without a source LSN goes. Unpark deletes the
// rows of transactions from a position on.
func TestWorkerCommittedGate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	kc.CreateTopic(t, topic, 1)
	events := aggregateEvents(topic, "A", 3) // A-1 at 0/100, A-2 at 0/200, A-3 at 0/300
	for i := range events {
		events[i].SourceLSN = pglogrepl.LSN(0x100 * (i + 1))
	}
	unknown := event(topic, "B", "B-1") // no source LSN
	if err := s.Insert(ctx, append(events, unknown)); err != nil {
		t.Fatal(err)
	}
	var committed atomic.Uint64
	committed.Store(0x150)
	cfg := fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic)
	cfg.Committed = func() pglogrepl.LSN { return pglogrepl.LSN(committed.Load()) }
	startWorker(t, cfg)
	waitFor(t, 20*time.Second, "A-1 and B-1 delivered", func() bool { return len(list(t, s, retry.Filter{})) == 2 })
	time.Sleep(300 * time.Millisecond) // several polls: must stay
	if left := eventKeys(list(t, s, retry.Filter{})); !slices.Equal(left, []string{"A-2", "A-3"}) {
		t.Fatalf("retry table holds %q; want A-2 and A-3, not committed downstream", left)
	}
	// A former leader's Unpark (its hold refused) deletes nothing.
	fenced := errors.New("fenced")
	if n, err := s.Unpark(ctx, 0x300, func(context.Context, pgx.Tx) error { return fenced }); n != 0 || !errors.Is(err, fenced) {
		t.Fatalf("Unpark(0/300) refused by its hold = %d, %v; want 0 rows, the hold's error", n, err)
	}
	if left := eventKeys(list(t, s, retry.Filter{})); !slices.Equal(left, []string{"A-2", "A-3"}) {
		t.Fatalf("after a refused Unpark the retry table holds %q; want A-2 and A-3", left)
	}
	n, err := s.Unpark(ctx, 0x300, nil)
	if err != nil || n != 1 {
		t.Fatalf("Unpark(0/300) = %d, %v; want A-3's row deleted", n, err)
	}
	committed.Store(0x1000)
	waitFor(t, 20*time.Second, "the table to empty", empty(t, s))
	if got, want := ids(kc.ReadAll(t, topic), "A"), []string{"A-1", "A-2"}; !slices.Equal(got, want) {
		t.Errorf("topic holds %q; want %q in order", got, want)
	}
}
