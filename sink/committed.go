package sink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"
)

// This file reads a partition as a read_committed consumer sees it. kafka-go
// sends the isolation level with a fetch but neither its Reader nor its
// Client.Fetch drops the records of aborted transactions, which a broker
// returns below the last stable offset together with the list of those
// transactions: a consumer must leave them out itself, as the Java consumer
// does. So the fetch is sent here and its batches are judged one by one.

// A Record is a record read back from a partition.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []kafka.Header
	Time      time.Time
}

// ReadCommitted reads a partition from offset from up to its last stable
// offset as it is when the read starts, as a read_committed consumer does:
// committed records and records written outside transactions, in offset
// order; never a record of an aborted or still open transaction, nor a
// control record. It calls fn for each (fn's error stops the read and is
// returned) and returns the offset to read from next. c's Transport routes
// each fetch to the partition's leader.
func ReadCommitted(ctx context.Context, c *kafka.Client, topic string, partition int, from int64, fn func(Record) error) (int64, error) {
	end := int64(-1) // the last stable offset when the read began
	for {
		m, err := c.Transport.RoundTrip(ctx, c.Addr, &fetchAPI.Request{
			ReplicaID:      -1,
			MaxWaitTime:    100,
			MinBytes:       1,
			MaxBytes:       4 << 20,
			IsolationLevel: int8(kafka.ReadCommitted),
			SessionID:      -1,
			SessionEpoch:   -1,
			Topics: []fetchAPI.RequestTopic{{Topic: topic, Partitions: []fetchAPI.RequestPartition{{
				Partition: int32(partition), CurrentLeaderEpoch: -1, FetchOffset: from,
				LogStartOffset: -1, PartitionMaxBytes: 4 << 20,
			}}}},
		})
		if err != nil {
			return from, fmt.Errorf("fetch %s[%d] at %d: %w", topic, partition, from, err)
		}
		res := m.(*fetchAPI.Response)
		if len(res.Topics) != 1 || len(res.Topics[0].Partitions) != 1 {
			return from, fmt.Errorf("fetch %s[%d] at %d: no partition in the answer", topic, partition, from)
		}
		p := &res.Topics[0].Partitions[0]
		if p.ErrorCode != 0 {
			return from, fmt.Errorf("fetch %s[%d] at %d: %w", topic, partition, from, kafka.Error(p.ErrorCode))
		}
		if end < 0 {
			end = p.LastStableOffset
		}
		if from >= end {
			return from, nil
		}
		next, err := readBatches(p, topic, partition, from, fn)
		if err != nil {
			return from, err
		}
		if next <= from {
			// Nothing below the last stable offset came back: the batch at
			// from is larger than the fetch allows, or the answer is empty.
			return from, fmt.Errorf("fetch %s[%d] at %d: no progress below the last stable offset %d", topic, partition, from, end)
		}
		from = next
	}
}

