package sink

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/event"
)

// This file pipelines writes: Send produces a call's events and returns
// before Kafka answers, so that the next calls' requests are in flight behind
// it, up to MaxInFlight per broker connection (conn.go); Wait, called for the
// Sends in the order they were made, returns what Write would have. Kafka's
// Java producer does the same with up to five requests in flight per broker.
//
// Why order and "acknowledged means appended" hold with several requests in
// flight:
//
//   - Only the idempotent producer pipelines. Its batches carry per-partition
//     sequence numbers, taken in the order of the Sends, and the broker
//     appends a partition's batch only if it follows the last one it
//     appended (else OUT_OF_ORDER_SEQUENCE_NUMBER, nothing appended). So a
//     batch is never appended before an earlier batch of its partition, even
//     when that one failed or its requests arrived in another order; and an
//     acknowledged batch means every earlier batch of its partition is in
//     the log. The broker checks this only once it holds the producer's
//     state for the partition, so a partition is pipelined only after a
//     batch of it was acknowledged under the current producer id (sequence.
//     acked); until then, and without idempotence, Sends are stop-and-wait.
//   - The fast path is all-or-nothing per call and touches nothing it cannot
//     undo: a call is pipelined only when it fits one round (BatchSize,
//     BatchBytes), every topic name and size is valid, every topic's
//     partitions and leaders are known, and no partition it writes has a
//     failed batch; otherwise it is deferred, and its Wait writes it as Write
//     always did, after every earlier Send was waited for.
//   - When a Wait finds a batch that was not acknowledged, pipelining stops:
//     later Sends are deferred until every Send made so far was waited for,
//     and the Sends still in flight are answered first, so that every
//     partition's sequence numbers are known (idempotence.go: a batch whose
//     outcome is unknown is sent again byte-identical; refused batches free
//     their numbers only when nothing after them may have been appended).
//     Then the failed batches' events are written as Write writes them:
//     retried through outages, narrowed down to the culprits, failed alone.
//     Later Sends' batches behind them failed too (their sequence did not
//     follow) and are written again by their own Wait, in order.
//   - An event that fails holds its lane in the Sends made before its Wait
//     returned: the caller learns of the failure only then, so those events
//     of the lane fail with ErrBehind instead of overtaking it.
//   - A Wait that returns ctx's error gives up on every Send not yet waited
//     for (Abandon): their requests settle their partitions' sequence
//     numbers before the next call sends anything (stragglers).

// errAbandoned is Wait's answer for a Send given up on (Abandon, or an
// earlier Wait returned ctx's error): none of its events is acknowledged.
var errAbandoned = errors.New("sink: write abandoned: an earlier wait ended or Abandon was called")

// pipe is the Sends not yet waited for.
type pipe struct {
	pending []*pending
	// sequential: Sends are deferred (written by their Wait, one at a time)
	// until every earlier Send was waited for.
	sequential bool
	// holds are the lanes of events that failed while later Sends were
	// outstanding: their events in those Sends fail with ErrBehind.
	holds map[event.Lane]bool
}

// pending is a Send; see Delivery.
type pending struct {
	k         *Kafka
	events    []event.Event
	msgs      []kafka.Message
	hdrs      []kafka.Header
	rounds    []sendRound
	left      atomic.Int32 // requests not yet answered, plus one until all are sent
	done      chan struct{}
	deferred  bool // written by Wait
	abandoned bool
}

func (p *pending) Done() <-chan struct{} { return p.done }

func (p *pending) answeredYet() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// answered counts one request answered (or the end of sending).
func (p *pending) answered() {
	if p.left.Add(-1) == 0 {
		close(p.done)
	}
}

// Send starts writing events and returns without waiting for Kafka's
// answer when it can (see the top of pipeline.go); the returned Delivery's
// Wait reports the outcome. It may block while MaxInFlight requests are in
// flight to a broker. The events and their bytes must not be modified until
// Wait returns. Not safe for concurrent use (one goroutine sends and waits).
func (k *Kafka) Send(ctx context.Context, events []event.Event) Delivery {
	p := &pending{k: k, events: events, done: make(chan struct{})}
	p.msgs, p.hdrs = k.records(events)
	if !k.pipelined(ctx, p) {
		p.deferred = true
		close(p.done)
		k.pipe.sequential = true
	}
	k.pipe.pending = append(k.pipe.pending, p)
	return p
}

