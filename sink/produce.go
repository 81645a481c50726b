package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
	produceAPI "github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// This file produces a call's messages with one produce request per leader
// broker, each holding a record batch per partition (record batches encoded
// here, compressed or not: recordbatch.go), on the sink's own pipelined
// connection to that broker (conn.go), in place of kafka.Writer.WriteMessages.
// The Writer asked the Transport's metadata cache once per message, copied
// every message into a per-partition batch, and lingered up to BatchTimeout
// for batches that were not full; RawProduce after it sent a request per
// partition, each on a connection of its own (a round of 40 partitions was 40
// connections, requests and goroutines, and as much work for the broker).
// produce keeps the Writer's contract, which Write's ordering argument rests
// on:
//
//   - A call's messages of one partition go in one record batch, in input
//     order (Write caps a call at BatchBytes, so the request fits), and that
//     batch succeeds or fails whole: all-or-nothing per partition (the
//     broker answers per partition).
//   - The partition is kafka.Murmur2Balancer over the topic's partitions as
//     the Transport's metadata cache knows them (refreshed every
//     MetadataTTL), asked once per topic per call, with
//     AllowAutoTopicCreation as configured: an unknown topic fails the whole
//     call with kafka-go's error, as with the Writer. The same answer names
//     each partition's leader, where its batch goes.
//   - A batch is tried up to maxAttempts times while its error is temporary
//     (kafka-go's rule: Temporary() or a transient network error), with a
//     short backoff; then the error is every message's of that partition,
//     as kafka.WriteErrors aligned with the call's messages.
//   - A request runs under WriteTimeout and is not cancelled with the
//     caller's context: when ctx is done, produce returns ctx's error and the
//     requests in flight finish on their own (Close waits for them); the next
//     call records their outcome before it sends anything (stragglers).

// produceBackoffMin and produceBackoffMax are kafka-go Writer's defaults
// between its own attempts.
const (
	produceBackoffMin = 100 * time.Millisecond
	produceBackoffMax = time.Second
)

// partitionBatch is a call's messages of one partition: one record batch in
// the produce request to the partition's leader.
type partitionBatch struct {
	topic     string
	partition int
	idx       []int32     // into the call's messages, in order
	buf       []byte      // the encoded record batch (recordbatch.go)
	scratch   []byte      // a compressed batch's records before compression
	records   []byte      // the uncompressed records of buf (in buf or scratch)
	now       time.Time   // the encoding time
	leader    int32       // the broker the batch was sent to
	seq       *sequence   // the partition's sequence numbers; nil without idempotence
	sent      *sentBatch  // the batch as sent under seq; nil without idempotence
	hdr       batchHeader // producer id, epoch and base sequence
	err       error
}

// reusable reports whether g's buffers may be encoded into again: nothing
// keeps them for a byte-identical resend.
func (g *partitionBatch) reusable() bool { return g.sent == nil || g.sent.state == appended }

// produce writes batch and returns nil, ctx's error, an error that refused
// the whole call before anything was produced (metadata, an unknown topic,
// no producer id), an error that ends the transaction (txnFatal), or
// kafka.WriteErrors with one entry per message of batch
// (nil for those acknowledged).
func (k *Kafka) produce(ctx context.Context, batch []kafka.Message) error {
	if len(batch) == 0 {
		return nil
	}
	if k.franz != nil {
		return k.produceFranz(ctx, batch)
	}
	idempotent := !k.cfg.DisableIdempotence
	// Requests a cancelled call left in flight settle their partitions'
	// sequence numbers: those are read after them.
	if err := k.settleStragglers(ctx); err != nil {
		return err
	}
	k.topicParts = k.topicParts[:0]
	groups, err := k.partitionBatches(ctx, batch, k.groups[:0])
	k.groups = groups
	if err != nil {
		return err
	}
	if idempotent && k.prod.id < 0 {
		if k.transactional() {
			return errNoTransactions
		}
		if err := k.initProducer(ctx, "first produce"); err != nil {
			return err
		}
	}
	if k.transactional() {
		if err := k.txnProduce(ctx, batch, groups); err != nil {
			return err
		}
	} else if err := k.rounds(ctx, batch, groups); err != nil {
		return err
	}
	return k.writeErrors(batch, groups)
}

