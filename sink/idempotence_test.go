package sink_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/faults"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// proxied returns a proxy to the test broker and a sink config whose every
// connection goes through it (the broker's advertised address would bypass
// a proxy given as bootstrap address alone).
func proxied(t *testing.T, kc *testenv.KafkaCluster, cfg kafkaclient.Config) (*faults.Proxy, kafkaclient.Config) {
	t.Helper()
	px, err := faults.Listen("127.0.0.1:0", kc.Brokers[0])
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- px.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("proxy: %v", err)
		}
	})
	var d net.Dialer
	cfg.Brokers = []string{px.Addr()}
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, px.Addr())
	}
	return px, cfg
}

// seqMsgs are n messages of one key, values "v<from>" … in order.
func seqMsgs(topic string, from, n int) []event.Event {
	out := make([]event.Event, n)
	for i := range out {
		out[i] = event.Event{Topic: topic, Key: []byte("k"), Value: fmt.Appendf(nil, "v%d", from+i), Time: time.Now()}
	}
	return out
}

// values returns the partition's values in offset order.
func values(t *testing.T, kc *testenv.KafkaCluster, topic string) []string {
	t.Helper()
	var out []string
	for _, m := range kc.ReadAll(t, topic) {
		out = append(out, string(m.Value))
	}
	return out
}

// wantValues checks got is exactly v<0> … v<n-1>, in order, once each.
func wantValues(t *testing.T, got []string, n int) {
	t.Helper()
	if len(got) != n {
		t.Errorf("partition holds %d records; want %d, once each: %q", len(got), n, got)
	}
	for i := range min(n, len(got)) {
		if want := fmt.Sprintf("v%d", i); got[i] != want {
			t.Errorf("record %d = %q; want %q (order or duplicates wrong): %q", i, got[i], want, got)
			return
		}
	}
}

// A produce whose acknowledgement is lost (the broker appended the batch, the
// reply never arrives, the connection is cut) is sent again and stored once,
// in order. With idempotence off the same fault stores it twice: proof that
// the fault hit after the append.
func TestKafkaLostAckStoredOnce(t *testing.T) {
	kc := testenv.Kafka(t)
	for _, tt := range []struct {
		name        string
		disable     bool
		compression string
		duplicates  bool
	}{
		{name: "idempotent", duplicates: false},
		{name: "idempotent zstd", compression: "zstd", duplicates: false},
		{name: "idempotent gzip", compression: "gzip", duplicates: false},
		{name: "not idempotent", disable: true, duplicates: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topic := testenv.UniqueName(t, "idem")
			kc.CreateTopic(t, topic, 1)
			px, cfg := proxied(t, kc, kafkaclient.Config{WriteTimeout: 3 * time.Second,
				DisableIdempotence: tt.disable, Compression: tt.compression})
			k := newSink(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := k.Write(ctx, seqMsgs(topic, 0, 10)); err != nil {
				t.Fatalf("Write = %v", err)
			}
			px.DropReplies(1)
			if err := k.Write(ctx, seqMsgs(topic, 10, 10)); err != nil {
				t.Fatalf("Write with a lost acknowledgement = %v; want nil after a resend", err)
			}
			if n := px.Dropped(); n != 0 {
				t.Fatalf("%d replies still to drop; the fault did not happen", n)
			}
			if err := k.Write(ctx, seqMsgs(topic, 20, 10)); err != nil {
				t.Fatalf("Write = %v", err)
			}
			got := values(t, kc, topic)
			if !tt.duplicates {
				wantValues(t, got, 30)
				if s := k.Stats(); s.ProducerResets != 0 {
					t.Errorf("Stats().ProducerResets = %d; want 0: a resend keeps its producer id", s.ProducerResets)
				}
				return
			}
			// Without idempotence: v10..v19 twice, the pattern the README used to warn of.
			if len(got) != 40 {
				t.Errorf("not idempotent: partition holds %d records; want 40 (the lost batch twice): %q", len(got), got)
			}
		})
	}
}

