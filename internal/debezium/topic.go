package debezium

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/outbox-relay/outbox-relay/sink"
)

// ReadOffsets reads a Kafka Connect offsets topic with cfg's connection
// settings (readTopic) and returns the latest offset of each connector
// (LatestOffsets). It connects for the call only, joins no consumer group and
// commits nothing.
func ReadOffsets(ctx context.Context, cfg sink.Config, topic string) ([]Offset, error) {
	var records []Record
	err := readTopic(ctx, cfg, topic, func(key, value []byte) error {
		records = append(records, Record{Key: key, Value: value})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read offsets topic %q: %w", topic, err)
	}
	return LatestOffsets(records)
}

// readTopic calls fn with the key and value of every record of topic, from
// the earliest offset of each partition up to its end as of the call, in
// offset order within a partition, partition after partition. A nil key or
// value is Kafka's null (a nil value is a tombstone), an empty one is empty.
// fn may keep key and value; an error from fn stops the read and is returned
// as it is.
//
// It reads committed records only, as a read_committed consumer does: each
// partition's end is its last stable offset, records of aborted
// transactions are skipped, and so are transaction markers. That matters for
// Kafka Connect's offsets topic, which a worker with exactly-once source
// support writes in transactions: an aborted offset was never in force.
// For a topic written without transactions it is the high watermark.
//
// readTopic uses cfg's brokers, TLS, SASL and client id (sink.Client),
// connects for the call only and joins no consumer group; it commits
// nothing. It blocks until the records are read, fn fails, or ctx is done;
// without a deadline in ctx each request is bounded by cfg's WriteTimeout.
// It is for reading a small topic once (Kafka Connect's offsets), not for
// consuming.
func readTopic(ctx context.Context, cfg sink.Config, topic string, fn func(key, value []byte) error) error {
	c, err := sink.Client(cfg)
	if err != nil {
		return fmt.Errorf("read topic %q: %w", topic, err)
	}
	defer c.Close()
	r := &topicReader{client: c.Client, topic: topic, fn: fn, timeout: c.Timeout}
	parts, err := r.partitions(ctx)
	if err != nil {
		return fmt.Errorf("read topic %q from %s: %w", topic, strings.Join(cfg.Brokers, ","), err)
	}
	first, end, err := r.bounds(ctx, parts)
	if err != nil {
		return fmt.Errorf("read topic %q: %w", topic, err)
	}
	for _, p := range parts {
		if err := r.readPartition(ctx, p, first[p], end[p]); err != nil {
			var fe fnError
			if errors.As(err, &fe) {
				return fe.err
			}
			return fmt.Errorf("read topic %q partition %d: %w", topic, p, err)
		}
	}
	return nil
}

// fnError carries the callback's error out unwrapped.
type fnError struct{ err error }

func (e fnError) Error() string { return e.err.Error() }

type topicReader struct {
	client  *kafka.Client
	topic   string
	fn      func(key, value []byte) error
	timeout time.Duration
}

// partitions returns the topic's partition ids in order.
func (r *topicReader) partitions(ctx context.Context) ([]int, error) {
	md, err := r.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata: %w", err)
	}
	for _, t := range md.Topics {
		if t.Name != r.topic {
			continue
		}
		if t.Error != nil {
			if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
				return nil, fmt.Errorf("topic does not exist (check its name: Kafka Connect's offsets topic is the worker's offset.storage.topic): %w", t.Error)
			}
			return nil, fmt.Errorf("metadata: %w", t.Error)
		}
		ids := make([]int, 0, len(t.Partitions))
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
		slices.Sort(ids)
		if len(ids) == 0 {
			return nil, errors.New("topic has no partitions")
		}
		return ids, nil
	}
	return nil, errors.New("topic does not exist (check its name: Kafka Connect's offsets topic is the worker's offset.storage.topic)")
}