// rounds sends groups (round), and with idempotence again under a new
// producer id those refused for the producer's state or not sent because
// their sequence numbers may be taken, up to maxResets times.
func (k *Kafka) rounds(ctx context.Context, batch []kafka.Message, groups []*partitionBatch) error {
	idempotent := !k.cfg.DisableIdempotence
	round := groups
	for resets := 0; ; resets++ {
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
		round = again
	}
	return nil
}

// writeErrors returns the groups' errors as kafka.WriteErrors aligned with
// batch (nil when every group was acknowledged), and gives their buffers
// back to the pool.
func (k *Kafka) writeErrors(batch []kafka.Message, groups []*partitionBatch) error {
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
	k.keepGroups(groups)
	if werrs != nil {
		return werrs
	}
	return nil
}

// partitionBatches groups batch by partition, in input order within each,
// into groups (reused batches from the pool first). It fails when a topic's
// partitions are not known (metadata, an unknown topic). The topics' leaders
// are kept in topicParts, which the caller empties once per call.
func (k *Kafka) partitionBatches(ctx context.Context, batch []kafka.Message, groups []*partitionBatch) ([]*partitionBatch, error) {
	if k.groupOf == nil {
		k.groupOf = make(map[topicPartition]int)
	}
	clear(k.groupOf)
	for i := range batch {
		m := &batch[i]
		parts, err := k.partitionsOf(ctx, m.Topic)
		if err != nil {
			return groups, err
		}
		p := k.balancer.Balance(*m, k.partitionList(parts)...)
		tp := topicPartition{m.Topic, p}
		g, ok := k.groupOf[tp]
		if !ok {
			g = len(groups)
			k.groupOf[tp] = g
			groups = append(groups, k.newGroup(tp))
		}
		groups[g].idx = append(groups[g].idx, int32(i))
	}
	return groups, nil
}

// newGroup returns an empty partition batch for tp, with the buffers of one
// from the pool when there is one.
func (k *Kafka) newGroup(tp topicPartition) *partitionBatch {
	if n := len(k.spare); n > 0 {
		g := k.spare[n-1]
		k.spare = k.spare[:n-1]
		k.spareBytes -= int64(cap(g.buf) + cap(g.scratch))
		*g = partitionBatch{topic: tp.topic, partition: tp.partition, idx: g.idx[:0], buf: g.buf[:0], scratch: g.scratch[:0]}
		return g
	}
	return &partitionBatch{topic: tp.topic, partition: tp.partition}
}

// keepGroups returns to the pool the partition batches whose buffers nothing
// keeps, with buffers up to about two rounds' worth in all (a round is at
// most BatchBytes): what a burst encoded must not stay in memory.
func (k *Kafka) keepGroups(groups []*partitionBatch) {
	for _, g := range groups {
		if !g.reusable() || len(k.spare) >= 256 {
			continue
		}
		if n := int64(cap(g.buf) + cap(g.scratch)); k.spareBytes+n > 2*k.cfg.BatchBytes {
			g.buf, g.scratch = nil, nil
		} else {
			k.spareBytes += n
		}
		g.records, g.seq, g.sent, g.err = nil, nil, nil, nil
		k.spare = append(k.spare, g)
	}
}

