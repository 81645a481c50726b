package kafkaadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// This file is the project's one read_committed reader, used by exactly-once
// start-up (LastCommitted, the relay's checkpoint record) and by `migrate
// debezium` (Kafka Connect's offsets topic), and by tests that read what a
// read_committed consumer sees.
//
// It reads a partition up to its last stable offset as it is when the read
// starts, so that a read ends. A kgo consumer would not say when it reached
// that offset when the last records below it are transaction markers,
// records of aborted transactions or batches emptied by compaction (none of
// which it returns), so each fetch is sent to the partition's leader and its
// answer is decoded by kgo.ProcessFetchPartition, the consumer's own decoder:
// it drops aborted transactions' records and control records as kgo's
// consumer does, and says the offset to fetch next.

// A Record is a record read back from a partition.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte // nil is Kafka's null
	Value     []byte // nil is Kafka's null (a tombstone)
	Headers   []event.Header
	Time      time.Time
}

// A Reader reads topics as a read_committed consumer does, with a
// kafkaclient.Config's connection settings. It joins no consumer group and
// commits nothing. Close it when done.
type Reader struct {
	cl  *kgo.Client
	adm *kadm.Client
}

// NewReader validates cfg and returns a Reader that connects as cfg says
// (brokers, TLS, SASL, client id). It dials lazily.
func NewReader(cfg kafkaclient.Config) (*Reader, error) {
	cl, err := kafkaclient.New(&cfg)
	if err != nil {
		return nil, err
	}
	return &Reader{cl: cl, adm: kadm.NewClient(cl)}, nil
}

// Close closes the Reader's connections.
func (r *Reader) Close() { r.cl.Close() }

// ErrNoTopic is the error, wrapped, of a topic Kafka does not know.
var ErrNoTopic = errors.New("topic does not exist")

// Partitions returns topic's partition ids in order. A missing topic is an
// error wrapping ErrNoTopic and kerr.UnknownTopicOrPartition.
func (r *Reader) Partitions(ctx context.Context, topic string) ([]int, error) {
	td, err := r.topic(ctx, topic)
	if err != nil {
		return nil, err
	}
	ids := make([]int, 0, len(td.Partitions))
	for _, p := range td.Partitions.Numbers() {
		ids = append(ids, int(p))
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", topic)
	}
	return ids, nil
}

func (r *Reader) topic(ctx context.Context, topic string) (kadm.TopicDetail, error) {
	md, err := r.adm.Metadata(ctx, topic)
	if err != nil {
		return kadm.TopicDetail{}, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	td, ok := md.Topics[topic]
	switch {
	case !ok, errors.Is(td.Err, kerr.UnknownTopicOrPartition):
		return td, fmt.Errorf("%w: %q (%w)", ErrNoTopic, topic, kerr.UnknownTopicOrPartition)
	case td.Err != nil:
		return td, fmt.Errorf("metadata of %s: %w", topic, td.Err)
	}
	return td, nil
}

// Bounds returns the first offset and the last stable offset of each of
// topic's partitions: a read_committed reader reads [first, end).
func (r *Reader) Bounds(ctx context.Context, topic string) (first, end map[int]int64, err error) {
	starts, err := r.adm.ListStartOffsets(ctx, topic)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	ends, err := r.adm.ListCommittedOffsets(ctx, topic)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("list last stable offsets of %s: %w", topic, err)
	}
	first, end = make(map[int]int64), make(map[int]int64)
	starts.Each(func(o kadm.ListedOffset) { first[int(o.Partition)] = o.Offset })
	ends.Each(func(o kadm.ListedOffset) { end[int(o.Partition)] = o.Offset })
	return first, end, nil
}

// ReadCommitted reads a partition from offset from up to its last stable
// offset as it is when the read starts, as a read_committed consumer does:
// committed records and records written outside transactions, in offset
// order; never a record of an aborted or still open transaction, nor a
// control record. Records retention removed meanwhile are skipped (they are
// gone for every reader). It calls fn for each (fn's error stops the read
// and is returned as it is) and returns the offset to read from next.
func (r *Reader) ReadCommitted(ctx context.Context, topic string, partition int, from int64, fn func(Record) error) (int64, error) {
	_, end, err := r.Bounds(ctx, topic)
	if err != nil {
		return from, err
	}
	e, ok := end[partition]
	if !ok {
		return from, fmt.Errorf("list offsets of %s: no answer for partition %d", topic, partition)
	}
	return r.ReadUntil(ctx, topic, partition, from, e, fn)
}

