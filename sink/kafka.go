// Package sink writes messages to Kafka with kafka-go and reports, per
// message, which ones Kafka acknowledged. It knows nothing of Postgres.
//
// Invariants enforced here:
//
//   - Acknowledged means written with acks=all. Write returns nil only when
//     every message was acknowledged, and a *WriteError lists exactly the
//     messages that were not; every message it does not list was acknowledged.
//   - A broker outage is not a message failure. Broker-wide failures (broker
//     unreachable, timeouts, leader not available, not enough replicas, …) are
//     retried with jittered exponential backoff until the context is done;
//     nothing is dropped and nothing is reported as failed for them. The caller
//     holds its position meanwhile, and Outage tells since when.
//   - A message that fails for a reason of its own (too large, corrupt or
//     invalid record, or its topic's trouble) fails without failing the
//     others, except the later messages of the same Write with the same topic
//     and key: those fail with ErrBehind instead of being written, or they
//     would overtake it. Permanent tells which failures are worth retrying
//     later.
//   - A topic's trouble is never taken for a broker outage and never holds up
//     other topics: an invalid name, a name that collides with an existing
//     topic, a missing topic, a topic the relay may not write or create. Its
//     messages fail with a *TopicError saying what is wrong, in Kafka's words
//     when Kafka gives them. A topic Kafka may be creating is waited for at
//     most TopicWait per Write; then its messages fail, not permanently.
//   - Ping asks a broker over a fresh connection, never kafka-go's cache: it
//     fails while no broker answers.
//   - Per-key order is input order, for every message that is acknowledged.
//     Keys map to partitions with kafka.Murmur2Balancer, the Java client's
//     partitioner (so Debezium's and ours agree).
//   - A sequence number is never used for other records (idempotence.go).
//     The producer is idempotent unless DisableIdempotence: each batch
//     carries a producer id, epoch and per-partition base sequence, which
//     advance only when the broker acknowledged the batch. A batch whose
//     outcome is unknown (timeout, connection lost, ctx done) is sent again
//     byte-identical, with the same sequence numbers, and the broker stores
//     it once; any other batch for that partition first takes a new producer
//     id, with sequences from 0, because the broker compares sequence
//     numbers, not records: other records under the old numbers would be
//     taken for the unknown batch and dropped, a lost event. A batch the
//     broker refused before appending it (too large, corrupt, unknown topic,
//     …) took no sequence numbers, so splitting it is safe.
//   - The broker's answers about the producer's state (OUT_OF_ORDER_SEQUENCE,
//     UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_EPOCH, PRODUCER_FENCED) take a new
//     producer id and send again, as the Java producer does without
//     transactions; DUPLICATE_SEQUENCE_NUMBER is an acknowledgement. Neither
//     is ever a message's failure.
//
// Why per-key order holds with kafka-go: Write caps each produce round at
// BatchSize messages and BatchBytes bytes (counted as kafka-go counts them),
// and a round sends one produce request per partition with that partition's
// messages in input order (produce.go, kafka-go's Client.RawProduce), so a round
// succeeds or fails all-or-nothing per partition, and the messages of failed
// partitions are written again before the next round starts. A message larger
// than BatchBytes would make Kafka refuse its whole partition's request, and
// an unknown topic fails the whole round at the metadata step: Write checks
// sizes and topic names up front, and on a topic-level error splits the round
// by topic, so only the culprits fail (see topic.go for what Kafka answers for
// each kind of topic trouble). When the broker answers MESSAGE_TOO_LARGE (or
// another record-level error) for a batch of several
// messages, Write writes that batch again in halves until it has the culprits.
//
// Delivery is at least once: idempotence removes the duplicates of the
// sink's own resends, not of what the caller writes again (after a crash,
// from the retry table) nor of batches still unknown when a new producer id
// is taken; those are new writes. Without idempotence a produce whose
// acknowledgement was lost is stored twice. Consumers deduplicate by the
// event id header. When Write returns the context's error, messages already
// sent may still be written afterwards; the caller should treat them as not
// acknowledged (with idempotence the next Write waits for those requests
// first, as they settle their partitions' sequence numbers).
//
// Write is not safe for concurrent use: one caller at a time keeps the
// per-partition order described above. Ping, Outage and Stats may be called
// from any goroutine, also while Write blocks.
package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
)

