package sink_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"

	"github.com/outbox-relay/outbox-relay/sink"
)

// javaPartitions are the partitions the Java client (and so Debezium) picks for
// these keys with 4 partitions: Utils.toPositive(Utils.murmur2(key)) % 4,
// computed with kafka-clients 3.9.1.
var javaPartitions = []struct {
	key       string
	partition int
}{
	{"a", 0},
	{"b", 0},
	{"order-1", 2},
	{"order-4711", 3},
	{"c", 2},
	{"d", 1},
	{"customer-42", 1},
	{"Bestellung-ä", 1},
}

func TestJavaMurmur2Partition(t *testing.T) {
	for _, tt := range javaPartitions {
		// franz-go's default partitioner for keyed records: the one the
		// producer on kgo uses, so its partitions agree with Debezium's.
		kp := kgo.StickyKeyPartitioner(nil).ForTopic("t")
		if got := kp.Partition(&kgo.Record{Key: []byte(tt.key)}, 4); got != tt.partition {
			t.Errorf("kgo.StickyKeyPartitioner(%q, 4 partitions) = %d; want %d", tt.key, got, tt.partition)
		}
		// And LastCommitted's, which reads where Write put the key.
		if got := kafkaadmin.KeyPartition([]byte(tt.key), 4); got != tt.partition {
			t.Errorf("keyPartition(%q, 4) = %d; want %d", tt.key, got, tt.partition)
		}
	}
}

func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatalf("kfake.NewCluster: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func newSink(t *testing.T, cfg kafkaclient.Config) *sink.Kafka {
	t.Helper()
	if cfg.RetryMin == 0 {
		cfg.RetryMin, cfg.RetryMax = 5*time.Millisecond, 50*time.Millisecond
	}
	k, err := sink.New(cfg)
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// readAll consumes want records from topic, failing the test after a timeout.
func readAll(t *testing.T, brokers []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %s: got %d records; want %d", topic, len(recs), want)
		}
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	if len(recs) != want {
		t.Fatalf("read %s: got %d records; want %d", topic, len(recs), want)
	}
	return recs
}

// msgs makes n messages to topic with keys cycling over keys and values
// "key:seq", seq counting per key from 0.
func msgs(topic string, n, keys int) []event.Event {
	out := make([]event.Event, n)
	seq := make([]int, keys)
	for i := range out {
		k := i % keys
		key := "agg-" + strconv.Itoa(k)
		out[i] = event.Event{Topic: topic, Key: []byte(key), Value: []byte(key + ":" + strconv.Itoa(seq[k])),
			Headers: []event.Header{{Key: "id", Value: []byte(strconv.Itoa(i))}}}
		seq[k]++
	}
	return out
}

// checkOrder asserts every key's records arrived in input order, exactly once,
// on the partition the Java client would pick.
func checkOrder(t *testing.T, recs []*kgo.Record, partitions int) {
	t.Helper()
	next := map[string]int{}
	for _, r := range recs {
		key, seqs, _ := strings.Cut(string(r.Value), ":")
		seq, _ := strconv.Atoi(seqs)
		if seq != next[key] {
			t.Fatalf("record %q at partition %d offset %d; want %s:%d next (per-key order)", r.Value, r.Partition, r.Offset, key, next[key])
		}
		next[key]++
		if want := kafkaadmin.KeyPartition(r.Key, partitions); int(r.Partition) != want {
			t.Errorf("key %q on partition %d; want %d (Java murmur2)", r.Key, r.Partition, want)
		}
	}
}

func TestWriteBatchesInOrder(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs(), BatchSize: 700})
	in := msgs("orders", 5000, 37)
	if err := k.Write(context.Background(), in); err != nil {
		t.Fatalf("Write(%d messages) = %v", len(in), err)
	}
	checkOrder(t, readAll(t, c.ListenAddrs(), "orders", len(in)), 4)
	st := k.Stats()
	if st.Messages != int64(len(in)) || st.Writes < 8 || st.Retries != 0 {
		t.Errorf("Stats() = %+v; want %d messages in at least 8 writes (700 per call), no retries", st, len(in))
	}
}

