package retry_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ev "github.com/outbox-relay/outbox-relay/event"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// byType routes each aggregate type to its own topic.
func byType(topics map[string]string) func(string, string) (string, error) {
	return func(aggregateType, _ string) (string, error) {
		if t, ok := topics[aggregateType]; ok {
			return t, nil
		}
		return "", fmt.Errorf("no topic for %q", aggregateType)
	}
}

// typed is event with its aggregate type set.
func typed(aggregateType, topic, key, id string) retry.Event {
	e := event(topic, key, id)
	e.AggregateType = aggregateType
	return e
}

// TestWorkerHeaders: the Worker sends the relay's own headers from the
// row's columns, exactly once, then the stored extras: for a row stored
// without headers (an event that failed routing), one of an earlier version
// holding all headers (the relay's own included), and one with extras only.
func TestWorkerHeaders(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "retry")
	kc.CreateTopic(t, topic, 1)

	none := event(topic, "A", "none")
	none.Extra = nil
	old := event(topic, "B", "old")
	old.Extra = []retry.Header{{Key: "id", Value: []byte("old")}, {Key: "event_type", Value: []byte("Created")},
		{Key: "aggregate_type", Value: []byte("Order")}, {Key: "trace", Value: []byte("t-old")}}
	extra := event(topic, "C", "extra")
	extra.Extra = []retry.Header{{Key: "trace", Value: []byte("t\x00\xff")}, {Key: "id", Value: []byte("forged")},
		{Key: "tenant", Value: nil}}
	if err := s.Insert(ctx, []retry.Event{none, old, extra}); err != nil {
		t.Fatal(err)
	}
	startWorker(t, fastConfig(s, newSink(t, kc.Brokers, 0), (&topicOf{topic: topic}).Topic))
	waitFor(t, 30*time.Second, "the table to empty", empty(t, s))

	want := map[string][]testenv.Header{
		"A": {{Key: "id", Value: []byte("none")}, {Key: "event_type", Value: []byte("Created")}, {Key: "aggregate_type", Value: []byte("Order")}},
		"B": {{Key: "id", Value: []byte("old")}, {Key: "event_type", Value: []byte("Created")}, {Key: "aggregate_type", Value: []byte("Order")},
			{Key: "trace", Value: []byte("t-old")}},
		"C": {{Key: "id", Value: []byte("extra")}, {Key: "event_type", Value: []byte("Created")}, {Key: "aggregate_type", Value: []byte("Order")},
			{Key: "trace", Value: []byte("t\x00\xff")}, {Key: "tenant", Value: nil}},
	}
	msgs := kc.ReadAll(t, topic)
	if len(msgs) != 3 {
		t.Fatalf("topic holds %d messages; want 3", len(msgs))
	}
	for _, m := range msgs {
		// A null header value may read back as empty (kafka-go's reader made
		// it so): compare bytes.
		if !slices.EqualFunc(m.Headers, want[string(m.Key)], func(a, b testenv.Header) bool {
			return a.Key == b.Key && bytes.Equal(a.Value, b.Value)
		}) {
			t.Errorf("message %s headers = %q; want %q", m.Key, m.Headers, want[string(m.Key)])
		}
	}
}

// TestWorkerMissingTopicIsolated: aggregate A's row goes to a topic that
// does not exist (auto-creation off), aggregate B's to one that does. B is
// delivered at once; A stays pending, with a readable reason and growing
// attempts.
func TestWorkerMissingTopicIsolated(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	missing, exists := testenv.UniqueName(t, "missing"), testenv.UniqueName(t, "exists")
	kc.CreateTopic(t, exists, 1)
	events := []retry.Event{typed("Missing", missing, "A", "A-1"), typed("Missing", missing, "A", "A-2")}
	for i := 1; i <= 3; i++ {
		events = append(events, typed("Exists", exists, "B", fmt.Sprintf("B-%d", i)))
	}
	events[1].Waiting = true
	if err := s.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	startWorker(t, fastConfig(s, newSink(t, kc.Brokers, 0), byType(map[string]string{"Missing": missing, "Exists": exists})))
	waitFor(t, 10*time.Second, "B's rows to be delivered", func() bool { return len(list(t, s, retry.Filter{})) == 2 })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("B delivered after %s; want within a few seconds", d)
	}
	if got := ids(kc.ReadAll(t, exists), "B"); !slices.Equal(got, []string{"B-1", "B-2", "B-3"}) {
		t.Errorf("topic %s holds %q; want B-1..B-3 in order", exists, got)
	}
	waitFor(t, 10*time.Second, "A-1 to fail 3 times", func() bool { return get(t, s, "A-1").Attempts >= 3 })
	a1 := get(t, s, "A-1")
	if a1.Status != retry.StatusPending || !strings.Contains(a1.LastError, missing) || !strings.Contains(a1.LastError, "does not exist") {
		t.Errorf("A-1 = status %q, last error %q; want pending, saying the topic does not exist", a1.Status, a1.LastError)
	}
	if a2 := get(t, s, "A-2"); a2.Attempts != 0 || a2.Status != retry.StatusPending {
		t.Errorf("A-2 = attempts %d status %q; want untouched behind A-1", a2.Attempts, a2.Status)
	}
}