// bounds returns each partition's first offset and its last stable offset.
func (r *topicReader) bounds(ctx context.Context, parts []int) (first, end map[int]int64, err error) {
	reqs := make([]kafka.OffsetRequest, 0, 2*len(parts))
	for _, p := range parts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	res, err := r.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{r.topic: reqs},
		IsolationLevel: kafka.ReadCommitted,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list offsets: %w", err)
	}
	first, end = make(map[int]int64), make(map[int]int64)
	for _, po := range res.Topics[r.topic] {
		if po.Error != nil {
			return nil, nil, fmt.Errorf("list offsets of partition %d: %w", po.Partition, po.Error)
		}
		first[po.Partition], end[po.Partition] = po.FirstOffset, po.LastOffset
	}
	for _, p := range parts {
		if _, ok := end[p]; !ok {
			return nil, nil, fmt.Errorf("list offsets: no answer for partition %d", p)
		}
	}
	return first, end, nil
}

// readPartition reads offsets [next, end) of partition p.
func (r *topicReader) readPartition(ctx context.Context, p int, next, end int64) error {
	var aborted abortedTxns
	for next < end {
		res, err := r.fetch(ctx, p, next)
		if err != nil {
			if errors.Is(err, kafka.OffsetOutOfRange) {
				// Retention removed the start meanwhile: those records are
				// gone for every reader. Go on from the new start.
				first, _, berr := r.bounds(ctx, []int{p})
				if berr != nil {
					return berr
				}
				if first[p] <= next {
					return err
				}
				next = first[p]
				continue
			}
			return err
		}
		part := &res.Topics[0].Partitions[0]
		aborted.add(part.AbortedTransactions)
		before := next
		batches, err := r.records(part.RecordSet.Records, &next, end, &aborted)
		if err != nil {
			return err
		}
		switch {
		case next != before:
		case part.HighWatermark <= next || (part.LastStableOffset > 0 && part.LastStableOffset <= next):
			// The log now ends earlier (truncated after a leader change):
			// there is nothing more to read.
			return nil
		case batches > 0:
			// Batches but no record at or after next: next is inside a batch
			// that compaction emptied, which kafka-go does not say the end of.
			// The record at next is gone; step over it.
			next++
		default:
			// An empty answer: ask again.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// fetch asks the partition's leader for records from offset, read_committed.
// It goes through the Transport rather than Client.Fetch, which drops the
// aborted transactions a read_committed reader must skip itself.
func (r *topicReader) fetch(ctx context.Context, p int, offset int64) (*fetchAPI.Response, error) {
	wait := 500 * time.Millisecond
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok {
		rctx, cancel = context.WithTimeout(ctx, r.timeout)
	}
	defer cancel()
	m, err := r.client.Transport.RoundTrip(rctx, r.client.Addr, &fetchAPI.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(wait / time.Millisecond),
		MinBytes:       1,
		MaxBytes:       16 << 20,
		IsolationLevel: int8(kafka.ReadCommitted),
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetchAPI.RequestTopic{{
			Topic: r.topic,
			Partitions: []fetchAPI.RequestPartition{{
				Partition:          int32(p),
				CurrentLeaderEpoch: -1,
				FetchOffset:        offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  16 << 20,
			}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("fetch from offset %d: %w", offset, err)
	}
	res, ok := m.(*fetchAPI.Response)
	if !ok || len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 {
		return nil, fmt.Errorf("fetch from offset %d: unexpected response %T", offset, m)
	}
	if res.ErrorCode != 0 {
		return nil, fmt.Errorf("fetch from offset %d: %w", offset, kafka.Error(res.ErrorCode))
	}
	if code := res.Topics[0].Partitions[0].ErrorCode; code != 0 {
		return nil, fmt.Errorf("fetch from offset %d: %w", offset, kafka.Error(code))
	}
	return res, nil
}

// records hands the data records of rs in [*next, end) to fn, advancing
// *next past every record seen (data, aborted or marker), and returns how
// many batches rs held.
func (r *topicReader) records(rs protocol.RecordReader, next *int64, end int64, aborted *abortedTxns) (int, error) {
	if rs == nil {
		return 0, nil
	}
	batches := []protocol.RecordReader{rs}
	if s, ok := rs.(*protocol.RecordStream); ok {
		batches = s.Records
	}
	for _, b := range batches {
		switch b := b.(type) {
		case *protocol.ControlBatch:
			for {
				rec, err := b.ReadControlRecord()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return len(batches), fmt.Errorf("read transaction marker: %w", err)
				}
				if rec.Offset < *next {
					continue // seen in an earlier fetch
				}
				*next = rec.Offset + 1
				if rec.Type == 0 { // ABORT ends the producer's aborted transaction
					aborted.end(b.ProducerID)
				}
			}
		case *protocol.RecordBatch:
			aborted.reach(b.BaseOffset)
			skip := b.Attributes.Transactional() && aborted.has(b.ProducerID)
			if err := r.batch(b, skip, next, end); err != nil {
				return len(batches), err
			}
		default:
			// Message format v0/v1 (no transactions).
			if err := r.batch(b, false, next, end); err != nil {
				return len(batches), err
			}
		}
		if *next >= end {
			break
		}
	}
	return len(batches), nil
}

func (r *topicReader) batch(b protocol.RecordReader, skip bool, next *int64, end int64) error {
	for {
		rec, err := b.ReadRecord()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read record after offset %d: %w", *next-1, err)
		}
		// A fetch may return a batch that starts before the offset asked for.
		if rec.Offset < *next || rec.Offset >= end {
			closeBytes(rec)
			if rec.Offset >= end {
				// Nothing is left before end (compaction may have removed
				// the records up to here).
				*next = end
				return nil
			}
			continue
		}
		*next = rec.Offset + 1
		if skip {
			closeBytes(rec)
			continue
		}
		key, err := readBytes(rec.Key)
		if err == nil {
			var value []byte
			if value, err = readBytes(rec.Value); err == nil {
				closeBytes(rec)
				if err := r.fn(key, value); err != nil {
					return fnError{err}
				}
				continue
			}
		}
		closeBytes(rec)
		return fmt.Errorf("read record at offset %d: %w", rec.Offset, err)
	}
}

// readBytes copies a record's key or value; nil stays nil (Kafka's null).
func readBytes(b protocol.Bytes) ([]byte, error) {
	if b == nil {
		return nil, nil
	}
	out, err := protocol.ReadAll(b)
	if err != nil {
		return nil, err
	}
	if out == nil {
		out = []byte{}
	}
	return out, nil
}

func closeBytes(rec *protocol.Record) {
	if rec.Key != nil {
		rec.Key.Close()
	}
	if rec.Value != nil {
		rec.Value.Close()
	}
}

// abortedTxns tracks the aborted transactions of a read_committed fetch, as
// Kafka's consumer does (Fetcher/CompletedFetch): a producer's transactional
// batches are skipped from the aborted transaction's first offset until its
// ABORT marker.
type abortedTxns struct {
	pending []fetchAPI.ResponseTransaction // by first offset, not yet reached
	active  map[int64]bool                 // producer ids inside an aborted transaction
	// known are the transactions ever added: every fetch lists the aborted
	// transactions overlapping it, again, also one whose marker an earlier
	// fetch returned.
	known map[fetchAPI.ResponseTransaction]bool
}

func (a *abortedTxns) add(txns []fetchAPI.ResponseTransaction) {
	for _, t := range txns {
		if a.known[t] {
			continue
		}
		if a.known == nil {
			a.known = make(map[fetchAPI.ResponseTransaction]bool)
		}
		a.known[t] = true
		a.pending = append(a.pending, t)
	}
	slices.SortFunc(a.pending, func(x, y fetchAPI.ResponseTransaction) int {
		switch {
		case x.FirstOffset < y.FirstOffset:
			return -1
		case x.FirstOffset > y.FirstOffset:
			return 1
		}
		return 0
	})
}

// reach activates the aborted transactions that start at or before offset,
// a batch's base offset: a transaction's first batch starts at its first
// offset.
func (a *abortedTxns) reach(offset int64) {
	for len(a.pending) > 0 && a.pending[0].FirstOffset <= offset {
		if a.active == nil {
			a.active = make(map[int64]bool)
		}
		a.active[a.pending[0].ProducerID] = true
		a.pending = a.pending[1:]
	}
}

func (a *abortedTxns) has(producer int64) bool { return a.active[producer] }

func (a *abortedTxns) end(producer int64) { delete(a.active, producer) }