// Many small calls must not each wait kafka-go's default 1s batch timeout.
func TestWriteLatency(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	start := time.Now()
	for i := range 20 {
		if err := k.Write(context.Background(), msgs("orders", 3, 3)); err != nil {
			t.Fatalf("Write #%d = %v", i, err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("20 small Writes took %s; want well under 5s (batch timeout is 2ms)", d)
	}
}

func TestWriteByteCap(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "blobs"))
	// 40 messages of ~10 kB with a 64 kB cap: at least 7 calls.
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs(), BatchBytes: 64 << 10})
	in := msgs("blobs", 40, 1)
	for i := range in {
		in[i].Value = append(in[i].Value, make([]byte, 10_000)...)
	}
	if err := k.Write(context.Background(), in); err != nil {
		t.Fatalf("Write = %v", err)
	}
	readAll(t, c.ListenAddrs(), "blobs", len(in))
	if st := k.Stats(); st.Writes < 7 {
		t.Errorf("Stats().Writes = %d; want at least 7 calls of at most 64 kB", st.Writes)
	}
}

// A partition failing with a broker-wide error is retried, before any later
// message, so per-key order holds; the other partitions are not resent.
func TestWriteRetriesFailedPartitionsInOrder(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Partitions: []int32{2},
		Err: kerr.NotEnoughReplicas, Count: 8})
	defer h.Remove()
	// kgo retries the partition inside; a round not acknowledged within
	// WriteTimeout counts as a broker-wide failure (the round's watchdog).
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs(), BatchSize: 300, WriteTimeout: 200 * time.Millisecond})
	in := msgs("orders", 2000, 23)
	if err := k.Write(context.Background(), in); err != nil {
		t.Fatalf("Write = %v", err)
	}
	if h.Hits() != 8 {
		t.Errorf("fault hits = %d; want 8", h.Hits())
	}
	checkOrder(t, readAll(t, c.ListenAddrs(), "orders", len(in)), 4)
	if st := k.Stats(); st.Retries == 0 || st.BrokerErrors == 0 || st.Failures != 0 {
		t.Errorf("Stats() = %+v; want retries and broker errors counted, no failures", st)
	}
}

// A broker-wide failure of the whole call (here: metadata) blocks and retries.
func TestWriteRetriesMetadataFailure(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	var calls int
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		calls++
		if calls > 3 {
			return nil, nil, false
		}
		c.KeepControl()
		// Closing the connection is what an unreachable broker looks like.
		return nil, errors.New("injected: connection lost"), true
	})
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	in := msgs("orders", 100, 5)
	if err := k.Write(context.Background(), in); err != nil {
		t.Fatalf("Write = %v", err)
	}
	checkOrder(t, readAll(t, c.ListenAddrs(), "orders", len(in)), 4)
	if st := k.Stats(); st.BrokerErrors == 0 {
		t.Errorf("Stats().BrokerErrors = 0; want the lost metadata requests counted")
	}
}

// A message larger than BatchBytes would make kafka-go refuse the whole call:
// only it fails on its own, and the later messages of its key are held behind
// it (ErrBehind) instead of overtaking it; other keys are written.
func TestWriteTooLargeForBatch(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs(), BatchBytes: 64 << 10})
	in := msgs("orders", 50, 5)
	in[17].Value = make([]byte, 100_000)
	err := k.Write(context.Background(), in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) == 0 || werr.Failures[0].Index != 17 || !werr.Failures[0].Permanent {
		t.Fatalf("Write = %v; want a permanent Failure at index 17 first", err)
	}
	var held []int
	for _, f := range werr.Failures[1:] {
		if !errors.Is(f.Err, sink.ErrBehind) || f.Permanent {
			t.Errorf("Failure{%d, %v}: want ErrBehind, not permanent", f.Index, f.Err)
		}
		held = append(held, f.Index)
	}
	if want := []int{22, 27, 32, 37, 42, 47}; !slices.Equal(held, want) {
		t.Errorf("held behind index 17 (key agg-2) = %v; want %v", held, want)
	}
	recs := readAll(t, c.ListenAddrs(), "orders", 43)
	for _, r := range recs {
		if len(r.Value) == 100_000 {
			t.Errorf("the too-large message was written")
		}
		if v := string(r.Value); strings.HasPrefix(v, "agg-2:") && v > "agg-2:3" {
			t.Errorf("record %q of key agg-2 was written after its key's failure", v)
		}
	}
}