// round sends groups (one produce request per leader broker), retrying a
// group's temporary errors up to maxAttempts times with a short backoff, as
// kafka-go's Writer did, and waits for them. When ctx ends first it returns
// ctx's error and leaves the requests to settle later (stragglers): their
// outcome decides their partitions' sequence numbers.
func (k *Kafka) round(ctx context.Context, batch []kafka.Message, groups []*partitionBatch) error {
	for attempt := 0; ; attempt++ {
		flights := k.launch(ctx, batch, groups, nil)
		for i, f := range flights {
			select {
			case <-f.call.done:
				k.land(f)
			case <-ctx.Done():
				k.stragglers = append(k.stragglers, flights[i:]...)
				return ctx.Err()
			}
		}
		if attempt == maxAttempts-1 {
			return nil
		}
		var again []*partitionBatch
		for _, g := range groups {
			var pse *ProducerStateError
			if g.err != nil && temporary(g.err) && !errors.As(g.err, &pse) {
				again = append(again, g)
			}
		}
		if len(again) == 0 {
			return nil
		}
		if err := backoff.Sleep(ctx, backoff.Delay(produceBackoffMin, produceBackoffMax, attempt)); err != nil {
			return err
		}
		// A leader may have moved: the next attempt asks the metadata cache
		// again. When it cannot answer, the groups keep their errors and
		// Write's loop takes over.
		k.topicParts = k.topicParts[:0]
		for _, g := range again {
			if _, err := k.partitionsOf(ctx, g.topic); err != nil {
				return nil
			}
		}
		groups = again
	}
}

