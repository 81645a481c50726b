package sink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
)

// Write and its rounds: how a call is cut into produce rounds, how a round's
// failures are told apart (broker-wide, a topic's, a record's) and narrowed
// down to their culprits, in the order the package doc promises.

// Write produces each event as a record (topic, key, value, headers) and
// blocks until every one is acknowledged by Kafka with acks=all, or has
// failed for a reason of its own. Broker-wide failures (unreachable, not
// enough replicas, leader not available, timeouts) are retried with backoff
// until ctx is done: the caller must hold its LSN meanwhile, nothing is
// dropped. It returns nil, ctx's error, or a *WriteError listing, by index in
// events, the events that failed on their own; every event not listed was
// acknowledged. A transactional sink (Config.TransactionalID) writes into
// the open transaction, opening one if none is, and may also return an error
// wrapping ErrFenced or ErrTxnAborted (txn.go): then the transaction cannot
// commit. Not safe for concurrent use (one writer keeps per-partition
// order).
//
// Every event must have its Topic set. events is not modified, and its bytes
// must not be modified until Write returns.
func (k *Kafka) Write(ctx context.Context, events []event.Event) error {
	return k.Send(ctx, events).Wait(ctx)
}

// writeAll writes a call's events as Write promises, one round at a time.
func (k *Kafka) writeAll(ctx context.Context, events []event.Event) error {
	st := k.newWriteState(events)
	if err := k.writeRounds(ctx, st, nil); err != nil {
		return err
	}
	return k.finish(st, events)
}

// writeRounds writes st.msgs[at...] (all of them when at is nil), in input
// order, one round at a time.
func (k *Kafka) writeRounds(ctx context.Context, st *writeState, at []int) error {
	msgs := st.msgs
	// Chunk boundaries in input order; see the package doc for why a call is
	// capped at BatchSize messages and BatchBytes bytes.
	var idx []int
	var chunkBytes int64
	flush := func() error {
		if len(idx) == 0 {
			return nil
		}
		err := k.write(ctx, st, idx)
		idx, chunkBytes = idx[:0], 0
		return err
	}
	n := len(msgs)
	if at != nil {
		n = len(at)
	}
	for j := range n {
		i := j
		if at != nil {
			i = at[j]
		}
		if msgs[i].Topic == "" {
			// A caller's bug: it could not be produced.
			st.fail(i, fmt.Errorf("message has no topic: %w", kerr.InvalidTopicException))
			continue
		}
		if st.held(i) {
			st.fail(i, ErrBehind)
			continue
		}
		if err := checkTopicName(msgs[i].Topic); err != nil {
			// With auto-creation off the broker would call it unknown, and
			// never say it is invalid.
			st.fail(i, err)
			continue
		}
		size := messageSize(&msgs[i])
		if size > k.cfg.BatchBytes {
			st.fail(i, fmt.Errorf("message of %d bytes is larger than the %d-byte batch limit (sink batch bytes): %w", size, k.cfg.BatchBytes, kerr.MessageTooLarge))
			continue
		}
		if len(idx) == k.cfg.BatchSize || chunkBytes+size > k.cfg.BatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		idx = append(idx, i)
		chunkBytes += size
	}
	return flush()
}

// finish returns the *WriteError of a call's failures, or nil.
func (k *Kafka) finish(st *writeState, events []event.Event) error {
	if len(st.fails) == 0 {
		return nil
	}
	k.stats.failures.Add(int64(len(st.fails)))
	slices.SortFunc(st.fails, func(a, b Failure) int { return a.Index - b.Index })
	judge(st.fails, events)
	return &WriteError{Failures: st.fails}
}

// writeState is one Write's messages and failures so far.
type writeState struct {
	msgs   []event.Event // the call's events
	fails  []Failure
	failed map[event.Lane]int   // lane of every failed message → its lowest index (-1: held by an earlier call)
	since  map[string]time.Time // topics waited for (being created) → since when
}

// newWriteState starts a call's state, its messages of lanes held by an
// earlier call's failures (pipeline.go) failing with ErrBehind.
func (k *Kafka) newWriteState(msgs []event.Event) *writeState {
	st := &writeState{msgs: msgs}
	if len(k.pipe.holds) > 0 {
		st.failed = make(map[event.Lane]int, len(k.pipe.holds))
		for lane := range k.pipe.holds {
			st.failed[lane] = -1
		}
	}
	return st
}

func orderKey(m *event.Event) event.Lane { return event.Lane{Topic: m.Topic, Key: string(m.Key)} }

func (st *writeState) fail(i int, err error) {
	st.fails = append(st.fails, Failure{Index: i, Err: err})
	if st.failed == nil {
		st.failed = make(map[event.Lane]int)
	}
	k := orderKey(&st.msgs[i])
	if first, ok := st.failed[k]; !ok || i < first {
		st.failed[k] = i
	}
}