// The broker refuses a batch (MESSAGE_TOO_LARGE) that holds several messages:
// Write narrows it down and fails only the culprit on its own; the later
// messages of the culprit's key are held behind it, the other key's are
// written in order.
func TestWriteBrokerTooLargeIsolatesCulprit(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": "4000"}))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	in := msgs("orders", 30, 2)
	for i := range in {
		in[i].Value = append(in[i].Value, make([]byte, 50)...)
	}
	in[11].Value = append([]byte("big:"), make([]byte, 6000)...) // key agg-1
	err := k.Write(context.Background(), in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) == 0 || werr.Failures[0].Index != 11 {
		t.Fatalf("Write = %v; want a Failure at index 11 first", err)
	}
	if f := werr.Failures[0]; !f.Permanent || !errors.Is(f.Err, kerr.MessageTooLarge) {
		t.Errorf("Failure{%d, %v}: want a permanent MESSAGE_TOO_LARGE", f.Index, f.Err)
	}
	for _, f := range werr.Failures[1:] {
		if f.Index%2 != 1 || f.Index < 11 || !errors.Is(f.Err, sink.ErrBehind) {
			t.Errorf("Failure{%d, %v}: want only later agg-1 messages, held with ErrBehind", f.Index, f.Err)
		}
	}
	if len(werr.Failures) != 10 {
		t.Errorf("%d failures; want 10: the culprit and the 9 later agg-1 messages", len(werr.Failures))
	}
	recs := readAll(t, c.ListenAddrs(), "orders", 20)
	seq := map[string]int{}
	for _, r := range recs {
		v := strings.TrimRight(string(r.Value), "\x00")
		key := string(r.Key)
		if want := key + ":" + strconv.Itoa(seq[key]); v != want {
			t.Fatalf("record %q; want %q (per-key input order without the culprit's tail)", v, want)
		}
		seq[key]++
	}
	if seq["agg-0"] != 15 || seq["agg-1"] != 5 {
		t.Errorf("written agg-0 %d, agg-1 %d; want 15 and 5 (agg-1:0..4 before the culprit)", seq["agg-0"], seq["agg-1"])
	}
}

// Write after Write, a message the broker refuses (MESSAGE_TOO_LARGE for
// its batch) in the middle of a call is never overtaken by a later message
// of its key, and no key's messages are reordered by the narrowing down:
// every key's records in the log are exactly its messages in input order,
// without each call's culprit and the culprit's later messages. One call
// rarely shows a race between the producer sending a call's first records
// and the caller still handing over the rest (a franz-go producer failed it
// about 1 run in 10): forty calls make it likely to show.
func TestWriteRefusedMessageNeverOvertaken(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(2, "orders"), kfake.BrokerConfigs(map[string]string{"message.max.bytes": "4000"}))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	const keys, perWrite, writes = 3, 30, 40
	next := map[string]int{}
	want := map[string][]string{}
	total := 0
	for w := range writes {
		in := make([]event.Event, perWrite)
		culprit := 5 + w%20
		for i := range in {
			key := "agg-" + strconv.Itoa(i%keys)
			v := key + ":" + strconv.Itoa(next[key])
			next[key]++
			in[i] = event.Event{Topic: "orders", Key: []byte(key), Value: []byte(v + strings.Repeat(" ", 40))}
		}
		in[culprit].Value = append(in[culprit].Value, make([]byte, 6000)...)
		err := k.Write(context.Background(), in)
		var werr *sink.WriteError
		if !errors.As(err, &werr) || len(werr.Failures) == 0 || werr.Failures[0].Index != culprit {
			t.Fatalf("write %d: Write = %v; want a Failure at index %d first", w, err, culprit)
		}
		failed := map[int]bool{}
		for _, f := range werr.Failures {
			failed[f.Index] = true
		}
		for i := range in {
			key := string(in[i].Key)
			behind := key == string(in[culprit].Key) && i > culprit
			switch {
			case i == culprit:
			case behind && !failed[i]:
				t.Fatalf("write %d: message %d (%s) of the culprit's key after it was not failed (ErrBehind)", w, i, in[i].Value[:8])
			case !behind && failed[i]:
				t.Fatalf("write %d: message %d of another key failed: %+v", w, i, werr.Failures)
			case !behind:
				want[key] = append(want[key], strings.TrimRight(string(in[i].Value), " "))
				total++
			}
		}
	}
	got := map[string][]string{}
	for _, r := range readAll(t, c.ListenAddrs(), "orders", total) {
		got[string(r.Key)] = append(got[string(r.Key)], strings.TrimRight(string(r.Value), " \x00"))
	}
	for key, w := range want {
		if !slices.Equal(got[key], w) {
			t.Errorf("key %s: records %q; want %q (input order, without the culprits and what was behind them)", key, got[key], w)
		}
	}
}

