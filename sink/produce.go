package sink

import (
	"bytes"
	"context"
	"errors"
	"io"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/outbox-relay/outbox-relay/internal/backoff"
)

// This file produces a call's messages with one kafka-go produce request per
// partition (kafka.Client.Produce), in place of kafka.Writer.WriteMessages.
// The Writer asked the Transport's metadata cache once per message (a
// filtered copy of the topic's metadata each time), copied every message
// into a per-partition batch, and lingered up to BatchTimeout for batches
// that were not full; together that was most of the relay's allocations and
// a goroutine hand-off per partition batch. produce keeps the Writer's
// contract, which Write's ordering argument rests on:
//
//   - A call's messages of one partition go in one produce request, in input
//     order (Write caps a call at BatchBytes, so the request fits), and that
//     request succeeds or fails whole: all-or-nothing per partition.
//   - The partition is kafka.Murmur2Balancer over the topic's partitions as
//     the Transport's metadata cache knows them (refreshed every
//     MetadataTTL), asked once per topic per call, with
//     AllowAutoTopicCreation as configured: an unknown topic fails the whole
//     call with kafka-go's error, as with the Writer.
//   - A request is tried up to maxAttempts times while its error is
//     temporary (kafka-go's rule: Temporary() or a transient network error),
//     with a short backoff; then the error is every message's of that
//     partition, as kafka.WriteErrors aligned with the call's messages.
//   - A request runs under WriteTimeout and is not cancelled with the
//     caller's context: when ctx is done, produce returns ctx's error and the
//     requests in flight finish on their own (Close waits for them), as the
//     Writer's batches did.

// produceBackoffMin and produceBackoffMax are kafka-go Writer's defaults
// between its own attempts.
const (
	produceBackoffMin = 100 * time.Millisecond
	produceBackoffMax = time.Second
)

// partitionBatch is one produce request: a call's messages of one partition.
type partitionBatch struct {
	topic     string
	partition int
	idx       []int32 // into the call's messages, in order
	buf       []byte  // the encoded record batch (recordbatch.go)
	err       error
}

// produce writes batch and returns nil, ctx's error, an error that refused
// the whole call before anything was produced (metadata, an unknown topic),
// or kafka.WriteErrors with one entry per message of batch (nil for those
// acknowledged).
func (k *Kafka) produce(ctx context.Context, batch []kafka.Message) error {
	if len(batch) == 0 {
		return nil
	}
	if k.groupOf == nil {
		k.groupOf = make(map[topicPartition]int)
	}
	clear(k.groupOf)
	k.topicParts = k.topicParts[:0]
	pool, n := k.groups, 0 // partition batches, reused from call to call
	for i := range batch {
		m := &batch[i]
		parts, err := k.partitionsOf(ctx, m.Topic)
		if err != nil {
			return err
		}
		p := k.balancer.Balance(*m, k.partitionList(parts)...)
		tp := topicPartition{m.Topic, p}
		g, ok := k.groupOf[tp]
		if !ok {
			g, n = n, n+1
			k.groupOf[tp] = g
			if g < len(pool) {
				*pool[g] = partitionBatch{topic: tp.topic, partition: p, idx: pool[g].idx[:0], buf: pool[g].buf}
			} else {
				pool = append(pool, &partitionBatch{topic: tp.topic, partition: p})
			}
		}
		pool[g].idx = append(pool[g].idx, int32(i))
	}
	k.groups = pool
	groups := pool[:n]

	done := make(chan struct{}, len(groups))
	k.inflight.Add(len(groups))
	for _, g := range groups {
		go func() {
			defer k.inflight.Done()
			g.err = k.produceOne(ctx, batch, g)
			done <- struct{}{}
		}()
	}
	for range groups {
		select {
		case <-done:
		case <-ctx.Done():
			// The requests still running own their batches and records:
			// the next call must not reuse them.
			k.groups, k.abandoned = nil, true
			return ctx.Err()
		}
	}
	// The encoding buffers are kept for the next call, up to about two
	// calls' worth (a call is at most BatchBytes): a call whose messages
	// went to few partitions must not leave a large buffer at every place.
	kept := 0
	for _, g := range pool {
		kept += cap(g.buf)
	}
	if int64(kept) > 2*k.cfg.BatchBytes {
		for _, g := range pool {
			g.buf = nil
		}
	}
	var werrs kafka.WriteErrors
	for _, g := range groups {
		if g.err == nil {
			continue
		}
		if werrs == nil {
			werrs = make(kafka.WriteErrors, len(batch))
		}
		for _, i := range g.idx {
			werrs[i] = g.err
		}
	}
	if werrs != nil {
		// A request that failed (a timeout above all) may still be read by
		// kafka-go's connection after Produce returned: its batches are left
		// to it, not reused.
		k.groups, k.abandoned = nil, true
		return werrs
	}
	return nil
}

