package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// topicPartitions is how many partitions each bench topic gets: enough that
// the relay's per-partition batching, not the partition count, limits it.
const topicPartitions = 8

// topicsFor returns the topics the relay's default template
// (outbox.event.{aggregate_type}) routes the prefixed aggregate types to.
func topicsFor(typePrefix string) []string {
	ts := make([]string, len(aggregateTypes))
	for i, t := range aggregateTypes {
		ts[i] = "outbox.event." + typePrefix + t
	}
	return ts
}

// createTopics pre-creates topics so that auto-creation is not measured.
// LogAppendTime makes every record's timestamp the broker's append time, which
// is what the commit→ack latency is computed from.
func createTopics(ctx context.Context, client *kafka.Client, topics []string) error {
	cfgs := make([]kafka.TopicConfig, len(topics))
	for i, t := range topics {
		cfgs[i] = kafka.TopicConfig{
			Topic:             t,
			NumPartitions:     topicPartitions,
			ReplicationFactor: 1,
			ConfigEntries:     []kafka.ConfigEntry{{ConfigName: "message.timestamp.type", ConfigValue: "LogAppendTime"}},
		}
	}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		return fmt.Errorf("create topics: %w", err)
	}
	for t, err := range res.Errors {
		if err != nil {
			return fmt.Errorf("create topic %q: %w", t, err)
		}
	}
	// Creation is asynchronous on the controller: wait until every partition
	// reports offsets so that the relay's first write does not race it.
	for {
		if _, err := endOffsets(ctx, client, topics); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for topics: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func deleteTopics(ctx context.Context, client *kafka.Client, topics []string) error {
	res, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: topics})
	if err != nil {
		return fmt.Errorf("delete topics: %w", err)
	}
	var errs []error
	for t, err := range res.Errors {
		if err != nil && !errors.Is(err, kafka.UnknownTopicOrPartition) {
			errs = append(errs, fmt.Errorf("delete topic %q: %w", t, err))
		}
	}
	return errors.Join(errs...)
}

// endOffsets returns the sum of the high watermarks of every partition of
// topics: the number of records in them, as the topics start empty.
func endOffsets(ctx context.Context, client *kafka.Client, topics []string) (int64, error) {
	req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
	for _, t := range topics {
		for p := range topicPartitions {
			req.Topics[t] = append(req.Topics[t], kafka.LastOffsetOf(p))
		}
	}
	res, err := client.ListOffsets(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("list offsets: %w", err)
	}
	var sum int64
	for t, parts := range res.Topics {
		if len(parts) != topicPartitions {
			return 0, fmt.Errorf("list offsets of %q: %d partitions; want %d", t, len(parts), topicPartitions)
		}
		for _, p := range parts {
			if p.Error != nil {
				return 0, fmt.Errorf("list offsets of %q/%d: %w", t, p.Partition, p.Error)
			}
			sum += p.LastOffset
		}
	}
	if len(res.Topics) != len(topics) {
		return 0, fmt.Errorf("list offsets: %d topics answered; want %d", len(res.Topics), len(topics))
	}
	return sum, nil
}

// commitTimes maps a producer transaction number to the wall time its COMMIT
// returned. The payload cannot carry that time (it is written before the
// commit), so the in-process consumer looks it up by the payload's "txn".
type commitTimes struct {
	mu sync.Mutex
	t  map[int64]time.Time
}

func (c *commitTimes) set(txn int64, at time.Time) {
	c.mu.Lock()
	c.t[txn] = at
	c.mu.Unlock()
}

func (c *commitTimes) get(txn int64) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.t[txn]
	return at, ok
}

// latencySamples collects per-event latencies from the consumer. An event is
// identified by the payload's "seq"; a second delivery of it counts as a
// duplicate and adds no latency sample.
//
// The consumer can see an event before the producer goroutine has recorded
// its commit time: the walsender sends a transaction once its commit record
// is flushed, while the COMMIT reply still has to reach the producer and the
// producer to be scheduled. Such records wait in pending until resolve.
type latencySamples struct {
	mu         sync.Mutex
	ack        []time.Duration // broker append time − commit return
	receipt    []time.Duration // consumer receipt − commit return
	seen       map[int64]bool  // seq of every event received
	pending    []pendingRecord
	duplicates int
	early      int      // resolved from pending: delivered before COMMIT returned
	unknown    int      // records without a parsable txn/seq or any recorded commit
	examples   []string // a few unknown records, for the log
}

