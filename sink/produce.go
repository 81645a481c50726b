package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// This file produces a call's messages with one kafka-go produce request per
// partition (kafka.Client.RawProduce, with record batches encoded here,
// compressed or not: recordbatch.go), in place of kafka.Writer.WriteMessages.
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
	idx       []int32     // into the call's messages, in order
	buf       []byte      // the encoded record batch (recordbatch.go)
	scratch   []byte      // a compressed batch's records before compression
	records   []byte      // the uncompressed records of buf (in buf or scratch)
	now       time.Time   // the encoding time
	seq       *sequence   // the partition's sequence numbers; nil without idempotence
	hdr       batchHeader // producer id, epoch and base sequence, set by produce
	err       error
}

// produce writes batch and returns nil, ctx's error, an error that refused
// the whole call before anything was produced (metadata, an unknown topic,
// no producer id), an error that ends the transaction (txnFatal), or
// kafka.WriteErrors with one entry per message of batch
// (nil for those acknowledged).
func (k *Kafka) produce(ctx context.Context, batch []kafka.Message) error {
	if len(batch) == 0 {
		return nil
	}
	idempotent := !k.cfg.DisableIdempotence
	if idempotent {
		// Requests a cancelled round left running record their
		// partitions' outcome: sequence numbers are read after them.
		if err := k.awaitStragglers(ctx); err != nil {
			return err
		}
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
				*pool[g] = partitionBatch{topic: tp.topic, partition: p, idx: pool[g].idx[:0], buf: pool[g].buf, scratch: pool[g].scratch}
			} else {
				pool = append(pool, &partitionBatch{topic: tp.topic, partition: p})
			}
		}
		pool[g].idx = append(pool[g].idx, int32(i))
	}
	k.groups = pool
	groups := pool[:n]

	if idempotent && k.prod.id < 0 {
		if k.transactional() {
			return errNoTransactions
		}
		if err := k.initProducer(ctx, "first produce"); err != nil {
			return err
		}
	}
	round := groups
	for resets := 0; ; resets++ {
		if idempotent {
			for _, g := range round {
				g.seq = k.sequenceOf(topicPartition{g.topic, g.partition})
				g.hdr = batchHeader{producerID: k.prod.id, epoch: k.prod.epoch, baseSeq: g.seq.next, transactional: k.transactional()}
			}
		}
		if k.transactional() {
			// In a transaction (txn.go): its partitions registered first,
			// and a producer's trouble ends the transaction instead of
			// taking a new producer id.
			var err error
			if round, err = k.addPartitions(ctx, round); err != nil {
				return err
			}
			k.txnRound(ctx, batch, round)
			if err := k.txnFailure(round); err != nil {
				return err
			}
			break
		}
		if err := k.round(ctx, batch, round); err != nil {
			return err
		}
		if !idempotent || resets == maxResets {
			break
		}
		// Partitions refused for the producer's state, or not sent
		// because their sequence numbers may be taken: again with a new
		// producer id (idempotence.go).
		var again []*partitionBatch
		var reason error
		for _, g := range round {
			var pse *ProducerStateError
			if errors.Is(g.err, errSequenceReused) || errors.As(g.err, &pse) {
				again = append(again, g)
				reason = g.err
			}
		}
		if len(again) == 0 {
			break
		}
		if err := k.initProducer(ctx, fmt.Sprintf("%s[%d]: %v", again[0].topic, again[0].partition, reason)); err != nil {
			for _, g := range again {
				g.err = err
			}
			break
		}
		for _, g := range again {
			// A timed-out earlier attempt may still be read by kafka-go's
			// connection: fresh buffers.
			g.buf, g.scratch = nil, nil
		}
		round = again
	}

	// The encoding buffers are kept for the next call, up to about two
	// calls' worth (a call is at most BatchBytes): a call whose messages
	// went to few partitions must not leave a large buffer at every place.
	kept := 0
	for _, g := range pool {
		kept += cap(g.buf) + cap(g.scratch)
	}
	if int64(kept) > 2*k.cfg.BatchBytes {
		for _, g := range pool {
			g.buf, g.scratch = nil, nil
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
		// kafka-go's connection after Produce returned, and a batch whose
		// outcome is unknown is kept for a byte-identical resend: its
		// batches are left to them, not reused.
		k.groups, k.abandoned = nil, true
		return werrs
	}
	return nil
}