// produceOne sends one partition's messages, retrying temporary errors as
// kafka-go's Writer does.
func (k *Kafka) produceOne(ctx context.Context, batch []kafka.Message, g *partitionBatch) error {
	client := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.WriteTimeout}
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			time.Sleep(backoff.Delay(produceBackoffMin, produceBackoffMax, attempt-1))
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.WriteTimeout)
		var res *kafka.ProduceResponse
		if k.compression == 0 {
			if attempt == 0 {
				g.buf = appendRecordBatch(g.buf[:0], batch, g.idx, time.Now())
			}
			res, err = client.RawProduce(rctx, &kafka.RawProduceRequest{
				Topic:        g.topic,
				Partition:    g.partition,
				RequiredAcks: kafka.RequireAll,
				RawRecords:   protocol.RawRecordSet{Reader: bytes.NewReader(g.buf)},
			})
		} else {
			// Compressed batches are left to kafka-go's encoder.
			res, err = client.Produce(rctx, &kafka.ProduceRequest{
				Topic:        g.topic,
				Partition:    g.partition,
				RequiredAcks: kafka.RequireAll,
				Compression:  k.compression,
				Records:      &indexedRecords{msgs: batch, idx: g.idx},
			})
		}
		cancel()
		if res != nil {
			err = res.Error
		}
		if err == nil || !temporary(err) {
			return err
		}
	}
	return err
}

// temporary is kafka-go's rule for retrying a produce (isTemporary,
// isTransientNetworkError: unexported there).
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	if errors.As(err, &t) && t.Temporary() {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE)
}

// partitionsOf returns the topic's partition count from the Transport's
// metadata cache, once per topic per call. With AllowAutoTopicCreation an
// unknown topic makes the Transport ask the broker, which creates it.
func (k *Kafka) partitionsOf(ctx context.Context, topic string) (int, error) {
	for _, tp := range k.topicParts {
		if tp.topic == topic {
			return tp.n, nil
		}
	}
	r, err := k.transport.RoundTrip(ctx, k.addr, &metadataAPI.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: k.cfg.AllowAutoTopicCreation,
	})
	if err != nil {
		return 0, err
	}
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name == topic {
			if t.ErrorCode != 0 {
				return 0, kafka.Error(t.ErrorCode)
			}
			if len(t.Partitions) == 0 {
				return 0, kafka.UnknownTopicOrPartition
			}
			k.topicParts = append(k.topicParts, topicCount{topic, len(t.Partitions)})
			return len(t.Partitions), nil
		}
	}
	return 0, kafka.UnknownTopicOrPartition
}

type topicCount struct {
	topic string
	n     int
}

// partitionList returns 0..n-1, the list kafka-go's Writer balances over.
func (k *Kafka) partitionList(n int) []int {
	for len(k.parts) < n {
		k.parts = append(k.parts, len(k.parts))
	}
	return k.parts[:n]
}

type topicPartition struct {
	topic     string
	partition int
}

// indexedRecords reads msgs[idx...] as records without copying them (the
// Writer's writerRecords, over indexes). A fresh one per attempt: it is read
// once.
type indexedRecords struct {
	msgs       []kafka.Message
	idx        []int32
	next       int
	record     kafka.Record
	key, value bytesReadCloser
}

func (r *indexedRecords) ReadRecord() (*kafka.Record, error) {
	if r.next >= len(r.idx) {
		return nil, io.EOF
	}
	m := &r.msgs[r.idx[r.next]]
	r.next++
	r.record = kafka.Record{Time: m.Time, Headers: m.Headers}
	if m.Key != nil {
		r.key.Reset(m.Key)
		r.record.Key = &r.key
	}
	if m.Value != nil {
		r.value.Reset(m.Value)
		r.record.Value = &r.value
	}
	return &r.record, nil
}

type bytesReadCloser struct{ bytes.Reader }

func (*bytesReadCloser) Close() error { return nil }