// readBatches hands fn the committed records of one fetch answer at or past
// from and returns the offset after the last record it held (aborted and
// control records included: they take offsets too).
func readBatches(p *fetchAPI.ResponsePartition, topic string, partition int, from int64, fn func(Record) error) (int64, error) {
	if c, ok := p.RecordSet.Records.(io.Closer); ok {
		defer c.Close()
	}
	aborted := slices.Clone(p.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b fetchAPI.ResponseTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
	abortedPIDs := map[int64]bool{}
	next := from
	stream, ok := p.RecordSet.Records.(*protocol.RecordStream)
	if !ok {
		return next, fmt.Errorf("fetch %s[%d]: record set of type %T; want batches (message format v2)", topic, partition, p.RecordSet.Records)
	}
	for _, rr := range stream.Records {
		var skip, control bool
		switch b := rr.(type) {
		case *protocol.ControlBatch:
			// An abort marker ends its producer's aborted transaction; a
			// commit marker ends a committed one. Neither is a record.
			control = true
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.BaseOffset {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			cr, err := b.ReadControlRecord()
			if err == nil && cr.Type == 0 {
				delete(abortedPIDs, b.ProducerID)
			}
			if err == nil && cr.Offset >= next {
				next = cr.Offset + 1
			}
		case *protocol.RecordBatch:
			for len(aborted) > 0 && aborted[0].FirstOffset <= b.BaseOffset {
				abortedPIDs[aborted[0].ProducerID] = true
				aborted = aborted[1:]
			}
			skip = b.Attributes.Transactional() && abortedPIDs[b.ProducerID]
		default:
			return next, fmt.Errorf("fetch %s[%d]: batch of type %T; want message format v2", topic, partition, rr)
		}
		for !control {
			r, err := rr.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				// A batch cut off at the answer's size limit: the next
				// fetch starts at it.
				if errors.Is(err, io.ErrUnexpectedEOF) {
					return next, nil
				}
				return next, fmt.Errorf("fetch %s[%d]: %w", topic, partition, err)
			}
			rec, err := record(r, topic, partition)
			if err != nil {
				return next, err
			}
			if r.Offset < next {
				continue
			}
			next = r.Offset + 1
			if !skip {
				if err := fn(rec); err != nil {
					return next, err
				}
			}
		}
	}
	return next, nil
}

// record copies r's bytes out of the fetch answer.
func record(r *protocol.Record, topic string, partition int) (Record, error) {
	rec := Record{Topic: topic, Partition: partition, Offset: r.Offset, Time: r.Time}
	var err error
	if r.Key != nil {
		if rec.Key, err = protocol.ReadAll(r.Key); err != nil {
			return rec, fmt.Errorf("read record key at %d: %w", r.Offset, err)
		}
	}
	if r.Value != nil {
		if rec.Value, err = protocol.ReadAll(r.Value); err != nil {
			return rec, fmt.Errorf("read record value at %d: %w", r.Offset, err)
		}
	}
	for _, h := range r.Headers {
		rec.Headers = append(rec.Headers, kafka.Header{Key: h.Key, Value: h.Value})
	}
	return rec, nil
}

// LastCommitted returns the value of the latest committed record with key
// in topic (a compacted topic of the relay's own, such as its checkpoints),
// read as a read_committed consumer reads it from the partition Write puts
// the key in; found is false when there is none. It reads back from the
// partition's end, further each time, so that a long uncompacted tail of
// other keys costs only what it must. Not safe for concurrent use with
// Write (it shares Write's partition list).
func (k *Kafka) LastCommitted(ctx context.Context, topic string, key []byte) (value []byte, found bool, err error) {
	// The Transport's metadata cache holds the sink's own topics only
	// (metadataFor): the checkpoint topic becomes one of them.
	c := &kafka.Client{Addr: k.addr, Transport: k.metadataFor(topic), Timeout: k.cfg.WriteTimeout}
	meta, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, false, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	n := 0
	for _, t := range meta.Topics {
		if t.Name == topic {
			if t.Error != nil {
				return nil, false, fmt.Errorf("metadata of %s: %w", topic, t.Error)
			}
			n = len(t.Partitions)
		}
	}
	if n == 0 {
		return nil, false, fmt.Errorf("metadata of %s: %w", topic, kafka.UnknownTopicOrPartition)
	}
	// Where Write puts the key: the same balancer over the same partitions.
	part := k.balancer.Balance(kafka.Message{Key: key}, k.partitionList(n)...)
	offs, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{
		Topics:         map[string][]kafka.OffsetRequest{topic: {kafka.FirstOffsetOf(part), kafka.LastOffsetOf(part)}},
		IsolationLevel: kafka.ReadCommitted,
	})
	if err != nil {
		return nil, false, fmt.Errorf("list offsets of %s: %w", topic, err)
	}
	var first, last int64
	for _, p := range offs.Topics[topic] {
		if p.Error != nil {
			return nil, false, fmt.Errorf("list offsets of %s: %w", topic, p.Error)
		}
		if p.Partition == part {
			first, last = p.FirstOffset, p.LastOffset
		}
	}
	for back := int64(256); ; back *= 8 {
		from := max(first, last-back)
		_, err := ReadCommitted(ctx, c, topic, part, from, func(r Record) error {
			if string(r.Key) == string(key) {
				value, found = r.Value, true
			}
			return nil
		})
		if err != nil {
			return nil, false, err
		}
		if found || from == first {
			return value, found, nil
		}
	}
}
