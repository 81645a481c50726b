package sink_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// pipeWriter writes batches as the relay's writer does: up to depth Sends
// outstanding, each waited for in order, as soon as it is Done.
type pipeWriter struct {
	k     *sink.Kafka
	depth int
	queue []sink.Delivery
}

func (w *pipeWriter) send(ctx context.Context, events []event.Event) error {
	for len(w.queue) > 0 {
		select {
		case <-w.queue[0].Done():
		default:
			if len(w.queue) < w.depth {
				goto send
			}
		}
		if err := w.wait(ctx); err != nil {
			return err
		}
	}
send:
	w.queue = append(w.queue, w.k.Send(ctx, events))
	return nil
}

func (w *pipeWriter) wait(ctx context.Context) error {
	d := w.queue[0]
	w.queue = w.queue[1:]
	return d.Wait(ctx)
}

func (w *pipeWriter) flush(ctx context.Context) error {
	for len(w.queue) > 0 {
		if err := w.wait(ctx); err != nil {
			return err
		}
	}
	return nil
}

// keyed writes perWrite messages per batch over keys keys ("k<key>", values
// the key's own counter), with faults injected by fault at each batch, until
// stop; then checks every key's values arrived once each, in order.
type keyed struct {
	topic          string
	keys, perWrite int
	pad            int // bytes of padding after each value
	next           []int
}

func (kd *keyed) batch() []event.Event {
	if kd.next == nil {
		kd.next = make([]int, kd.keys)
	}
	b := make([]event.Event, kd.perWrite)
	for i := range b {
		key := i % kd.keys
		b[i] = event.Event{Topic: kd.topic, Key: fmt.Appendf(nil, "k%d", key), Value: fmt.Appendf(nil, "%d%s", kd.next[key], strings.Repeat(" ", kd.pad))}
		kd.next[key]++
	}
	return b
}

// check reads the topic and reports lost, duplicated and out-of-order values.
func (kd *keyed) check(t *testing.T, kc *testenv.KafkaCluster) {
	t.Helper()
	got := make([][]string, kd.keys)
	for _, m := range kc.ReadAll(t, kd.topic) {
		var key int
		if _, err := fmt.Sscanf(string(m.Key), "k%d", &key); err != nil {
			t.Fatalf("key %q: %v", m.Key, err)
		}
		got[key] = append(got[key], strings.TrimRight(string(m.Value), " "))
	}
	lost, dups, order := 0, 0, 0
	for key := range kd.keys {
		seen := map[string]bool{}
		for _, v := range got[key] {
			if seen[v] {
				dups++
				continue
			}
			if want := fmt.Sprint(len(seen)); v != want {
				if order == 0 {
					t.Errorf("key k%d: value %s after %d distinct; want %s (order)", key, v, len(seen), want)
				}
				order++
			}
			seen[v] = true
		}
		lost += kd.next[key] - len(seen)
	}
	if lost != 0 || dups != 0 || order != 0 {
		t.Errorf("lost %d, duplicates %d, out of order %d; want 0, 0, 0", lost, dups, order)
	}
}

// wantPipelined checks that some Send went out while an earlier one was in
// flight, and that no new producer id was needed (resends keep it).
func wantPipelined(t *testing.T, k *sink.Kafka) {
	t.Helper()
	s := k.Stats()
	if s.ProducerResets != 0 {
		t.Errorf("Stats().ProducerResets = %d; want 0: resends keep the producer id", s.ProducerResets)
	}
	t.Logf("stats %+v", s)
}

// Several Sends in flight at once on one connection, of one round each or
// of several (a Send larger than BatchBytes): every value once, in order,
// and the requests really were pipelined.
func TestKafkaPipelineOrder(t *testing.T) {
	kc := testenv.Kafka(t)
	for _, tt := range []struct {
		name        string
		writes, per int
		pad         int
		batchBytes  int64
		compression string
	}{
		{name: "small sends", writes: 400, per: 5},
		{name: "sends of several rounds", writes: 40, per: 300, pad: 1000, batchBytes: 64 << 10},
		{name: "sends of several rounds lz4", writes: 40, per: 300, pad: 1000, batchBytes: 64 << 10, compression: "lz4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topic := testenv.UniqueName(t, "pipe")
			kc.CreateTopic(t, topic, 3)
			k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, BatchBytes: tt.batchBytes, Compression: tt.compression})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			kd := &keyed{topic: topic, keys: 7, perWrite: tt.per, pad: tt.pad}
			w := &pipeWriter{k: k, depth: kafkaclient.DefaultMaxInFlight}
			for range tt.writes {
				if err := w.send(ctx, kd.batch()); err != nil {
					t.Fatalf("Wait = %v", err)
				}
			}
			if err := w.flush(ctx); err != nil {
				t.Fatalf("Wait = %v", err)
			}
			kd.check(t, kc)
			wantPipelined(t, k)
		})
	}
}