type pendingRecord struct {
	txn                int64
	appended, received time.Time
}

func newLatencySamples() *latencySamples { return &latencySamples{seen: map[int64]bool{}} }

// count returns the number of distinct events received.
func (s *latencySamples) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int64(len(s.seen))
}

func (s *latencySamples) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ack, s.receipt, s.seen, s.pending = nil, nil, map[int64]bool{}, nil
	s.duplicates, s.early, s.unknown, s.examples = 0, 0, 0, nil
}

func (s *latencySamples) add(m kafka.Message, received time.Time, commits *commitTimes) {
	txn, okTxn := payloadInt(m.Value, "txn")
	seq, okSeq := payloadInt(m.Value, "seq")
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !okTxn || !okSeq:
		s.unknown++
		if len(s.examples) < 3 {
			s.examples = append(s.examples, fmt.Sprintf("%s/%d@%d: %.100q", m.Topic, m.Partition, m.Offset, m.Value))
		}
	case s.seen[seq]:
		s.duplicates++
	default:
		s.seen[seq] = true
		if committed, ok := commits.get(txn); ok {
			s.record(m.Time, received, committed)
		} else {
			s.pending = append(s.pending, pendingRecord{txn: txn, appended: m.Time, received: received})
		}
	}
}

// record adds one event's latencies. They are clamped at zero: a record can
// reach Kafka before the producer saw its COMMIT return (see pending).
func (s *latencySamples) record(appended, received, committed time.Time) {
	s.ack = append(s.ack, max(appended.Sub(committed), 0))
	s.receipt = append(s.receipt, max(received.Sub(committed), 0))
}

// resolve settles pending records once the producer has finished.
func (s *latencySamples) resolve(commits *commitTimes) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pending {
		committed, ok := commits.get(p.txn)
		if !ok {
			s.unknown++
			continue
		}
		s.early++
		s.record(p.appended, p.received, committed)
	}
	s.pending = nil
}

// A recorder takes each record the consumer reads, with the time it arrived.
// It is called from one goroutine per partition.
type recorder interface {
	add(m kafka.Message, received time.Time, commits *commitTimes)
}

// consume reads every partition of topics from the start until ctx is done,
// one kafka-go Reader per partition (no group: no rebalance delay to measure).
// With readCommitted it reads as a read_committed consumer (records of
// transactions once committed) and leaves out the transaction markers.
func consume(ctx context.Context, brokers []string, topics []string, readCommitted bool, commits *commitTimes, out recorder) error {
	isolation := kafka.ReadUncommitted
	if readCommitted {
		isolation = kafka.ReadCommitted
	}
	g, ctx := errgroup.WithContext(ctx)
	for _, t := range topics {
		for p := range topicPartitions {
			g.Go(func() error {
				r := kafka.NewReader(kafka.ReaderConfig{
					Brokers:         brokers,
					Topic:           t,
					Partition:       p,
					MinBytes:        1,
					MaxBytes:        4 << 20,
					MaxWait:         50 * time.Millisecond,
					ReadLagInterval: -1,
					IsolationLevel:  isolation,
				})
				r.SetOffset(kafka.FirstOffset)
				defer r.Close()
				for {
					m, err := r.ReadMessage(ctx)
					if err != nil {
						if ctx.Err() != nil {
							return nil
						}
						return fmt.Errorf("read %s/%d: %w", t, p, err)
					}
					if readCommitted && controlRecord(m) {
						continue
					}
					out.add(m, time.Now(), commits)
				}
			})
		}
	}
	return g.Wait()
}

// payloadInt extracts an integer field from the payload without a full JSON
// decode; the relay forwards jsonb's text output, which always writes
// `"key": <int>` with one space.
func payloadInt(v []byte, key string) (int64, bool) {
	k := `"` + key + `": `
	i := bytes.Index(v, []byte(k))
	if i < 0 {
		return 0, false
	}
	v = v[i+len(k):]
	j := 0
	for j < len(v) && v[j] >= '0' && v[j] <= '9' {
		j++
	}
	n, err := strconv.ParseInt(string(v[:j]), 10, 64)
	return n, err == nil
}
