package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// Against real Kafka: the partitions chosen for keys are the Java client's, so
// a consumer or a migration from Debezium sees the same key → partition map.
func TestKafkaPartitionsMatchJavaClient(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "sink")
	kc.CreateTopic(t, topic, 4)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers})

	var in []event.Event
	for _, p := range javaPartitions {
		in = append(in, event.Event{Topic: topic, Key: []byte(p.key), Value: []byte("v-" + p.key)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.Write(ctx, in); err != nil {
		t.Fatalf("Write = %v", err)
	}
	got := map[string]int{}
	for _, m := range kc.ReadAll(t, topic) {
		got[string(m.Key)] = m.Partition
	}
	for _, p := range javaPartitions {
		if part, ok := got[p.key]; !ok || part != p.partition {
			t.Errorf("key %q on partition %d (found %t); want %d, as the Java client", p.key, part, ok, p.partition)
		}
	}
}

// A message larger than the broker accepts fails permanently; the later
// messages of its key are held behind it (ErrBehind), the other key's arrive in
// order, in the same partition.
func TestKafkaBrokerRejectsTooLarge(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "sink")
	kc.CreateTopic(t, topic, 1)
	// BatchBytes far above the broker's message.max.bytes (1 MB by default),
	// so that the broker, not the client's size check, refuses the message.
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, BatchBytes: 8 << 20})

	in := msgs(topic, 10, 2)
	in[4].Value = make([]byte, 3<<20) // agg-0:2
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := k.Write(ctx, in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) != 3 || werr.Failures[0].Index != 4 {
		t.Fatalf("Write = %v; want 3 Failures: index 4, then 6 and 8 held behind it", err)
	}
	if f := werr.Failures[0]; !f.Permanent {
		t.Errorf("Permanent(%v) = false; want true", f.Err)
	}
	for i, f := range werr.Failures[1:] {
		if want := 6 + 2*i; f.Index != want || !errors.Is(f.Err, sink.ErrBehind) {
			t.Errorf("Failure{%d, %v}; want {%d, ErrBehind}", f.Index, f.Err, want)
		}
	}
	var got []string
	for _, m := range kc.ReadAll(t, topic) {
		got = append(got, string(m.Value))
	}
	if want := "agg-0:0 agg-1:0 agg-0:1 agg-1:1 agg-1:2 agg-1:3 agg-1:4"; strings.Join(got, " ") != want {
		t.Errorf("topic holds %q; want %q", strings.Join(got, " "), want)
	}
}

// With auto-creation off in the client, a missing topic is a non-permanent
// Failure, is not created, and does not hold back the other topic.
func TestKafkaUnknownTopic(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "sink")
	missing := testenv.UniqueName(t, "missing")
	kc.CreateTopic(t, topic, 2)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers})

	in := msgs(topic, 6, 2)
	in[1].Topic, in[4].Topic = missing, missing
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := k.Write(ctx, in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) != 2 || werr.Failures[0].Index != 1 || werr.Failures[1].Index != 4 {
		t.Fatalf("Write = %v; want Failures at 1 and 4", err)
	}
	for _, f := range werr.Failures {
		if f.Permanent || !errors.Is(f.Err, kerr.UnknownTopicOrPartition) {
			t.Errorf("Failure{%d, %v}: want a non-permanent UnknownTopicOrPartition", f.Index, f.Err)
		}
	}
	if n := len(kc.ReadAll(t, topic)); n != 4 {
		t.Errorf("topic %s holds %d messages; want 4", topic, n)
	}
	if topicExists(t, kc.Brokers, missing) {
		t.Errorf("topic %s exists; want it not created", missing)
	}
}

// With AllowAutoTopicCreation the broker creates the topic on first use and
// Write waits for it (LEADER_NOT_AVAILABLE meanwhile is broker-wide).
func TestKafkaAutoCreateTopic(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "auto")
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, AllowAutoTopicCreation: true})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := k.Write(ctx, msgs(topic, 10, 3)); err != nil {
		t.Fatalf("Write(new topic, auto-create) = %v", err)
	}
	if n := len(kc.ReadAll(t, topic)); n != 10 {
		t.Errorf("topic %s holds %d messages; want 10", topic, n)
	}
}