// An unknown topic with auto-creation off fails its own messages, not
// permanently; the other topic's messages are written.
func TestWriteUnknownTopic(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	in := msgs("orders", 20, 4)
	for _, i := range []int{3, 9, 10} {
		in[i].Topic = "missing"
	}
	err := k.Write(context.Background(), in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) {
		t.Fatalf("Write = %v; want a *WriteError", err)
	}
	var got []string
	for _, f := range werr.Failures {
		got = append(got, fmt.Sprintf("%d permanent=%t", f.Index, f.Permanent))
		if !strings.Contains(f.Err.Error(), `"missing"`) {
			t.Errorf("Failure{%d, %v}: want the error to name the topic", f.Index, f.Err)
		}
	}
	if want := "3 permanent=false,9 permanent=false,10 permanent=false"; strings.Join(got, ",") != want {
		t.Errorf("Write failures = %s; want %s", strings.Join(got, ","), want)
	}
	readAll(t, c.ListenAddrs(), "orders", 17)
}

// A permanent per-partition error from the broker fails that partition's
// messages and leaves the rest written.
func TestWriteTopicAuthorizationFailed(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"), kfake.SeedTopics(1, "secret"))
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "secret", Err: kerr.TopicAuthorizationFailed, Count: -1})
	defer h.Remove()
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	in := msgs("orders", 10, 2)
	in[4].Topic, in[7].Topic = "secret", "secret"
	err := k.Write(context.Background(), in)
	var werr *sink.WriteError
	if !errors.As(err, &werr) || len(werr.Failures) != 2 || werr.Failures[0].Index != 4 || werr.Failures[1].Index != 7 {
		t.Fatalf("Write = %v; want Failures at 4 and 7", err)
	}
	for _, f := range werr.Failures {
		if !f.Permanent {
			t.Errorf("Permanent(%v) = false; want true", f.Err)
		}
	}
	readAll(t, c.ListenAddrs(), "orders", 8)
}

// With no broker at all, Write blocks until ctx is done and returns its error:
// nothing is reported as failed.
func TestWriteUnreachableBlocks(t *testing.T) {
	k := newSink(t, kafkaclient.Config{Brokers: []string{"127.0.0.1:1"}})
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := k.Write(ctx, msgs("orders", 10, 2))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Write(unreachable) = %v; want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d < 600*time.Millisecond {
		t.Errorf("Write(unreachable) returned after %s; want it to block until ctx is done", d)
	}
	if st := k.Stats(); st.BrokerErrors < 2 || st.Failures != 0 {
		t.Errorf("Stats() = %+v; want several broker errors and no failures", st)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer pcancel()
	if err := k.Ping(pctx); err == nil {
		t.Errorf("Ping(unreachable) = nil; want an error")
	}
}

func TestPing(t *testing.T) {
	c := newCluster(t)
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := k.Ping(ctx); err != nil {
		t.Errorf("Ping = %v; want nil", err)
	}
}

func TestWriteCancelledWhileRetrying(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "orders"))
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.LeaderNotAvailable, Count: -1})
	defer h.Remove()
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs()})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if err := k.Write(ctx, msgs("orders", 5, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Write(leader never available) = %v; want context.DeadlineExceeded", err)
	}
}