// A Kafka writes messages to Kafka. See the package doc for its guarantees.
type Kafka struct {
	cfg         Config
	addr        net.Addr
	transport   *kafka.Transport
	compression kafka.Compression
	log         *slog.Logger
	stats       stats
	inflight    sync.WaitGroup // produce requests running (see produce.go)

	// Write's goroutine only: see produce.go and topic.go.
	balancer   kafka.Murmur2Balancer
	groupOf    map[topicPartition]int
	groups     []*partitionBatch
	topicParts []topicCount
	parts      []int
	missing    map[string]missing
	msgBuf     []kafka.Message // records of the current Write
	hdrBuf     []kafka.Header
	abandoned  bool // a produce request of this Write failed or was left running
	prod       producer
	// straggling receives once per produce request that a round left
	// running when its ctx ended (stragglers of them still to come): the
	// next round waits for them, as they record their partitions' outcome.
	straggling chan struct{}
	stragglers int

	outage outage
}

// outage is the current streak of broker-wide failures, read by Outage from
// any goroutine.
type outage struct {
	mu    sync.Mutex
	since time.Time
	cause error
}

type stats struct {
	writes, messages, bytes, retries, brokerErrors, failures, producerResets atomic.Int64
}

// Stats counts what a Kafka has done since New.
type Stats struct {
	Writes       int64 // WriteMessages calls (produce rounds) made
	Messages     int64 // messages acknowledged
	Bytes        int64 // key and value bytes acknowledged
	Retries      int64 // rounds retried after a broker-wide failure
	BrokerErrors int64 // broker-wide failures seen
	Failures     int64 // messages reported in a WriteError
	// ProducerResets counts new producer ids taken after the first: after
	// a batch whose outcome stayed unknown, or a broker's answer that it
	// lost track of the producer (idempotence.go).
	ProducerResets int64
}

// A Failure is one message that failed on its own.
type Failure struct {
	Index int // into the msgs passed to Write
	Err   error
}

// WriteError lists the messages of a Write that failed on their own, by
// ascending Index. Every message not listed was acknowledged.
type WriteError struct {
	Failures []Failure
}

func (e *WriteError) Error() string {
	if len(e.Failures) == 1 {
		return fmt.Sprintf("write message %d: %v", e.Failures[0].Index, e.Failures[0].Err)
	}
	return fmt.Sprintf("write: %d messages failed, first message %d: %v", len(e.Failures), e.Failures[0].Index, e.Failures[0].Err)
}

// Unwrap exposes every failure's error to errors.Is and errors.As.
func (e *WriteError) Unwrap() []error {
	errs := make([]error, len(e.Failures))
	for i, f := range e.Failures {
		errs[i] = f.Err
	}
	return errs
}

// Permanent reports whether err, a Failure's error, will fail the same way
// when the message is written again: too large, invalid or colliding topic
// name, not authorized to write, corrupt or invalid record. A per-message
// failure that may pass later, such as a missing topic (one an operator may
// create, or Kafka did not create in time, or the relay may not create), is
// not permanent. A *TopicError says itself.
func Permanent(err error) bool {
	var te *TopicError
	if errors.As(err, &te) {
		return te.Permanent
	}
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return true
	}
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr {
	case kafka.MessageSizeTooLarge,
		kafka.InvalidTopic,
		kafka.TopicAuthorizationFailed,
		kafka.InvalidMessage, // CORRUPT_MESSAGE
		kafka.InvalidRecord,
		kafka.InvalidMessageSize,
		kafka.RecordListTooLarge,
		kafka.InvalidTimestamp,
		kafka.UnsupportedForMessageFormat,
		kafka.PolicyViolation:
		return true
	}
	return false
}

// perMessage reports whether err belongs to the messages it was returned for,
// rather than to the broker as a whole. An unknown topic always belongs to its
// topic: with auto-creation on it is also what Kafka answers for a name that
// collides with an existing topic, forever (see topic.go), so it is never
// waited for like an outage; topicFailure waits a bounded time for a topic
// that is being created.
func perMessage(err error) bool {
	return Permanent(err) || errors.Is(err, kafka.UnknownTopicOrPartition)
}

// topicLevel reports whether err holds for every message of a topic, so that
// splitting a batch of one topic cannot isolate a culprit.
func topicLevel(err error) bool {
	return errors.Is(err, kafka.UnknownTopicOrPartition) ||
		errors.Is(err, kafka.InvalidTopic) ||
		errors.Is(err, kafka.TopicAuthorizationFailed)
}