// round sends one produce request per group, at once, and waits for them.
// When ctx ends first it returns ctx's error and leaves the requests running
// (stragglers, each within WriteTimeout per attempt), their batches and
// records to them.
func (k *Kafka) round(ctx context.Context, batch []kafka.Message, groups []*partitionBatch) error {
	done := make(chan struct{}, len(groups))
	k.inflight.Add(len(groups))
	for _, g := range groups {
		go func() {
			defer k.inflight.Done()
			g.err = k.produceOne(ctx, batch, g)
			done <- struct{}{}
		}()
	}
	for i := range groups {
		select {
		case <-done:
		case <-ctx.Done():
			// The requests still running own their batches and records:
			// the next call must not reuse them.
			k.groups, k.abandoned = nil, true
			k.straggling, k.stragglers = done, len(groups)-i
			return ctx.Err()
		}
	}
	return nil
}

// awaitStragglers waits for the requests a cancelled round left running.
func (k *Kafka) awaitStragglers(ctx context.Context) error {
	for k.stragglers > 0 {
		select {
		case <-k.straggling:
			k.stragglers--
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	k.straggling = nil
	return nil
}

// produceOne sends one partition's messages, retrying temporary errors as
// kafka-go's Writer does, and with idempotence records the outcome in the
// partition's sequence numbers (idempotence.go): taken when acknowledged,
// the batch kept as pending while its outcome is unknown.
func (k *Kafka) produceOne(ctx context.Context, batch []kafka.Message, g *partitionBatch) error {
	client := &kafka.Client{Addr: k.addr, Transport: k.transport, Timeout: k.cfg.WriteTimeout}
	if err := k.encode(batch, g); err != nil {
		return err
	}
	// unknown: a send of these sequence numbers may have been appended.
	unknown := g.seq != nil && g.seq.pending
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			time.Sleep(backoff.Delay(produceBackoffMin, produceBackoffMax, attempt-1))
		}
		g.sending()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), k.cfg.WriteTimeout)
		var res *kafka.ProduceResponse
		res, err = client.RawProduce(rctx, &kafka.RawProduceRequest{
			Topic:           g.topic,
			Partition:       g.partition,
			RequiredAcks:    kafka.RequireAll,
			TransactionalID: k.cfg.TransactionalID,
			RawRecords:      protocol.RawRecordSet{Reader: bytes.NewReader(g.buf)},
		})
		cancel()
		if res != nil {
			err = res.Error
		}
		if done, err := g.settle(err, &unknown); done {
			return err
		}
	}
	return err
}

// sending marks g's batch as sent with its sequence numbers: pending until
// an answer settles it.
func (g *partitionBatch) sending() {
	if g.seq != nil && !g.seq.pending {
		g.seq.pending = true
		g.seq.sent = sentBatch{batch: g.buf, records: g.records, count: len(g.idx), now: g.now}
	}
}

// settle records the answer err to a send of g's batch in the partition's
// sequence numbers (idempotence.go) and reports whether the batch is done,
// with its error: acknowledged, or failed for a reason sending again does not
// cure. unknown says whether a send of these sequence numbers may have been
// appended; settle sets it when this one's outcome is unknown.
func (g *partitionBatch) settle(err error, unknown *bool) (done bool, _ error) {
	if seq := g.seq; seq != nil {
		switch {
		case err == nil || errors.Is(err, kafka.DuplicateSequenceNumber):
			// DUPLICATE_SEQUENCE_NUMBER: the broker has the batch.
			seq.next = nextSequence(g.hdr.baseSeq, len(g.idx))
			seq.pending = false
			seq.sent = sentBatch{}
			return true, nil
		case notAppended(err):
			if !*unknown {
				seq.pending = false
				seq.sent = sentBatch{}
			}
			if producerState(err) {
				return true, &ProducerStateError{Err: err}
			}
		default:
			*unknown = true
		}
	}
	return err == nil || !temporary(err), err
}

// encode writes g's record batch into g.buf. A batch for sequence numbers
// whose earlier send is pending must hold the same records: it is then sent
// as the pending bytes, else it is not sent (errSequenceReused).
func (k *Kafka) encode(batch []kafka.Message, g *partitionBatch) error {
	g.now = time.Now()
	hdr := noProducer
	var prev *sentBatch
	if g.seq != nil {
		hdr = g.hdr
		if g.seq.pending {
			prev = &g.seq.sent
			g.now = prev.now
		}
	}
	if k.compression == 0 {
		g.buf = appendRecordBatch(g.buf[:0], batch, g.idx, g.now, hdr)
		g.records = g.buf[batchOverhead:]
	} else {
		var err error
		g.buf, g.scratch, err = appendCompressedBatch(g.buf[:0], g.scratch, batch, g.idx, g.now, hdr, k.compression.Codec())
		if err != nil {
			return err
		}
		g.records = g.scratch
	}
	if prev != nil {
		if prev.count != len(g.idx) || !bytes.Equal(prev.records, g.records) {
			return errSequenceReused
		}
		g.buf = prev.batch
	}
	return nil
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
