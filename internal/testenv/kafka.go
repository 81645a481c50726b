package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
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
	var err error
	for {
		for _, b := range brokers {
			var conn *kafka.Conn
			if conn, err = kafka.DialContext(ctx, "tcp", b); err == nil {
				_, err = conn.Brokers()
				conn.Close()
				if err == nil {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no broker answers metadata: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
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
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	// A broker that has just restarted (a fault test's) may not know its
	// controller yet and names none (port 0): ask again until it does.
	var cconn *kafka.Conn
	for {
		ctrl, err := conn.Controller()
		if err == nil && ctrl.Port != 0 {
			if cconn, err = kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port))); err == nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("find and dial the controller: %v: %w", err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer cconn.Close()
	// A controller that has just started may not have its broker registered
	// yet, and then refuses every replication factor (INVALID_REPLICATION_FACTOR,
	// "0 available brokers"): ask again until it has.
	for {
		err = cconn.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
		if err == nil || errors.Is(err, kafka.TopicAlreadyExists) {
			break
		}
		if !errors.Is(err, kafka.InvalidReplicationFactor) {
			return fmt.Errorf("create: %w", err)
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
		parts, err := conn.ReadPartitions(topic)
		if err == nil && len(parts) == partitions && allLed(parts) {
			if err = partitionsServed(ctx, brokers[0], topic, partitions); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d partitions with leaders (have %d, %v): %w", partitions, len(parts), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func partitionsServed(ctx context.Context, broker, topic string, partitions int) error {
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p)
		if err != nil {
			return err
		}
		_, _, err = conn.ReadOffsets()
		conn.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func allLed(parts []kafka.Partition) bool {
	for _, p := range parts {
		if p.Leader.Host == "" {
			return false
		}
	}
	return true
}

// ReadAll returns every message of topic, partition by partition from the first
// offset to the end offset as of the call, in partition then offset order. It uses no
// consumer group and commits nothing.
func (k *KafkaCluster) ReadAll(t testing.TB, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		msgs, err := readAll(ctx, k.Brokers[0], topic)
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

func readAll(ctx context.Context, broker, topic string) ([]kafka.Message, error) {
	// Right after a broker restart or resume, partitions are listed before
	// their leaders are known: wait for the leaders rather than fail.
	var parts []kafka.Partition
	for {
		conn, err := kafka.DialContext(ctx, "tcp", broker)
		if err != nil {
			return nil, fmt.Errorf("dial: %w", err)
		}
		parts, err = conn.ReadPartitions(topic)
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("read partitions: %w", err)
		}
		if allLed(parts) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("partitions of %q have no leader: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	ids := make([]int, 0, len(parts))
	for _, p := range parts {
		if p.Topic == topic {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", topic)
	}
	slices.Sort(ids)
	var out []kafka.Message
	for _, id := range ids {
		msgs, err := readPartition(ctx, broker, topic, id)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", id, err)
		}
		out = append(out, msgs...)
	}
	return out, nil
}

func readPartition(ctx context.Context, broker, topic string, partition int) ([]kafka.Message, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("dial leader: %w", err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	first, end, err := conn.ReadOffsets()
	if err != nil {
		return nil, fmt.Errorf("read offsets: %w", err)
	}
	var out []kafka.Message
	next := first
	for next < end {
		if _, err := conn.Seek(next, kafka.SeekAbsolute); err != nil {
			return nil, fmt.Errorf("seek %d: %w", next, err)
		}
		batch := conn.ReadBatch(1, 16<<20)
		for next < end {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			if m.Offset >= end {
				next = end
				break
			}
			out = append(out, m)
			next = m.Offset + 1
		}
		if err := batch.Close(); err != nil {
			return nil, fmt.Errorf("read from offset %d: %w", next, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read from offset %d to %d: %w", next, end, err)
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
