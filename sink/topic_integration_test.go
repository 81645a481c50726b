package sink_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// topicExists reports whether the broker lists topic, asking it directly.
func topicExists(t *testing.T, brokers []string, topic string) bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// kadm's Metadata never asks the broker to create the topic.
	md, err := kadm.NewClient(cl).Metadata(ctx, topic)
	if err != nil {
		t.Fatalf("metadata of %s: %v", topic, err)
	}
	td, ok := md.Topics[topic]
	return ok && td.Err == nil && len(td.Partitions) > 0
}

// writeMixed writes good, bad, good, bad, good (the bad ones with keys of
// their own, so neither waits behind the other with ErrBehind) and checks
// that the good ones were acknowledged, the bad ones failed with an error
// containing every string of want, permanent as wanted, and that Write
// returned within limit.
func writeMixed(t *testing.T, k *sink.Kafka, kc *testenv.KafkaCluster, good, bad string, limit time.Duration, permanent bool, target error, want ...string) []sink.Failure {
	t.Helper()
	in := msgs(good, 5, 2)
	in[1].Topic, in[3].Topic = bad, bad
	in[3].Key = []byte("agg-3")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	err := k.Write(ctx, in)
	if d := time.Since(start); d > limit {
		t.Errorf("Write took %s; want it back within %s", d, limit)
	}
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) != 2 || werr.Failures[0].Index != 1 || werr.Failures[1].Index != 3 {
		t.Fatalf("Write = %v; want Failures at 1 and 3 (topic %q)", err, bad)
	}
	for _, f := range werr.Failures {
		if got := f.Permanent; got != permanent {
			t.Errorf("Permanent(%v) = %t; want %t", f.Err, got, permanent)
		}
		if !errors.Is(f.Err, target) {
			t.Errorf("Failure{%d, %v}: want errors.Is %v", f.Index, f.Err, target)
		}
		var te *sink.TopicError
		if !errors.As(f.Err, &te) || te.Topic != bad {
			t.Errorf("Failure{%d, %v}: want a *sink.TopicError for %q", f.Index, f.Err, bad)
		}
		for _, w := range want {
			if !strings.Contains(f.Err.Error(), w) {
				t.Errorf("Failure{%d}: %q; want it to contain %q", f.Index, f.Err, w)
			}
		}
	}
	var got []string
	for _, m := range kc.ReadAll(t, good) {
		got = append(got, string(m.Value))
	}
	if want := "agg-0:0 agg-0:1 agg-0:2"; strings.Join(got, " ") != want {
		t.Errorf("topic %s holds %q; want %q", good, strings.Join(got, " "), want)
	}
	if st := k.Stats(); st.BrokerErrors != 0 {
		t.Errorf("Stats().BrokerErrors = %d; want 0: a topic's trouble is not a broker outage", st.BrokerErrors)
	}
	if since, cause := k.Outage(); !since.IsZero() {
		t.Errorf("Outage() = %s, %v; want none", since, cause)
	}
	return werr.Failures
}

// A topic whose name collides with an existing one (P_x when P.x exists) can
// never be created. Kafka answers UNKNOWN_TOPIC_OR_PARTITION for it forever;
// its messages must fail on their own, permanently, in Kafka's words, and the
// other topic's messages in the same Write are acknowledged without waiting.
func TestKafkaTopicCollision(t *testing.T) {
	kc := testenv.Kafka(t)
	for _, auto := range []bool{true, false} {
		name := "auto-create off"
		if auto {
			name = "auto-create on"
		}
		t.Run(name, func(t *testing.T) {
			base := testenv.UniqueName(t, "p")
			good := base + "_good"
			kc.CreateTopic(t, good, 2)
			kc.CreateTopic(t, base+".x", 1)
			k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, AllowAutoTopicCreation: auto})
			writeMixed(t, k, kc, good, base+"_x", 4*time.Second, true, kerr.InvalidTopicException,
				"Topic '"+base+"_x' collides with existing topic: "+base+".x")
			if topicExists(t, kc.Brokers, base+"_x") {
				t.Errorf("topic %s_x exists; want it not created", base)
			}
		})
	}
}

// With auto-creation off, a plainly missing topic fails its messages at once,
// not permanently (an operator may create it and the retry table retries),
// and is not created.
func TestKafkaMissingTopicFailsFast(t *testing.T) {
	kc := testenv.Kafka(t)
	good := testenv.UniqueName(t, "good")
	missing := testenv.UniqueName(t, "missing")
	kc.CreateTopic(t, good, 2)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers})
	fails := writeMixed(t, k, kc, good, missing, 2*time.Second, false, kerr.UnknownTopicOrPartition,
		`"`+missing+`"`, "does not exist", "topic auto-creation is off")
	// The CLI names kafka.allow_auto_topic_creation by the code (cmd's reasons).
	for _, f := range fails {
		if f.Code != sink.CodeTopicNotCreated {
			t.Errorf("Failure{%d}.Code = %q; want %q", f.Index, f.Code, sink.CodeTopicNotCreated)
		}
	}
	if topicExists(t, kc.Brokers, missing) {
		t.Errorf("topic %s exists; want it not created", missing)
	}
}