// New validates cfg and builds the Writer and its Transport. It neither dials
// nor starts goroutines; the first Write or Ping connects.
func New(cfg Config) (*Kafka, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka sink config: %w", err)
	}
	compression := cfg.compression()
	mech, _ := cfg.mechanism()
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, fmt.Errorf("kafka sink config: %w", err)
	}
	transport := &kafka.Transport{
		ClientID: cfg.ClientID,
		TLS:      tc,
		SASL:     mech,
		// kafka-go caches topic metadata for 6s by default: a topic an
		// operator just created would still be "unknown" to a retry for that
		// long. One metadata request a second is cheap.
		MetadataTTL: time.Second,
		Dial:        cfg.Dial,
	}
	return &Kafka{cfg: cfg, addr: kafka.TCP(cfg.Brokers...), transport: transport,
		compression: compression, log: cfg.Logger,
		prod: producer{id: -1, seqs: make(map[topicPartition]*sequence)}}, nil
}

// Write produces each event as a record (topic, key, value, headers) and
// blocks until every one is acknowledged by Kafka with acks=all, or has
// failed for a reason of its own. Broker-wide failures (unreachable, not
// enough replicas, leader not available, timeouts) are retried with backoff
// until ctx is done: the caller must hold its LSN meanwhile, nothing is
// dropped. It returns nil, ctx's error, or a *WriteError listing, by index in
// events, the events that failed on their own; every event not listed was
// acknowledged. Not safe for concurrent use (one writer keeps per-partition
// order).
//
// Every event must have its Topic set. events is not modified, and its bytes
// must not be modified until Write returns.
func (k *Kafka) Write(ctx context.Context, events []event.Event) error {
	msgs := k.records(events)
	defer k.release()
	st := &writeState{msgs: msgs}
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
	for i := range msgs {
		if msgs[i].Topic == "" {
			// A caller's bug; kafka-go would refuse the whole call for it.
			st.fail(i, fmt.Errorf("message has no topic: %w", kafka.InvalidTopic))
			continue
		}
		if st.held(i) {
			st.fail(i, ErrBehind)
			continue
		}
		if err := checkTopicName(msgs[i].Topic); err != nil {
			// With auto-creation off kafka-go would call it unknown, and the
			// broker would never say it is invalid.
			st.fail(i, err)
			continue
		}
		n := messageSize(&msgs[i])
		if n > k.cfg.BatchBytes {
			st.fail(i, fmt.Errorf("message of %d bytes is larger than the %d-byte batch limit (sink batch bytes): %w", n, k.cfg.BatchBytes, kafka.MessageSizeTooLarge))
			continue
		}
		if len(idx) == k.cfg.BatchSize || chunkBytes+n > k.cfg.BatchBytes {
			if err := flush(); err != nil {
				return err
			}
		}
		idx = append(idx, i)
		chunkBytes += n
	}
	if err := flush(); err != nil {
		return err
	}
	if len(st.fails) == 0 {
		return nil
	}
	k.stats.failures.Add(int64(len(st.fails)))
	slices.SortFunc(st.fails, func(a, b Failure) int { return a.Index - b.Index })
	return &WriteError{Failures: st.fails}
}

// ErrBehind is the error of a message that was not written because an
// earlier message with the same topic and key failed in the same Write:
// written, it would overtake that message. It fails with it, in order.
var ErrBehind = errors.New("not written: an earlier message with the same topic and key failed")

// writeState is one Write's messages and failures so far.
type writeState struct {
	msgs   []kafka.Message
	fails  []Failure
	failed map[event.Lane]int   // lane of every failed message → its lowest index
	since  map[string]time.Time // topics waited for (being created) → since when
}

func orderKey(m *kafka.Message) event.Lane { return event.Lane{Topic: m.Topic, Key: string(m.Key)} }

// records turns events into kafka-go records, sharing the events' bytes, in
// buffers reused from Write to Write (release).
func (k *Kafka) records(events []event.Event) []kafka.Message {
	n := 0
	for i := range events {
		n += len(events[i].Headers)
	}
	if cap(k.msgBuf) < len(events) {
		k.msgBuf = make([]kafka.Message, len(events))
	}
	if cap(k.hdrBuf) < n {
		k.hdrBuf = make([]kafka.Header, n)
	}
	msgs, hs := k.msgBuf[:len(events)], k.hdrBuf[:n]
	for i := range events {
		e := &events[i]
		h := hs[:len(e.Headers):len(e.Headers)]
		hs = hs[len(e.Headers):]
		for j, x := range e.Headers {
			h[j] = kafka.Header(x)
		}
		msgs[i] = kafka.Message{Topic: e.Topic, Key: e.Key, Value: e.Value, Headers: h, Time: e.Time}
	}
	k.msgBuf, k.hdrBuf = msgs, k.hdrBuf[:n]
	return msgs
}