// pipelined sends p's events at once if it can (see the top of the file),
// in rounds of at most BatchSize messages and BatchBytes bytes.
func (k *Kafka) pipelined(ctx context.Context, p *pending) bool {
	// A transaction's writes are one at a time (txn.go): its partitions are
	// added to it before a round, and its leader verifies them one request
	// at a time.
	if k.franz != nil || k.cfg.DisableIdempotence || k.cfg.MaxInFlight < 2 || k.pipe.sequential || k.transactional() ||
		len(k.stragglers) > 0 || k.prod.id < 0 || len(p.msgs) == 0 {
		return false
	}
	// Round boundaries, as writeRounds cuts them.
	var cuts []int
	var size int64
	for i := range p.msgs {
		m := &p.msgs[i]
		if m.Topic == "" || checkTopicName(m.Topic) != nil {
			return false
		}
		n := messageSize(m)
		if n > k.cfg.BatchBytes {
			return false
		}
		if last := lastCut(cuts); i-last == k.cfg.BatchSize || size+n > k.cfg.BatchBytes {
			cuts = append(cuts, i)
			size = 0
		}
		size += n
	}
	cuts = append(cuts, len(p.msgs))
	k.topicParts = k.topicParts[:0]
	ok := true
	from := 0
	for _, to := range cuts {
		groups, err := k.partitionBatches(ctx, p.msgs[from:to], nil)
		p.rounds = append(p.rounds, sendRound{from: from, groups: groups})
		from = to
		if ok = err == nil; !ok {
			break
		}
		for _, g := range groups {
			s := k.prod.seqs[topicPartition{g.topic, g.partition}]
			if s != nil {
				s.settle()
			}
			if s == nil || !s.clear() {
				ok = false
			} else if _, err := k.leaderOf(g.topic, g.partition); err != nil {
				ok = false
			}
		}
		if !ok {
			break
		}
	}
	if !ok {
		for _, r := range p.rounds {
			k.keepGroups(r.groups)
		}
		p.rounds = nil
		return false
	}
	for _, q := range k.pipe.pending {
		if !q.answeredYet() {
			k.stats.pipelined.Add(1)
			break
		}
	}
	p.left.Store(1)
	for i := range p.rounds {
		r := &p.rounds[i]
		r.flights = k.launch(ctx, p.msgs[r.from:], r.groups, p)
	}
	p.answered()
	return true
}

func lastCut(cuts []int) int {
	if len(cuts) == 0 {
		return 0
	}
	return cuts[len(cuts)-1]
}

// A sendRound is one round of a pipelined Send: its messages from from on,
// grouped by partition (indexes relative to from), and its requests.
type sendRound struct {
	from    int
	groups  []*partitionBatch
	flights []*flight
}

// Abandon gives up on every Send not yet waited for: none of their events
// counts as acknowledged (their requests settle before the next call sends
// anything). For a caller that stops without waiting.
func (k *Kafka) Abandon() {
	for _, q := range k.pipe.pending {
		q.abandoned = true
		k.stragglers = append(k.stragglers, q.flights()...)
	}
	k.pipe = pipe{}
}

func (p *pending) Wait(ctx context.Context) error {
	k := p.k
	if p.abandoned {
		return errAbandoned
	}
	if len(k.pipe.pending) == 0 || k.pipe.pending[0] != p {
		return errors.New("sink: Wait called out of the order of the Sends")
	}
	err := p.wait(ctx)
	k.pipe.pending = k.pipe.pending[1:]
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		k.stragglers = append(k.stragglers, p.flights()...)
		k.Abandon()
		return err
	}
	k.release(p.msgs, p.hdrs)
	p.msgs, p.hdrs = nil, nil
	var we *WriteError
	if len(k.pipe.pending) == 0 {
		k.pipe = pipe{}
	} else if errors.As(err, &we) {
		if k.pipe.holds == nil {
			k.pipe.holds = make(map[event.Lane]bool)
		}
		for _, f := range we.Failures {
			k.pipe.holds[event.Lane{Topic: p.events[f.Index].Topic, Key: string(p.events[f.Index].Key)}] = true
		}
	}
	return err
}

func (p *pending) wait(ctx context.Context) error {
	k := p.k
	if p.deferred {
		return k.writeAll(ctx, p.msgs, p.events)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	k.stats.writes.Add(1)
	var failed []int
	for _, r := range p.rounds {
		for _, f := range r.flights {
			k.land(f)
		}
		for _, g := range r.groups {
			if g.err != nil {
				for _, i := range g.idx {
					failed = append(failed, r.from+int(i))
				}
			}
		}
	}
	if len(failed) == 0 {
		k.acked(p.msgs, nil)
		for _, r := range p.rounds {
			k.keepGroups(r.groups)
		}
		return nil
	}
	// Trouble: no more pipelining until every Send so far is waited for,
	// and the later Sends' requests are answered first, so that every
	// partition's sequence numbers are known before anything is sent again.
	k.pipe.sequential = true
	for _, q := range k.pipe.pending[1:] {
		if q.deferred {
			continue
		}
		select {
		case <-q.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		for _, f := range q.flights() {
			k.land(f)
		}
	}
	slices.Sort(failed)
	werrs := make(kafka.WriteErrors, len(p.msgs))
	for _, i := range failed {
		werrs[i] = errAbandoned // any: not acknowledged
	}
	k.acked(p.msgs, werrs)
	st := k.newWriteState(p.msgs)
	if err := k.writeRounds(ctx, st, failed); err != nil {
		return err
	}
	return k.finish(st, p.events)
}

// flights returns the requests of p.
func (p *pending) flights() []*flight {
	var out []*flight
	for _, r := range p.rounds {
		out = append(out, r.flights...)
	}
	return out
}