// A missing topic's diagnosis (a metadata request for every topic of the
// cluster, on a connection of its own) is made once, not per write: a retry
// table of 100,000 aggregates waiting for one topic asked it 100,000 times,
// and its answers were most of the relay's memory (issue 34). A topic created
// meanwhile is still written to at once.
func TestKafkaMissingTopicDiagnosedOnce(t *testing.T) {
	kc := testenv.Kafka(t)
	missing := testenv.UniqueName(t, "missing")
	var dials atomic.Int32
	d := &net.Dialer{}
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, address)
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	write := func() error { return k.Write(ctx, msgs(missing, 1, 1)) }
	const writes = 20
	for i := range writes {
		var werr *sink.WriteError
		if err := write(); !errors.As(err, &werr) || !errors.Is(err, kerr.UnknownTopicOrPartition) {
			t.Fatalf("write %d to missing topic %s = %v; want a *sink.WriteError for an unknown topic", i, missing, err)
		}
	}
	if n := dials.Load(); n > 5 {
		t.Errorf("%d writes to a missing topic opened %d connections; want the topic diagnosed once (at most 5)", writes, n)
	}
	kc.CreateTopic(t, missing, 1)
	start := time.Now()
	for {
		err := write()
		if err == nil {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("write after topic %s was created = %v for %s; want it written within seconds", missing, err, time.Since(start))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// An invalid topic name fails its messages on their own, permanently, with or
// without auto-creation (with it off, kafka-go alone would call it unknown).
func TestKafkaInvalidTopicName(t *testing.T) {
	kc := testenv.Kafka(t)
	tests := []struct{ name, topic, want string }{
		{"space", "bad name!", `contains ' '`},
		{"too long", strings.Repeat("a", 250), "250 characters long"},
		{"dots", "..", "'.' and '..'"},
	}
	for _, auto := range []bool{true, false} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("%s auto=%t", tt.name, auto), func(t *testing.T) {
				good := testenv.UniqueName(t, "good")
				kc.CreateTopic(t, good, 1)
				k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, AllowAutoTopicCreation: auto})
				writeMixed(t, k, kc, good, tt.topic, 2*time.Second, true, kerr.InvalidTopicException, "invalid topic name", tt.want)
			})
		}
	}
}

// Ping asks a broker, not kafka-go's metadata cache: it fails within its
// timeout while the broker is frozen, even right after a successful Ping and
// Write. Outage reports the streak while a Write retries against the frozen
// broker and clears once the Write is acknowledged.
func TestKafkaPingAndOutageWhilePaused(t *testing.T) {
	begin := time.Now()
	testenv.Exclusive(t)
	kc := testenv.Kafka(t)
	t.Logf("servers held after %s", time.Since(begin))
	topic := testenv.UniqueName(t, "outage")
	kc.CreateTopic(t, topic, 2)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, WriteTimeout: time.Second,
		RetryMin: 50 * time.Millisecond, RetryMax: 500 * time.Millisecond})

	ping := func(timeout time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		start := time.Now()
		err := k.Ping(ctx)
		return time.Since(start), err
	}
	if _, err := ping(5 * time.Second); err != nil {
		t.Fatalf("Ping = %v; want nil", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := k.Write(ctx, msgs(topic, 10, 3)); err != nil {
		t.Fatalf("Write = %v", err)
	}
	if since, cause := k.Outage(); !since.IsZero() {
		t.Fatalf("Outage() = %s, %v; want none after an acknowledged write", since, cause)
	}

	paused := true
	testenv.PauseKafka(t)
	t.Cleanup(func() {
		if paused {
			testenv.ResumeKafka(t)
		}
	})
	if d, err := ping(time.Second); err == nil || d > 2*time.Second {
		t.Errorf("Ping(frozen broker, 1s) = %v after %s; want an error within about 1s", err, d)
	}

	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		werr = k.Write(ctx, msgs(topic, 10, 3))
	}()
	deadline := time.Now().Add(30 * time.Second)
	var since time.Time
	var cause error
	for since.IsZero() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		since, cause = k.Outage()
	}
	if since.IsZero() || cause == nil {
		t.Errorf("Outage() = %s, %v while Write retries against a frozen broker; want a streak with its cause", since, cause)
	}

	testenv.ResumeKafka(t)
	paused = false
	resumed := time.Now()
	wg.Wait()
	t.Logf("Write returned %s after the broker answered again", time.Since(resumed))
	if werr != nil {
		t.Fatalf("Write across the freeze = %v; want nil", werr)
	}
	if since, cause := k.Outage(); !since.IsZero() {
		t.Errorf("Outage() = %s, %v after the Write was acknowledged; want none", since, cause)
	}
	if _, err := ping(5 * time.Second); err != nil {
		t.Errorf("Ping after resume = %v; want nil", err)
	}
	t.Logf("outage seen from %s, cause %v", since.Format(time.RFC3339Nano), cause)
}