// release readies the record buffers for the next Write: cleared, so that
// they pin no rows, or dropped when a produce request of this Write may
// still read them (it failed or was abandoned: kafka-go's connection can
// outlive the call).
func (k *Kafka) release() {
	if k.abandoned {
		k.msgBuf, k.hdrBuf, k.abandoned = nil, nil, false
		return
	}
	clear(k.msgBuf)
	clear(k.hdrBuf)
}

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
// on its own, appending those to fails. It returns only nil or ctx's error.
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

		var werrs kafka.WriteErrors
		if !errors.As(err, &werrs) || len(werrs) != len(batch) {
			// The whole call was refused before anything was produced:
			// metadata for a topic, or the connection.
			switch {
			case !perMessage(err):
				// Broker-wide: retry the same call below.
			case !oneTopic(batch):
				// kafka-go does not say which topic failed: write each topic
				// on its own. Topics are independent for ordering.
				for _, group := range byTopic(msgs, idx) {
					if err := k.write(ctx, st, group); err != nil {
						return err
					}
				}
				return nil
			case topicLevel(err):
				ferr, wait := k.topicFailure(ctx, st, msgs[idx[0]].Topic, err)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if wait {
					if err := sleep(ctx, topicPoll); err != nil {
						return err
					}
					continue
				}
				for _, i := range idx {
					if st.held(i) {
						st.fail(i, ErrBehind)
					} else {
						st.fail(i, ferr)
					}
				}
				return nil
			case len(idx) == 1:
				st.fail(idx[0], err)
				return nil
			default:
				// Not expected (sizes are checked up front), but a
				// record-level refusal of the whole call is narrowed down
				// like one of a batch.
				half := len(idx) / 2
				if err := k.write(ctx, st, idx[:half]); err != nil {
					return err
				}
				return k.write(ctx, st, idx[half:])
			}
			if err := k.backoff(ctx, attempt, err); err != nil {
				return err
			}
			attempt++
			continue
		}

		// Per partition: each partition's batch succeeded or failed whole.
		k.acked(batch, werrs)
		var retry, isolate []int
		var retryErr error
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
						return ctx.Err()
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
				return err
			}
			if err := k.write(ctx, st, isolate[half:]); err != nil {
				return err
			}
		}
		if len(retry) == 0 {
			return nil
		}
		// Only the failed partitions' messages go again, before anything
		// that follows them in the input.
		if retryErr != nil {
			if err := k.backoff(ctx, attempt, retryErr); err != nil {
				return err
			}
			attempt++
		} else if err := sleep(ctx, topicPoll); err != nil {
			// Only topics being created: not an outage.
			return err
		}
		idx = retry
	}
}

// backoff counts a broker-wide failure, records it as (part of) an outage,
// and waits before the next attempt.
func (k *Kafka) backoff(ctx context.Context, attempt int, cause error) error {
	k.stats.brokerErrors.Add(1)
	k.stats.retries.Add(1)
	k.outage.mu.Lock()
	if k.outage.since.IsZero() {
		k.outage.since = time.Now()
	}
	k.outage.cause = cause
	k.outage.mu.Unlock()
	// Jittered: relays restarted together do not hammer a recovering
	// cluster in step.
	d := backoff.Delay(k.cfg.RetryMin, k.cfg.RetryMax, attempt)
	// The first failure and then every tenth: an outage is visible without a
	// line per retry.
	if attempt%10 == 0 {
		k.log.Warn("kafka unavailable, retrying", "attempt", attempt+1, "backoff", d, "err", cause)
	}
	return sleep(ctx, d)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Outage reports the broker-wide failure streak Write is in: since when, and
// the latest broker-wide error; since is zero when there is none. A streak
// starts at the first broker-wide failure (unreachable, timeout, leader not
// available, not enough replicas, …) and ends at the next acknowledged
// message; per-message failures (a topic's trouble, a too-large message)
// neither start nor end one. Safe for concurrent use; meant for readiness checks and
// metrics while Write blocks.
func (k *Kafka) Outage() (since time.Time, cause error) {
	k.outage.mu.Lock()
	defer k.outage.mu.Unlock()
	return k.outage.since, k.outage.cause
}

func (k *Kafka) acked(batch []kafka.Message, werrs kafka.WriteErrors) {
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
		k.outage.mu.Lock()
		k.outage.since, k.outage.cause = time.Time{}, nil
		k.outage.mu.Unlock()
	}
}