// When the sink gives up on a batch whose outcome is unknown (its caller's
// context ends while acknowledgements are lost), the next batch for that
// partition takes a new producer id: sent with the abandoned batch's sequence
// numbers, other records would be taken for it and dropped by the broker.
// The next batch has as many records as the abandoned one, so that a reused
// sequence would look like a duplicate to the broker and lose it.
func TestKafkaGaveUpBatchNewProducerID(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "idem")
	kc.CreateTopic(t, topic, 1)
	px, cfg := proxied(t, kc, kafkaclient.Config{WriteTimeout: 2 * time.Second,
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
	k := newSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.Write(ctx, seqMsgs(topic, 0, 10)); err != nil {
		t.Fatalf("Write = %v", err)
	}
	px.DropReplies(1000)
	short, cancelShort := context.WithTimeout(ctx, 1500*time.Millisecond)
	abandoned := seqMsgs(topic, 10, 10)
	for i := range abandoned {
		abandoned[i].Value = fmt.Appendf(nil, "abandoned%d", i)
	}
	err := k.Write(short, abandoned)
	cancelShort()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write while every acknowledgement is lost = %v; want the context's deadline", err)
	}
	// Requests the cancelled Write left running end with their replies
	// dropped too (3 quick attempts each), so that the abandoned batch's
	// outcome stays unknown to the sink.
	time.Sleep(2 * time.Second)
	px.DropReplies(0)
	if err := k.Write(ctx, seqMsgs(topic, 10, 10)); err != nil {
		t.Fatalf("Write after the abandoned one = %v", err)
	}
	// kgo never gives up a batch whose outcome is unknown: it resends it
	// with its sequence numbers until answered, and the next write waits
	// for it, so no new producer id is taken.
	if s := k.Stats(); s.ProducerResets != 0 {
		t.Errorf("Stats().ProducerResets = %d; want 0 (the abandoned batch resent under its producer id)", s.ProducerResets)
	}
	// The abandoned batch may be stored (once: its resends were deduplicated)
	// or not; everything acknowledged is there, in order.
	var got []string
	abandonedSeen := 0
	for _, v := range values(t, kc, topic) {
		if len(v) > 9 && v[:9] == "abandoned" {
			abandonedSeen++
			continue
		}
		got = append(got, v)
	}
	wantValues(t, got, 20)
	if abandonedSeen != 0 && abandonedSeen != 10 {
		t.Errorf("abandoned batch stored %d times over its 10 records; want 0 or 10 (whole, once)", abandonedSeen)
	}
	t.Logf("abandoned batch: %d records stored", abandonedSeen)
}

// killableSink is a sink with short timeouts and retries and a new topic of
// two partitions named under prefix, for a test that kills and freezes the
// broker (killAndPause): it holds Exclusive.
func killableSink(t *testing.T, prefix string) (*testenv.KafkaCluster, string, *sink.Kafka) {
	t.Helper()
	testenv.Exclusive(t)
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, prefix)
	kc.CreateTopic(t, topic, 2)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, WriteTimeout: 2 * time.Second,
		RetryMin: 50 * time.Millisecond, RetryMax: time.Second})
	return kc, topic, k
}

// killAndPause kills the broker (kill -9) and starts it again, then freezes
// it for longer than a WriteTimeout of 2s, while a writer runs; it fails the
// test if the writer stops (sends on done) meanwhile.
func killAndPause(t *testing.T, done <-chan error) {
	t.Helper()
	running := func(d time.Duration) {
		select {
		case err := <-done:
			t.Fatalf("writer stopped: %v", err)
		case <-time.After(d):
		}
	}
	running(time.Second)
	testenv.StopKafka(t)
	running(500 * time.Millisecond)
	testenv.StartKafka(t)
	running(2 * time.Second)
	paused := true
	testenv.PauseKafka(t)
	t.Cleanup(func() {
		if paused {
			testenv.ResumeKafka(t)
		}
	})
	running(5 * time.Second) // beyond WriteTimeout: requests time out mid-produce
	testenv.ResumeKafka(t)
	paused = false
	running(2 * time.Second)
}

// Broker killed (kill -9) and frozen while a writer produces continuously:
// the sink's resends of batches whose acknowledgement never came are stored
// once; every key's values arrive exactly once, in order.
func TestKafkaKillAndPauseNoDuplicates(t *testing.T) {
	kc, topic, k := killableSink(t, "idem")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	kd := &keyed{topic: topic, keys: 4, perWrite: 20}
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		for !stop.Load() {
			if err := k.Write(ctx, kd.batch()); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	killAndPause(t, done)
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	kd.check(t, kc) // no duplicates from the sink's resends, nothing lost, in order
	s := k.Stats()
	t.Logf("written %v per key; retries %d, broker errors %d, producer resets %d", kd.next, s.Retries, s.BrokerErrors, s.ProducerResets)
	if s.BrokerErrors == 0 {
		t.Errorf("Stats().BrokerErrors = 0: the faults did not hit a produce")
	}
}