// fakeSink writes to memory, except that a Write with a message for topic
// stuck blocks until its context ends, as sink.Kafka does when a topic's
// metadata never settles. Ping answers pingErr.
type fakeSink struct {
	stuck   string
	pingErr error

	mu      sync.Mutex
	written []ev.Event
	pings   int
}

func (f *fakeSink) Write(ctx context.Context, msgs []ev.Event) error {
	for _, m := range msgs {
		if m.Topic == f.stuck {
			<-ctx.Done()
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.written = append(f.written, msgs...)
	return nil
}

func (f *fakeSink) Ping(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pings++
	return f.pingErr
}

func (f *fakeSink) keys() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, m := range f.written {
		out = append(out, string(m.Key))
	}
	return out
}

// TestWorkerTimeoutIsRowFailure: a Write that blocks until the attempt
// times out while Kafka answers a ping is the row's own failure: its
// attempts grow with backoff, and another aggregate's row is delivered
// meanwhile. When the ping fails too, it is an outage: nothing is counted.
func TestWorkerTimeoutIsRowFailure(t *testing.T) {
	t.Run("kafka answers", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := newStore(t)
		events := []retry.Event{typed("Stuck", "col.x", "A", "A-1"), typed("Stuck", "col.x", "A", "A-2"),
			typed("Fine", "fine", "B", "B-1")}
		events[1].Waiting = true
		if err := s.Insert(ctx, events); err != nil {
			t.Fatal(err)
		}
		fs := &fakeSink{stuck: "col.x"}
		cfg := fastConfig(s, fs, byType(map[string]string{"Stuck": "col.x", "Fine": "fine"}))
		cfg.AttemptTimeout = 200 * time.Millisecond
		w := startWorker(t, cfg)
		waitFor(t, 10*time.Second, "B-1 to be delivered and A-1 to fail twice", func() bool {
			return slices.Equal(fs.keys(), []string{"B"}) && get(t, s, "A-1").Attempts >= 2
		})
		a1 := get(t, s, "A-1")
		if a1.Status != retry.StatusPending || !strings.Contains(a1.LastError, `"col.x"`) || !strings.Contains(a1.LastError, "did not finish") {
			t.Errorf("A-1 = status %q, last error %q; want pending, naming the topic and the timeout", a1.Status, a1.LastError)
		}
		if a2 := get(t, s, "A-2"); a2.Attempts != 0 {
			t.Errorf("A-2 attempts = %d; want 0 (waiting behind A-1)", a2.Attempts)
		}
		if st := w.Stats(); st.Succeeded != 1 || st.Attempted < 3 {
			t.Errorf("Stats() = %+v; want 1 succeeded, ≥3 attempted", st)
		}
	})
	t.Run("kafka unreachable", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		s := newStore(t)
		if err := s.Insert(ctx, []retry.Event{typed("Stuck", "col.x", "A", "A-1")}); err != nil {
			t.Fatal(err)
		}
		fs := &fakeSink{stuck: "col.x", pingErr: errors.New("no broker answers")}
		cfg := fastConfig(s, fs, byType(map[string]string{"Stuck": "col.x"}))
		cfg.AttemptTimeout = 200 * time.Millisecond
		cfg.MaxAttempts = 1
		startWorker(t, cfg)
		waitFor(t, 10*time.Second, "two pings", func() bool {
			fs.mu.Lock()
			defer fs.mu.Unlock()
			return fs.pings >= 2
		})
		if a1 := get(t, s, "A-1"); a1.Attempts != 0 || a1.Status != retry.StatusPending {
			t.Errorf("A-1 during an outage = attempts %d status %q; want 0, pending", a1.Attempts, a1.Status)
		}
	})
}