// settleStragglers waits for the requests a cancelled call left in flight
// and records their outcome.
func (k *Kafka) settleStragglers(ctx context.Context) error {
	for len(k.stragglers) > 0 {
		f := k.stragglers[0]
		select {
		case <-f.call.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		k.land(f)
		k.stragglers = k.stragglers[1:]
	}
	k.stragglers = nil
	return nil
}

// A flight is one produce request: the batches of one round for one broker.
type flight struct {
	call   *call
	groups []*partitionBatch
	landed bool
}

// launch encodes groups, with idempotence under their sequence numbers
// (place), and sends one produce request per leader broker. A group that
// cannot be sent (its sequence numbers may be taken, no leader, no
// connection) gets its error at once and is not sent. p, when set, counts
// the requests until they are answered.
func (k *Kafka) launch(ctx context.Context, batch []kafka.Message, groups []*partitionBatch, p *pending) []*flight {
	type brokerReq struct {
		req    *rawproduce.Request
		groups []*partitionBatch
	}
	var byBroker []brokerReq
	for _, g := range groups {
		g.err = nil
		if err := k.encode(batch, g); err != nil {
			g.err = err
			continue
		}
		leader, err := k.leaderOf(g.topic, g.partition)
		if err != nil {
			g.err = k.landGroup(g, err, false)
			continue
		}
		g.leader = leader
		var r *brokerReq
		for i := range byBroker {
			if byBroker[i].groups[0].leader == leader {
				r = &byBroker[i]
			}
		}
		if r == nil {
			byBroker = append(byBroker, brokerReq{req: &rawproduce.Request{
				Acks: int16(kafka.RequireAll), Timeout: int32(k.cfg.WriteTimeout / time.Millisecond),
				TransactionalID: k.cfg.TransactionalID}})
			r = &byBroker[len(byBroker)-1]
		}
		r.groups = append(r.groups, g)
		t := len(r.req.Topics) - 1
		if t < 0 || r.req.Topics[t].Topic != g.topic {
			r.req.Topics = append(r.req.Topics, rawproduce.RequestTopic{Topic: g.topic})
			t++
		}
		r.req.Topics[t].Partitions = append(r.req.Topics[t].Partitions, rawproduce.RequestPartition{
			Partition: int32(g.partition), RecordSet: protocol.RawRecordSet{Reader: bytes.NewReader(g.buf)}})
	}
	var onDone func()
	if p != nil {
		p.left.Add(int32(len(byBroker)))
		onDone = p.answered
	}
	flights := make([]*flight, 0, len(byBroker))
	for _, r := range byBroker {
		f := &flight{groups: r.groups}
		c, err := k.conn(ctx, r.groups[0].leader)
		if err != nil {
			f.call = &call{done: make(chan struct{})}
			f.call.finish(nil, err)
			if onDone != nil {
				onDone()
			}
		} else {
			f.call = c.send(ctx, r.req, onDone)
		}
		flights = append(flights, f)
	}
	return flights
}

// land records a flight's answer: each group's error (nil when
// acknowledged) and, with idempotence, its sequence numbers' fate.
func (k *Kafka) land(f *flight) {
	if f.landed {
		return
	}
	f.landed = true
	if err := f.call.err; err != nil {
		if !f.call.written {
			// Never reached the broker: a connection's failure is the
			// broker's, and a request not written is refused.
			for _, g := range f.groups {
				g.err = k.landGroup(g, err, false)
			}
			return
		}
		for _, g := range f.groups {
			g.err = k.landGroup(g, err, true)
		}
		return
	}
	res, _ := f.call.res.(*produceAPI.Response)
	for _, g := range f.groups {
		err := error(kafka.UnknownTopicOrPartition) // not in the answer
		if res != nil {
		answer:
			for _, t := range res.Topics {
				if t.Topic != g.topic {
					continue
				}
				for _, p := range t.Partitions {
					if int(p.Partition) == g.partition {
						err = kafkaError(p.ErrorCode, p.ErrorMessage)
						break answer
					}
				}
			}
		}
		g.err = k.landGroup(g, err, true)
	}
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
// metadata cache, once per topic per call, and notes its partitions'
// leaders and the brokers' addresses. With AllowAutoTopicCreation an
// unknown topic makes the Transport ask the broker, which creates it.
func (k *Kafka) partitionsOf(ctx context.Context, topic string) (int, error) {
	for _, tp := range k.topicParts {
		if tp.topic == topic {
			return len(tp.leaders), nil
		}
	}
	r, err := k.metadataFor(topic).RoundTrip(ctx, k.addr, &metadataAPI.Request{
		TopicNames:             []string{topic},
		AllowAutoTopicCreation: k.cfg.AllowAutoTopicCreation,
	})
	if err != nil {
		return 0, err
	}
	res := r.(*metadataAPI.Response)
	for _, b := range res.Brokers {
		addr := net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
		if k.brokers[b.NodeID] != addr {
			if k.brokers == nil {
				k.brokers = make(map[int32]string)
			}
			k.brokers[b.NodeID] = addr
		}
	}
	for _, t := range res.Topics {
		if t.Name == topic {
			if t.ErrorCode != 0 {
				return 0, kafka.Error(t.ErrorCode)
			}
			if len(t.Partitions) == 0 {
				return 0, kafka.UnknownTopicOrPartition
			}
			leaders := make([]int32, len(t.Partitions))
			for i := range leaders {
				leaders[i] = -1
			}
			for _, p := range t.Partitions {
				if int(p.PartitionIndex) < len(leaders) {
					leaders[p.PartitionIndex] = p.LeaderID
				}
			}
			k.topicParts = append(k.topicParts, topicCount{topic, leaders})
			return len(leaders), nil
		}
	}
	return 0, kafka.UnknownTopicOrPartition
}

type topicCount struct {
	topic   string
	leaders []int32 // by partition; -1: none known
}

// leaderOf returns the leader of a partition of a topic partitionsOf was
// asked about in this call.
func (k *Kafka) leaderOf(topic string, partition int) (int32, error) {
	for _, tp := range k.topicParts {
		if tp.topic != topic {
			continue
		}
		if partition < len(tp.leaders) {
			if id := tp.leaders[partition]; id >= 0 {
				if _, ok := k.brokers[id]; ok {
					return id, nil
				}
			}
		}
		return -1, kafka.LeaderNotAvailable
	}
	return -1, kafka.UnknownTopicOrPartition
}

// conn returns the pipelined connection to a broker, dialling it when there
// is none or the last one failed.
func (k *Kafka) conn(ctx context.Context, id int32) (*brokerConn, error) {
	addr := k.brokers[id]
	k.connMu.Lock()
	c := k.conns[id]
	k.connMu.Unlock()
	if c != nil && !c.broken() && c.addr == addr {
		return c, nil
	}
	nc, err := k.dialBroker(ctx, addr)
	if err != nil {
		return nil, err
	}
	k.connMu.Lock()
	if k.conns == nil {
		k.conns = make(map[int32]*brokerConn)
	}
	k.conns[id] = nc
	k.connMu.Unlock()
	if c != nil {
		if c.broken() {
			c.close() // at once: its requests already failed
		} else {
			// The broker moved: what is in flight on the old address
			// settles on its own; Close closes it.
			k.retired = append(k.retired, c)
		}
	}
	return nc, nil
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