// ReadUntil is ReadCommitted up to end, a last stable offset Bounds
// returned (for a read of several partitions as of one moment).
func (r *Reader) ReadUntil(ctx context.Context, topic string, partition int, from, end int64, fn func(Record) error) (int64, error) {
	td, err := r.topic(ctx, topic)
	if err != nil {
		return from, err
	}
	p := int32(partition)
	leader := int32(-1)
	if pd, ok := td.Partitions[p]; ok {
		leader = pd.Leader
	}
	for from < end {
		rp, err := r.fetch(ctx, td, p, leader, from)
		if err == nil {
			err = kerr.ErrorForCode(rp.ErrorCode)
		}
		switch {
		case errors.Is(err, kerr.OffsetOutOfRange):
			// Retention removed the start meanwhile: go on from the new one.
			starts, _, berr := r.Bounds(ctx, topic)
			if berr != nil {
				return from, berr
			}
			if start := starts[partition]; start > from {
				from = start
				continue
			}
			return from, fmt.Errorf("fetch %s[%d] at %d: %w", topic, partition, from, err)
		case err != nil && (kerr.IsRetriable(err) || leader < 0):
			// A leader change or an answer lost: ask again where the
			// partition's leader is.
			if td, err = r.topic(ctx, topic); err != nil {
				return from, err
			}
			leader = -1
			if pd, ok := td.Partitions[p]; ok {
				leader = pd.Leader
			}
			select {
			case <-ctx.Done():
				return from, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
			continue
		case err != nil:
			return from, fmt.Errorf("fetch %s[%d] at %d: %w", topic, partition, from, err)
		}
		fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: p,
		}, rp, kgo.DefaultDecompressor(), nil)
		if fp.Err != nil {
			return from, fmt.Errorf("fetch %s[%d] at %d: %w", topic, partition, from, fp.Err)
		}
		for _, kr := range fp.Records {
			if kr.Offset >= end {
				return end, nil
			}
			rec := Record{Topic: topic, Partition: partition, Offset: kr.Offset, Key: kr.Key, Value: kr.Value, Time: kr.Timestamp}
			for _, h := range kr.Headers {
				rec.Headers = append(rec.Headers, event.Header{Key: h.Key, Value: h.Value})
			}
			if err := fn(rec); err != nil {
				return kr.Offset + 1, err
			}
		}
		if next <= from && len(rp.RecordBatches) > 0 {
			// Bytes came back but no batch at from could be decoded: the
			// batch at from is larger than the fetch allows.
			return from, fmt.Errorf("fetch %s[%d] at %d: no progress below the last stable offset %d", topic, partition, from, end)
		}
		from = max(from, next)
	}
	return from, nil
}

// fetchBytes bounds one fetch answer: Kafka returns a first batch larger
// than this whole, so it only paces the reading.
const fetchBytes = 16 << 20

// fetch asks the partition's leader for records from offset, read_committed,
// and returns its answer for the partition.
func (r *Reader) fetch(ctx context.Context, td kadm.TopicDetail, p, leader int32, offset int64) (*kmsg.FetchResponseTopicPartition, error) {
	if leader < 0 {
		return nil, kerr.LeaderNotAvailable
	}
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 500
	req.MinBytes = 1
	req.MaxBytes = fetchBytes
	req.IsolationLevel = 1
	req.SessionEpoch = -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = td.Topic, td.ID
	rpart := kmsg.NewFetchRequestTopicPartition()
	rpart.Partition, rpart.FetchOffset, rpart.PartitionMaxBytes = p, offset, fetchBytes
	rpart.CurrentLeaderEpoch, rpart.LogStartOffset = -1, -1
	rt.Partitions = append(rt.Partitions, rpart)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, r.cl.Broker(int(leader)))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// The connection's trouble: retried like a leader change.
		return nil, fmt.Errorf("%w: %w", kerr.LeaderNotAvailable, err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			if resp.Topics[i].Partitions[j].Partition == p {
				return &resp.Topics[i].Partitions[j], nil
			}
		}
	}
	return nil, fmt.Errorf("%w: no partition %d in the answer", kerr.UnknownServerError, p)
}