// gather returns the messages at idx, without copying when idx is one
// contiguous run (the common case).
func gather(msgs []kafka.Message, idx []int) []kafka.Message {
	if idx[len(idx)-1]-idx[0] == len(idx)-1 {
		return msgs[idx[0] : idx[0]+len(idx)]
	}
	out := make([]kafka.Message, len(idx))
	for j, i := range idx {
		out[j] = msgs[i]
	}
	return out
}

func oneTopic(batch []kafka.Message) bool {
	for i := range batch {
		if batch[i].Topic != batch[0].Topic {
			return false
		}
	}
	return true
}

// byTopic groups idx by topic, in order of first appearance, keeping input
// order within each group.
func byTopic(msgs []kafka.Message, idx []int) [][]int {
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

// messageSize is a message's size as kafka-go's Writer counts it against
// BatchBytes (kafka.Message.totalSize, unexported): the v0/v1 message format's
// fixed overhead, key and value, and the headers as varint-prefixed strings.
func messageSize(m *kafka.Message) int64 {
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

// Ping asks a broker for metadata over a connection of its own, opened with
// the configured TLS and SASL and closed before it returns, so that the answer
// is fresh: the Writer's Transport answers metadata from its cache, which
// outlives an outage. It returns nil once any bootstrap broker answers, or an
// error when none does before ctx is done (or within WriteTimeout when ctx has
// no deadline). For readiness checks and `check`; safe for concurrent use.
func (k *Kafka) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	t := &kafka.Transport{
		ClientID: k.transport.ClientID,
		TLS:      k.transport.TLS,
		SASL:     k.transport.SASL,
		Dial:     k.transport.Dial,
		// Brokers only: the answer's size does not grow with the cluster's
		// topics. The request is the pool's first discovery, sent now.
		MetadataTopics: []string{},
		MetadataTTL:    time.Hour,
	}
	defer t.CloseIdleConnections()
	c := &kafka.Client{Addr: k.addr, Transport: t}
	start := time.Now()
	if _, err := c.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{}}); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within %s: %w", time.Since(start).Round(time.Millisecond), err)
		}
		return fmt.Errorf("ping kafka %s: %w", strings.Join(k.cfg.Brokers, ","), err)
	}
	return nil
}

// Stats returns the counters since New. Safe for concurrent use.
func (k *Kafka) Stats() Stats {
	return Stats{
		Writes:       k.stats.writes.Load(),
		Messages:     k.stats.messages.Load(),
		Bytes:        k.stats.bytes.Load(),
		Retries:      k.stats.retries.Load(),
		BrokerErrors: k.stats.brokerErrors.Load(),
		Failures:     k.stats.failures.Load(),

		ProducerResets: k.stats.producerResets.Load(),
	}
}

// Close waits for produce requests in flight (after a cancelled Write; each
// ends within WriteTimeout) and closes the connections.
func (k *Kafka) Close() error {
	k.inflight.Wait()
	k.transport.CloseIdleConnections()
	return nil
}

// Reason says in plain words why Kafka refused e with err, a Failure's error,
// and what fixes it: the last_error of a retry-table row.
func Reason(err error, e *event.Event) string {
	// Each case appends err: for a *TopicError its text holds Kafka's own
	// words (a collision's, a policy's).
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.As(err, &tooLarge), errors.Is(err, kafka.MessageSizeTooLarge), errors.Is(err, kafka.RecordListTooLarge):
		return fmt.Sprintf("the message (%d bytes) is larger than Kafka accepts for topic %q: raise the topic's max.message.bytes (and kafka.batch_bytes) and requeue it, or drop it (%v)",
			len(e.Key)+len(e.Value), e.Topic, err)
	case errors.Is(err, kafka.UnknownTopicOrPartition):
		return fmt.Sprintf("topic %q does not exist and the relay does not create topics: create it (or set kafka.allow_auto_topic_creation); retried with backoff (%v)",
			e.Topic, err)
	case errors.Is(err, kafka.TopicAuthorizationFailed):
		return fmt.Sprintf("the relay's Kafka user may not write to topic %q: grant it and requeue (%v)", e.Topic, err)
	case errors.Is(err, kafka.InvalidTopic):
		return fmt.Sprintf("%q is not a valid topic name: fix the topic config and requeue (%v)", e.Topic, err)
	}
	return fmt.Sprintf("Kafka refused the message for topic %q: %v", e.Topic, err)
}
