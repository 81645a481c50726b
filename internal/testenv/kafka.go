package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// KafkaCluster is the broker set shared by all tests; create topics with UniqueName
// names. (It cannot be called Kafka: that is the function returning it.)
type KafkaCluster struct {
	Brokers []string
}

// Kafka returns the brokers after checking that they answer. It holds the servers
// shared (see Exclusive) until t ends.
func Kafka(t testing.TB) *KafkaCluster {
	t.Helper()
	brokers := kafkaBrokers(t)
	useServers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkaAnswers(ctx, brokers); err != nil {
		t.Fatalf("testenv: Kafka at %s: %v; %s", strings.Join(brokers, ","), err, howToStart)
	}
	return &KafkaCluster{Brokers: append([]string(nil), brokers...)}
}

// kafkaAnswers succeeds once a broker returns metadata, retrying until ctx ends.
func kafkaAnswers(ctx context.Context, brokers []string) error {
	cl, err := newKafkaClient(brokers)
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		// No topics: the answer proves the broker serves metadata, at no cost.
		req := kmsg.NewPtrMetadataRequest()
		req.Topics = []kmsg.MetadataRequestTopic{}
		if _, err = cl.Request(ctx, req); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no broker answers metadata: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// newKafkaClient is a client of the test brokers only (seeds and the addresses they
// advertise, 127.0.0.1 for the dev broker and the containers).
func newKafkaClient(brokers []string, opts ...kgo.Opt) (*kgo.Client, error) {
	// Fresh metadata on every ask: a helper runs right after topics are created and
	// brokers restart, when five seconds of cached metadata would be stale.
	base := []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.MetadataMinAge(50 * time.Millisecond)}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}

// CreateTopic creates topic with the given partitions (replication factor 1) and waits
// until every partition has a leader.
func (k *KafkaCluster) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createTopic(ctx, k.Brokers, topic, partitions); err != nil {
		t.Fatalf("testenv: CreateTopic(%q, %d): %v", topic, partitions, err)
	}
}

func createTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	cl, err := newKafkaClient(brokers)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// A broker that has just restarted (a fault test's) may not know its controller
	// yet (the request fails), and a controller that has just started may not have its
	// broker registered yet, and then refuses every replication factor
	// (INVALID_REPLICATION_FACTOR, "0 available brokers"): ask again until it has.
	for {
		var res kadm.CreateTopicResponses
		if res, err = adm.CreateTopics(ctx, int32(partitions), 1, nil, topic); err == nil {
			r, ok := res[topic]
			if !ok {
				return fmt.Errorf("create: no answer for %q", topic)
			}
			if err = r.Err; err == nil || errors.Is(err, kerr.TopicAlreadyExists) {
				break
			}
			if !errors.Is(err, kerr.InvalidReplicationFactor) {
				return fmt.Errorf("create: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("create: %v: %w", err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	// CreateTopics returns before the partitions have leaders, and metadata may name a
	// leader before it serves the partition: producing before then fails with
	// LeaderNotAvailable or UnknownTopicOrPartition. Wait until every leader answers.
	for {
		var ids []int32
		if ids, err = ledPartitions(ctx, adm, topic); err == nil {
			if len(ids) != partitions {
				err = fmt.Errorf("%d partitions", len(ids))
			} else if _, _, err = partitionOffsets(ctx, adm, topic, ids); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d partitions with leaders that answer: %v: %w", partitions, err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ledPartitions returns the partitions of topic in order, or an error while the topic
// is unknown or one of its partitions has no leader.
func ledPartitions(ctx context.Context, adm *kadm.Client, topic string) ([]int32, error) {
	md, err := adm.Metadata(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	td, ok := md.Topics[topic]
	if !ok {
		return nil, fmt.Errorf("metadata: no topic %q", topic)
	}
	if td.Err != nil {
		return nil, fmt.Errorf("metadata of %q: %w", topic, td.Err)
	}
	ids := make([]int32, 0, len(td.Partitions))
	for _, p := range td.Partitions.Sorted() {
		if p.Err != nil || p.Leader < 0 {
			return nil, fmt.Errorf("partition %d: no leader (leader %d, %v)", p.Partition, p.Leader, p.Err)
		}
		ids = append(ids, p.Partition)
	}
	return ids, nil
}

// partitionOffsets asks each partition's leader for its first offset and its high
// watermark (read_uncommitted: open transactions included). It fails unless every
// leader answers for its partitions.
func partitionOffsets(ctx context.Context, adm *kadm.Client, topic string, ids []int32) (first, end map[int32]int64, err error) {
	starts, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("list start offsets: %w", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets: %w", err)
	}
	first, end = map[int32]int64{}, map[int32]int64{}
	for _, id := range ids {
		s, ok := starts.Lookup(topic, id)
		e, ok2 := ends.Lookup(topic, id)
		switch {
		case !ok || !ok2:
			return nil, nil, fmt.Errorf("partition %d: no offsets", id)
		case s.Err != nil:
			return nil, nil, fmt.Errorf("partition %d: first offset: %w", id, s.Err)
		case e.Err != nil:
			return nil, nil, fmt.Errorf("partition %d: end offset: %w", id, e.Err)
		}
		first[id], end[id] = s.Offset, e.Offset
	}
	return first, end, nil
}

// Header is a record header as ReadAll returns it.
type Header struct {
	Key   string
	Value []byte
}

// Message is a record as ReadAll returns it. The fields are those the tests used when
// they read with kafka-go's kafka.Message, under the same names. Unlike kafka-go's, a
// null key, value or header value is nil and an empty one is empty, not nil: the
// Debezium compatibility suite tells them apart (Debezium writes both).
type Message struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

func fromRecord(r *kgo.Record) Message {
	m := Message{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset, Key: r.Key, Value: r.Value, Time: r.Timestamp}
	for _, h := range r.Headers {
		m.Headers = append(m.Headers, Header{Key: h.Key, Value: h.Value})
	}
	return m
}

// ReadAll returns every record of topic, partition by partition from the first
// offset to the high watermark as of the call, in partition then offset order. It
// reads read_uncommitted and keeps the transaction markers (control records: a key
// and value of Kafka's, no headers), as kafka-go's connection did: the records of
// aborted and open transactions are there, and so is each marker. It uses no consumer
// group and commits nothing.
func (k *KafkaCluster) ReadAll(t testing.TB, topic string) []Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		msgs, err := readAll(ctx, k.Brokers, topic)
		if err == nil {
			return msgs
		}
		// Leadership moves for a moment after a broker restart or resume
		// (metadata without a leader, a leader not yet listening): read
		// again, within ReadAll's deadline, rather than fail a test for it.
		if ctx.Err() != nil {
			t.Fatalf("testenv: ReadAll(%q): %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readAll(ctx context.Context, brokers []string, topic string) ([]Message, error) {
	cl, err := newKafkaClient(brokers)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	// Right after a broker restart or resume, partitions are listed before
	// their leaders are known: ReadAll asks again.
	ids, err := ledPartitions(ctx, adm, topic)
	if err != nil {
		return nil, fmt.Errorf("partitions of %q: %w", topic, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", topic)
	}
	first, end, err := partitionOffsets(ctx, adm, topic, ids)
	if err != nil {
		return nil, err
	}
	from := map[int32]kgo.Offset{}
	for _, id := range ids {
		if first[id] < end[id] {
			from[id] = kgo.NewOffset().At(first[id])
		}
	}
	if len(from) == 0 {
		return nil, nil
	}
	byPart, err := readPartitions(ctx, brokers, topic, from, end)
	if err != nil {
		return nil, err
	}
	var out []Message
	for _, id := range ids {
		out = append(out, byPart[id]...)
	}
	return out, nil
}

// readPartitions reads each partition of from, from its offset up to (not including)
// its end offset.
func readPartitions(ctx context.Context, brokers []string, topic string, from map[int32]kgo.Offset, end map[int32]int64) (map[int32][]Message, error) {
	cl, err := newKafkaClient(brokers,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadUncommitted()),
		kgo.KeepControlRecords())
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	out := map[int32][]Message{}
	done := map[int32]bool{}
	for len(done) < len(from) {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read %d partitions to their end: %w", len(from)-len(done), err)
		}
		if err := fs.Err(); err != nil {
			return nil, fmt.Errorf("fetch: %w", err)
		}
		var now []int32
		fs.EachRecord(func(r *kgo.Record) {
			e := end[r.Partition]
			if done[r.Partition] || r.Offset >= e {
				return
			}
			out[r.Partition] = append(out[r.Partition], fromRecord(r))
			if r.Offset == e-1 {
				done[r.Partition] = true
				now = append(now, r.Partition)
			}
		})
		if len(now) > 0 {
			cl.PauseFetchPartitions(map[string][]int32{topic: now})
		}
	}
	return out, nil
}

// ---------------------------------------------------------------- faults

// StopKafka kills the broker (kill -9, or an immediate container stop) and returns once
// it is gone. The caller must hold Exclusive.
func StopKafka(t testing.TB) {
	t.Helper()
	kafkaFault(t, "StopKafka", "kafka-kill", stopContainer, false)
}

// StartKafka starts the broker again and returns once it answers metadata requests.
// The caller must hold Exclusive.
func StartKafka(t testing.TB) {
	t.Helper()
	kafkaFault(t, "StartKafka", "kafka-start", startContainer, true)
}

// kafkaFault is the shape of every Kafka fault helper: check Exclusive, act on the
// container or run the dev script (after checking it is the dev broker), and, with
// wait, return only once the broker answers metadata requests.
func kafkaFault(t testing.TB, name, devCmd string, container func(testing.TB, testcontainers.Container), wait bool) {
	t.Helper()
	requireExclusive(t, name)
	brokers := kafkaBrokers(t)
	if c := containers.kafka; c != nil {
		container(t, c)
	} else {
		checkDevPort(t, "RELAY_DEV_KAFKA_PORT", defaultDevKafkaPort, brokerPort(brokers[0]))
		runDev(t, devCmd)
	}
	if !wait {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaAnswers(ctx, brokers); err != nil {
		t.Fatalf("testenv: %s: %v", name, err)
	}
}

func brokerPort(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return port
}

// WaitMessages waits up to a minute for n records in topic and returns them as
// ReadAll does; more than n is an error of t (a duplicate), fewer after the minute
// fails t.
func (k *KafkaCluster) WaitMessages(t testing.TB, topic string, n int) []Message {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		msgs := k.ReadAll(t, topic)
		if len(msgs) >= n {
			if len(msgs) > n {
				t.Errorf("topic %s holds %d messages; want %d", topic, len(msgs), n)
			}
			return msgs
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic %s holds %d messages after a minute; want %d", topic, len(msgs), n)
		}
	}
}