// Acknowledgements dropped while several Sends are in flight (the broker
// appended them; the replies never arrive and the connection is cut): the
// batches behind them are sent again byte-identical, each stored once, in
// order, with the same producer id.
func TestKafkaPipelineLostAcks(t *testing.T) {
	kc := testenv.Kafka(t)
	for _, tt := range []struct {
		name        string
		compression string
		drop        int
	}{
		{name: "one reply", drop: 1},
		{name: "three replies", drop: 3},
		{name: "three replies zstd", compression: "zstd", drop: 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			topic := testenv.UniqueName(t, "pipe")
			kc.CreateTopic(t, topic, 2)
			px, cfg := proxied(t, kc, kafkaclient.Config{WriteTimeout: 2 * time.Second, Compression: tt.compression,
				RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond})
			k := newSink(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			kd := &keyed{topic: topic, keys: 5, perWrite: 10}
			w := &pipeWriter{k: k, depth: kafkaclient.DefaultMaxInFlight}
			for i := range 300 {
				if i == 100 || i == 200 {
					px.DropReplies(tt.drop)
				}
				if err := w.send(ctx, kd.batch()); err != nil {
					t.Fatalf("Wait = %v", err)
				}
			}
			if err := w.flush(ctx); err != nil {
				t.Fatalf("Wait = %v", err)
			}
			if n := px.Dropped(); n != 0 {
				t.Fatalf("%d replies still to drop; the fault did not happen", n)
			}
			kd.check(t, kc)
			wantPipelined(t, k)
		})
	}
}

// The broker killed (kill -9) and frozen while a pipelined writer has
// several Sends in flight: nothing lost, nothing duplicated, every key in
// order.
func TestKafkaPipelineKillAndPause(t *testing.T) {
	kc, topic, k := killableSink(t, "pipe")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	kd := &keyed{topic: topic, keys: 6, perWrite: 12}
	w := &pipeWriter{k: k, depth: kafkaclient.DefaultMaxInFlight}
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		for !stop.Load() {
			if err := w.send(ctx, kd.batch()); err != nil {
				done <- err
				return
			}
		}
		done <- w.flush(ctx)
	}()
	killAndPause(t, done)
	stop.Store(true)
	if err := <-done; err != nil {
		t.Fatalf("writer: %v", err)
	}
	kd.check(t, kc)
	s := k.Stats()
	t.Logf("written %v per key; %+v", kd.next, s)
	if s.BrokerErrors == 0 {
		t.Errorf("Stats().BrokerErrors = 0: the faults did not hit a produce")
	}
}

// An event Kafka refuses while later Sends are in flight holds its lane in
// them: its key's later events fail with ErrBehind instead of overtaking it,
// other keys go on.
func TestKafkaPipelineRefusalHoldsLane(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "pipe")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A topic that refuses batches over 2,000 bytes: the broker, not the
	// sink's own size check, refuses the large event.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers...))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	maxBytes := "2000"
	if res, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, topic); err != nil || res.Err != nil {
		t.Fatalf("CreateTopic = %v, %v", err, res.Err)
	}
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, AllowAutoTopicCreation: true})
	msg := func(key string, v int, size int) event.Event {
		return event.Event{Topic: topic, Key: []byte(key), Value: []byte(fmt.Sprintf("%d%s", v, strings.Repeat(" ", size)))}
	}
	// Acknowledged first, so that the partition is pipelined.
	if err := k.Write(ctx, []event.Event{msg("a", 0, 0), msg("b", 0, 0)}); err != nil {
		t.Fatalf("Write = %v", err)
	}
	d1 := k.Send(ctx, []event.Event{msg("a", 1, 0), msg("b", 1, 0), msg("a", 2, 4000)})
	d2 := k.Send(ctx, []event.Event{msg("a", 3, 0), msg("b", 2, 0)})
	d3 := k.Send(ctx, []event.Event{msg("b", 3, 0), msg("a", 4, 0)})
	err1, err2, err3 := d1.Wait(ctx), d2.Wait(ctx), d3.Wait(ctx)
	failures := func(err error) []string {
		var we *sink.WriteError
		if err == nil {
			return nil
		}
		if !errors.As(err, &we) {
			t.Fatalf("Wait = %v; want a *sink.WriteError", err)
		}
		var out []string
		for _, f := range we.Failures {
			out = append(out, fmt.Sprintf("%d behind=%v", f.Index, errors.Is(f.Err, sink.ErrBehind)))
		}
		return out
	}
	if got := fmt.Sprint(failures(err1)); got != "[2 behind=false]" {
		t.Errorf("first Send's failures = %s; want [2 behind=false] (the too-large a)", got)
	}
	if got := fmt.Sprint(failures(err2)); got != "[0 behind=true]" {
		t.Errorf("second Send's failures = %s; want [0 behind=true] (a held behind it)", got)
	}
	if got := fmt.Sprint(failures(err3)); got != "[1 behind=true]" {
		t.Errorf("third Send's failures = %s; want [1 behind=true] (a held behind it)", got)
	}
	var a, b []string
	for _, m := range kc.ReadAll(t, topic) {
		v := strings.TrimSpace(string(m.Value))
		if string(m.Key) == "a" {
			a = append(a, v)
		} else {
			b = append(b, v)
		}
	}
	if fmt.Sprint(a) != "[0 1]" || fmt.Sprint(b) != "[0 1 2 3]" {
		t.Errorf("stored a %v, b %v; want a [0 1], b [0 1 2 3]", a, b)
	}
}