// TestWorkerLastResortStaysDead: a requeued last-resort record is not
// delivered (its columns do not hold the event): it goes dead again with a
// reason, and still blocks its aggregate; other aggregates go on.
func TestWorkerLastResortStaysDead(t *testing.T) {
	ctx := context.Background()
	s, pg := newStoreIn(t)
	pg.Exec(t, `ALTER TABLE outbox_relay_retry ADD CONSTRAINT no_poison CHECK (value IS DISTINCT FROM 'poison'::bytea)`)
	poison, behind, other := event("orders", "A", "A-1"), event("orders", "A", "A-2"), event("orders", "B", "B-1")
	poison.Value, behind.Waiting = []byte("poison"), true
	if err := s.Insert(ctx, []retry.Event{poison, behind, other}); err != nil {
		t.Fatal(err)
	}
	if !get(t, s, "A-1").LastResort {
		t.Fatal("A-1 is not a last-resort record")
	}
	if _, err := s.Requeue(ctx, []string{"A-1"}); err != nil {
		t.Fatal(err)
	}
	fs := &fakeSink{}
	w := startWorker(t, fastConfig(s, fs, (&topicOf{topic: "orders"}).Topic))
	waitFor(t, 10*time.Second, "A-1 to go dead again", func() bool { return get(t, s, "A-1").Status == retry.StatusDead })
	waitFor(t, 10*time.Second, "B-1 to be delivered", func() bool { return slices.Equal(fs.keys(), []string{"B"}) })
	time.Sleep(300 * time.Millisecond) // several polls
	a1 := get(t, s, "A-1")
	if a1.Attempts != 1 || !strings.Contains(a1.LastError, "last-resort record") || !strings.Contains(a1.LastError, "never deliver") &&
		!strings.Contains(a1.LastError, "cannot deliver") {
		t.Errorf("A-1 = attempts %d, last error %q; want 1 attempt, saying it cannot be delivered", a1.Attempts, a1.LastError)
	}
	if got := fs.keys(); !slices.Equal(got, []string{"B"}) {
		t.Errorf("written keys = %q; want only B (A-1 undeliverable, A-2 behind it)", got)
	}
	if st := w.Stats(); st.DeadLettered != 1 {
		t.Errorf("Stats().DeadLettered = %d; want 1", st.DeadLettered)
	}
}

// TestWorkerCollidingTopic: with auto-creation on, a topic whose name
// collides with an existing one's ('.' and '_' map to the same metric name)
// can never be written. The row fails on its own, whether the sink reports
// the collision or blocks until the attempt times out (it was once taken for
// a Kafka outage and claimed again forever), and another aggregate's row
// goes.
func TestWorkerCollidingTopic(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	kc := testenv.Kafka(t)
	base := testenv.UniqueName(t, "col")
	kc.CreateTopic(t, base+"_x", 1)
	fine := base + "_fine"
	kc.CreateTopic(t, fine, 1)
	if err := s.Insert(ctx, []retry.Event{typed("Col", base+".x", "A", "A-1"), typed("Fine", fine, "B", "B-1")}); err != nil {
		t.Fatal(err)
	}
	k, err := sink.New(kafkaclient.Config{Brokers: kc.Brokers, AllowAutoTopicCreation: true,
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	cfg := fastConfig(s, k, byType(map[string]string{"Col": base + ".x", "Fine": fine}))
	cfg.AttemptTimeout = 2 * time.Second
	startWorker(t, cfg)
	waitFor(t, 20*time.Second, "B-1 to be delivered and A-1 to fail", func() bool {
		_, err := s.Get(ctx, "B-1")
		return errors.Is(err, retry.ErrNotFound) && get(t, s, "A-1").Attempts >= 1
	})
	a1 := get(t, s, "A-1")
	if !strings.Contains(a1.LastError, base+".x") {
		t.Errorf("A-1 last error %q; want it to name the topic", a1.LastError)
	}
}

// TestWorkerRefusesWhatTheRouterRefuses: a requeued event without an
// aggregate id (the router refused it: no key, no order) is not delivered
// with an empty key; it goes dead again saying why.
func TestWorkerRefusesWhatTheRouterRefuses(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	noKey := event("orders", "", "A-1")
	noKey.Aggregate = ev.UnroutableLane("Order", "").String()
	noKey.Permanent = true
	if err := s.Insert(ctx, []retry.Event{noKey, event("orders", "B", "B-1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Requeue(ctx, []string{"A-1"}); err != nil {
		t.Fatal(err)
	}
	fs := &fakeSink{}
	startWorker(t, fastConfig(s, fs, (&topicOf{topic: "orders"}).Topic))
	waitFor(t, 10*time.Second, "B-1 delivered and A-1 dead again", func() bool {
		a1 := get(t, s, "A-1")
		return slices.Equal(fs.keys(), []string{"B"}) && a1.Status == retry.StatusDead && a1.Attempts == 1
	})
	if a1 := get(t, s, "A-1"); !strings.Contains(a1.LastError, "no aggregate id") {
		t.Errorf("A-1 last error %q; want it to say the event has no aggregate id", a1.LastError)
	}
	if got := fs.keys(); !slices.Equal(got, []string{"B"}) {
		t.Errorf("written keys = %q; want only B", got)
	}
}