// held reports whether message i must wait behind a failed one: an earlier
// message of its key failed.
func (st *writeState) held(i int) bool {
	if len(st.failed) == 0 {
		return false
	}
	first, ok := st.failed[orderKey(&st.msgs[i])]
	return ok && first < i
}

// hold fails the messages of idx that must wait behind a failed one and
// returns the others, in order.
func (st *writeState) hold(idx []int) []int {
	if len(st.failed) == 0 {
		return idx
	}
	out := make([]int, 0, len(idx))
	for _, i := range idx {
		if st.held(i) {
			st.fail(i, ErrBehind)
			continue
		}
		out = append(out, i)
	}
	return out
}

// write writes msgs[idx...] in order until each is acknowledged or has failed
// on its own, appending those to fails. It returns only nil, ctx's error, or
// an error that ends the transaction (txnFatal).
func (k *Kafka) write(ctx context.Context, st *writeState, idx []int) error {
	msgs := st.msgs
	attempt := 0
	for {
		if idx = st.hold(idx); len(idx) == 0 {
			return nil
		}
		batch := gather(msgs, idx)
		err := k.produce(ctx, batch)
		k.stats.writes.Add(1)
		if txnFatal(err) {
			return err
		}
		if err == nil {
			k.acked(batch, nil)
			if attempt > 0 {
				k.log.Info("kafka write recovered", "attempts", attempt+1)
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}

		var werrs writeErrors
		if !errors.As(err, &werrs) || len(werrs) != len(batch) {
			again, err := k.writeRefused(ctx, st, idx, batch, err, &attempt)
			if !again || err != nil {
				return err
			}
			continue
		}

		// Per partition: each partition's batch succeeded or failed whole.
		k.acked(batch, werrs)
		retry, retryErr, err := k.writeFailed(ctx, st, idx, werrs)
		if err != nil || len(retry) == 0 {
			return err
		}
		// Only the failed partitions' messages go again, before anything
		// that follows them in the input.
		if retryErr != nil {
			if err := k.backoff(ctx, attempt, retryErr); err != nil {
				return err
			}
			attempt++
		} else if err := backoff.Sleep(ctx, topicPoll); err != nil {
			// Only topics being created: not an outage.
			return err
		}
		idx = retry
	}
}

// writeRefused handles a write of msgs[idx...] (batch) whose whole call was refused
// before anything was produced (metadata for a topic, or the connection):
// it writes them in parts, fails them, or waits, and says whether to write
// them again (again), counting a broker-wide failure's attempt.
func (k *Kafka) writeRefused(ctx context.Context, st *writeState, idx []int, batch []event.Event, err error, attempt *int) (again bool, _ error) {
	msgs := st.msgs
	switch {
	case !perMessage(err):
		// Broker-wide: retry the same call.
		if err := k.backoff(ctx, *attempt, err); err != nil {
			return false, err
		}
		*attempt++
		return true, nil
	case !oneTopic(batch):
		// The refusal does not say which topic failed: write each topic
		// on its own. Topics are independent for ordering.
		for _, group := range byTopic(msgs, idx) {
			if err := k.write(ctx, st, group); err != nil {
				return false, err
			}
		}
		return false, nil
	case topicLevel(err):
		ferr, wait := k.topicFailure(ctx, st, msgs[idx[0]].Topic, err)
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		if wait {
			if err := backoff.Sleep(ctx, topicPoll); err != nil {
				return false, err
			}
			return true, nil
		}
		for _, i := range idx {
			if st.held(i) {
				st.fail(i, ErrBehind)
			} else {
				st.fail(i, ferr)
			}
		}
		return false, nil
	case len(idx) == 1:
		st.fail(idx[0], err)
		return false, nil
	default:
		// Not expected (sizes are checked up front), but a record-level
		// refusal of the whole call is narrowed down like one of a batch.
		half := len(idx) / 2
		if err := k.write(ctx, st, idx[:half]); err != nil {
			return false, err
		}
		return false, k.write(ctx, st, idx[half:])
	}
}

// writeFailed handles the partitions' answers werrs to a write of
// msgs[idx...] (each partition's batch succeeded or failed whole): it fails
// the messages that failed on their own, finds the culprits of a
// record-level error by halves, and returns the messages to write again
// with the broker-wide error that failed them (nil when only topics being
// created did).
func (k *Kafka) writeFailed(ctx context.Context, st *writeState, idx []int, werrs writeErrors) (retry []int, retryErr, _ error) {
	msgs := st.msgs
	var isolate []int
	records := 0
	for _, e := range werrs {
		if e != nil && perMessage(e) && !topicLevel(e) {
			records++
		}
	}
	// A topic-level answer for a partition (its leader does not know the
	// topic yet, or may not write it) is decided once per topic.
	var topicErrs map[string]error
	for j, e := range werrs {
		switch {
		case e == nil:
		case !perMessage(e):
			retry = append(retry, idx[j])
			retryErr = e
		case topicLevel(e):
			topic := msgs[idx[j]].Topic
			ferr, seen := topicErrs[topic]
			if !seen {
				var wait bool
				if ferr, wait = k.topicFailure(ctx, st, topic, e); ctx.Err() != nil {
					return nil, nil, ctx.Err()
				} else if wait {
					ferr = nil
				}
				if topicErrs == nil {
					topicErrs = make(map[string]error)
				}
				topicErrs[topic] = ferr
			}
			if ferr == nil {
				retry = append(retry, idx[j])
			} else {
				st.fail(idx[j], ferr)
			}
		case records > 1:
			isolate = append(isolate, idx[j])
		default:
			st.fail(idx[j], e)
		}
	}
	if len(isolate) > 0 {
		// A record-level error for a batch of several messages: find the
		// culprits by halves, each half in order after the one before.
		half := len(isolate) / 2
		if err := k.write(ctx, st, isolate[:half]); err != nil {
			return nil, nil, err
		}
		if err := k.write(ctx, st, isolate[half:]); err != nil {
			return nil, nil, err
		}
	}
	return retry, retryErr, nil
}

// backoff counts a broker-wide failure, records it as (part of) an outage,
// and waits before the next attempt.
func (k *Kafka) backoff(ctx context.Context, attempt int, cause error) error {
	k.retrying(cause)
	// Jittered: relays restarted together do not hammer a recovering
	// cluster in step.
	d := backoff.Delay(k.cfg.RetryMin, k.cfg.RetryMax, attempt)
	// The first failure and then every tenth: an outage is visible without a
	// line per retry.
	if attempt%10 == 0 {
		k.log.Warn("kafka unavailable, retrying", "attempt", attempt+1, "backoff", d, "err", cause)
	}
	return backoff.Sleep(ctx, d)
}

func (k *Kafka) acked(batch []event.Event, werrs writeErrors) {
	var n, b int64
	for i := range batch {
		if werrs == nil || werrs[i] == nil {
			n++
			b += int64(len(batch[i].Key) + len(batch[i].Value))
		}
	}
	k.stats.messages.Add(n)
	k.stats.bytes.Add(b)
	if n > 0 {
		if since := k.outageOver(); !since.IsZero() {
			k.log.Info("kafka available again", "after", time.Since(since).Round(time.Millisecond))
		}
		k.franz.warned.Store(false)
	}
}

// gather returns the messages at idx, without copying when idx is one
// contiguous run (the common case).
func gather(msgs []event.Event, idx []int) []event.Event {
	if idx[len(idx)-1]-idx[0] == len(idx)-1 {
		return msgs[idx[0] : idx[0]+len(idx)]
	}
	out := make([]event.Event, len(idx))
	for j, i := range idx {
		out[j] = msgs[i]
	}
	return out
}

func oneTopic(batch []event.Event) bool {
	for i := range batch {
		if batch[i].Topic != batch[0].Topic {
			return false
		}
	}
	return true
}

// byTopic groups idx by topic, in order of first appearance, keeping input
// order within each group.
func byTopic(msgs []event.Event, idx []int) [][]int {
	var groups [][]int
	pos := make(map[string]int)
	for _, i := range idx {
		g, ok := pos[msgs[i].Topic]
		if !ok {
			g = len(groups)
			pos[msgs[i].Topic] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// messageSize is a message's size as it is counted against BatchBytes (as
// kafka-go's Writer counted it, so that the limit means what it always
// did): the v0/v1 message format's fixed overhead, key and value, and the
// headers as varint-prefixed strings.
func messageSize(m *event.Event) int64 {
	const fixed = 4 + 1 + 1 + 4 + 4 + 8 // crc, magic, attributes, key and value lengths, timestamp
	n := int64(fixed + len(m.Key) + len(m.Value))
	n += varintLen(len(m.Headers))
	for _, h := range m.Headers {
		n += varintLen(len(h.Key)) + int64(len(h.Key)) + varintLen(len(h.Value)) + int64(len(h.Value))
	}
	return n
}

// varintLen is the length of n as a zig-zag varint.
func varintLen(n int) int64 {
	u := uint64(int64(n)<<1) ^ uint64(int64(n)>>63)
	l := int64(1)
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// writeErrors is a round's answer per message, aligned with the round's
// messages: nil for those acknowledged.
type writeErrors []error

func (w writeErrors) Error() string {
	n, first := 0, error(nil)
	for _, e := range w {
		if e != nil {
			if first == nil {
				first = e
			}
			n++
		}
	}
	return fmt.Sprintf("%d of %d messages failed, first: %v", n, len(w), first)
}
