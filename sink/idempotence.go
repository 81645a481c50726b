package sink

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/initproducerid"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// This file is the idempotent producer (Kafka's KIP-98 without transactions):
// a producer id and epoch from InitProducerId, and per partition the sequence
// number of the next batch. The broker keeps, per producer id and partition,
// the sequence numbers of the last five batches it appended; a batch it
// already has (same producer, epoch and sequence range) is acknowledged again
// without being appended, and a batch that skips ahead is refused
// (OUT_OF_ORDER_SEQUENCE_NUMBER). A produce whose acknowledgement was lost is
// therefore sent again with the same sequence numbers and stored once.
//
// The rule that makes this safe is the package doc's: a sequence number is
// never used for other records. The broker compares sequence numbers, not
// records: a new batch sent with the sequence of a batch it already appended
// is "acknowledged" and dropped — an event lost without an error. So:
//
//   - A batch takes the partition's next sequence numbers when it is sent
//     (several batches of a partition may be in flight: pipeline.go) and
//     keeps them, with its bytes, until the broker acknowledged it (or
//     answered DUPLICATE_SEQUENCE_NUMBER: it has it).
//   - A batch whose outcome is unknown (timeout, connection lost, ctx done,
//     NOT_ENOUGH_REPLICAS_AFTER_APPEND, any answer not known to come before
//     the append) stays pending on its partition with its bytes. The next
//     batch for that partition is sent only if it has the same records, and
//     then as the pending bytes themselves: byte-identical, the same base
//     sequence. Any other batch (fewer records after a split, other records
//     after a partition count change, a later Write after the caller gave up)
//     first gets a new producer id, with every partition's sequence back at
//     0: the pending batch can no longer be taken for it.
//   - A batch the broker refused before appending it (too large, corrupt,
//     unknown topic, not authorized, not enough replicas, a sequence or
//     producer error) frees its sequence numbers for the next batch, unless
//     an earlier send of the same batch is still unknown, or a batch sent
//     after it is (in flight, or unknown): then the next batch must be that
//     one again, or take a new producer id.
//   - OUT_OF_ORDER_SEQUENCE_NUMBER for a batch sent behind others of its
//     partition says only that one of those was not appended: it is sent
//     again after them. Otherwise it, UNKNOWN_PRODUCER_ID,
//     INVALID_PRODUCER_EPOCH, PRODUCER_FENCED and INVALID_PRODUCER_ID_MAPPING
//     mean the broker's state of the producer and ours differ (it expired the
//     producer, lost its state in an unclean leader election, …): as the Java
//     producer does without transactions, get a new producer id and send
//     again. They are never a message's failure.
//
// A new producer id costs the deduplication of batches still unknown under
// the old one: those sent again under the new id are new writes, stored twice
// if the first send was in fact appended. That is at least once, as before,
// and happens only after the sink gave up on a batch, never on its own
// retries. State belongs to the goroutine that writes: encode assigns
// sequence numbers as a request is built, and land records a request's
// answer once it is in (at Wait for a pipelined Send, after the round
// otherwise, or, for requests left running when ctx ended, before the next
// call sends anything); connections only deliver answers.

// maxResets bounds the new producer ids one produce call asks for before it
// leaves the failed partitions to Write's retries with backoff: a broker that
// refuses every new producer's first batch is an outage, not a loop.
const maxResets = 3

// producer is the idempotent producer's identity and sequence numbers.
type producer struct {
	id    int64 // -1 until InitProducerId, and while a new one is needed
	epoch int16
	inits int // producer ids taken
	// timeout is the transaction timeout the transactional id was taken
	// with (InitTransactions).
	timeout time.Duration
	seqs    map[topicPartition]*sequence
}

// sequence is one partition's sequence numbers under the current producer
// id, read and written by the goroutine that calls Write (or Send and Wait):
// requests' answers are recorded there (land), never by the connection.
type sequence struct {
	next int32 // base sequence of the next new batch
	// sent holds the batches sent with sequence numbers from the first not
	// known to be acknowledged on, in sequence order: in flight (several
	// when pipelined), or failed and kept for a byte-identical resend.
	sent []*sentBatch
	// acked: a batch was acknowledged under this producer id, so the broker
	// holds the producer's state for the partition and refuses a batch
	// whose sequence does not follow the last one it appended. Only then are
	// batches pipelined: for a producer it has no state of, a broker takes
	// any sequence, so a second batch could be appended although the first
	// was refused.
	acked bool
}

// sentBatch is a batch as it was sent: its bytes (never written again, so
// that a resend is byte-identical), the uncompressed records they hold, for
// comparing a candidate resend with, and the time it was encoded with.
type sentBatch struct {
	base           int32
	batch, records []byte
	count          int
	now            time.Time
	state          sendState
	// maybe: an earlier send of the batch had an unknown outcome, so a later
	// refusal does not free its sequence numbers.
	maybe bool
	// behind: sent while earlier batches of the partition were in flight; a
	// sequence error then means only that one of those failed.
	behind bool
}

type sendState uint8

const (
	inFlight sendState = iota
	unknown            // may have been appended
	refused            // answered before it was appended: its numbers are free
	appended           // acknowledged
)

// settle drops the acknowledged batches at the front, and frees the numbers
// of refused batches when no batch after them may have been appended.
func (s *sequence) settle() {
	for len(s.sent) > 0 && s.sent[0].state == appended {
		s.sent[0] = nil
		s.sent = s.sent[1:]
	}
	if len(s.sent) == 0 {
		s.sent = nil
		return
	}
	if s.sent[0].state != refused {
		return
	}
	for _, b := range s.sent {
		if b.state == unknown || b.state == inFlight {
			return
		}
	}
	s.next = s.sent[0].base
	s.sent = nil
}

// clear reports whether new batches may be pipelined on the partition:
// acknowledged before under this producer id, and nothing failed.
func (s *sequence) clear() bool {
	if !s.acked {
		return false
	}
	for _, b := range s.sent {
		if b.state != inFlight {
			return false
		}
	}
	return true
}

// encode writes g's record batch into g.buf and, with idempotence, places it
// in its partition's sequence: a new batch takes the next numbers; a batch
// for numbers whose earlier send failed with an unknown outcome must hold
// the same records, and is then sent as those bytes; else it is not sent
// (errSequenceReused) and produce takes a new producer id.
func (k *Kafka) encode(batch []kafka.Message, g *partitionBatch) error {
	g.now = time.Now()
	g.sent = nil
	hdr := noProducer
	var prev *sentBatch
	if !k.cfg.DisableIdempotence {
		g.seq = k.sequenceOf(topicPartition{g.topic, g.partition})
		g.seq.settle()
		base := g.seq.next
		if len(g.seq.sent) > 0 && g.seq.sent[0].state != inFlight {
			prev = g.seq.sent[0]
			if prev.state != unknown {
				// Refused, with a later batch that may have been appended.
				return errSequenceReused
			}
			g.now, base = prev.now, prev.base
		}
		g.hdr = batchHeader{producerID: k.prod.id, epoch: k.prod.epoch, baseSeq: base, transactional: k.transactional()}
		hdr = g.hdr
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
	if g.seq == nil {
		return nil
	}
	if prev != nil {
		if prev.count != len(g.idx) || !bytes.Equal(prev.records, g.records) {
			return errSequenceReused
		}
		g.buf = prev.batch
		prev.state, prev.behind = inFlight, false
		g.sent = prev
		return nil
	}
	g.sent = &sentBatch{base: g.hdr.baseSeq, batch: g.buf, records: g.records, count: len(g.idx), now: g.now, behind: len(g.seq.sent) > 0}
	g.seq.sent = append(g.seq.sent, g.sent)
	g.seq.next = nextSequence(g.hdr.baseSeq, len(g.idx))
	return nil
}

// landGroup records the outcome of g's send (err nil: acknowledged; written
// false: the request never reached the broker) in its partition's sequence
// numbers, and returns the error to report for g: a ProducerStateError when
// the broker's state of the producer and ours differ.
func (k *Kafka) landGroup(g *partitionBatch, err error, written bool) error {
	b := g.sent
	if b == nil {
		return err
	}
	switch {
	case err == nil || errors.Is(err, kafka.DuplicateSequenceNumber):
		// DUPLICATE_SEQUENCE_NUMBER: the broker has the batch.
		b.state = appended
		g.seq.acked = true
		g.seq.settle()
		return nil
	case !written || notAppended(err):
		if b.maybe {
			b.state = unknown
		} else {
			b.state = refused
		}
		g.seq.settle()
		if producerState(err) && !b.behind {
			return &ProducerStateError{Err: err}
		}
		// Behind a batch that failed, a sequence error says only that.
	default:
		b.state, b.maybe = unknown, true
	}
	return err
}

// errSequenceReused is produceOne's refusal to send a batch under a pending
// batch's sequence numbers: produce gets a new producer id and sends it again.
var errSequenceReused = errors.New("other records for the sequence numbers of a batch whose outcome is unknown")

// ProducerStateError is a broker's answer that its state of the idempotent
// producer and the sink's differ. Write handles it (a new producer id) and
// never reports it as a message's failure; it shows as an outage's cause
// only when a broker answers it to new producer ids again and again.
type ProducerStateError struct{ Err error }

func (e *ProducerStateError) Error() string {
	return fmt.Sprintf("kafka lost track of the idempotent producer (a new producer id is taken): %v", e.Err)
}

func (e *ProducerStateError) Unwrap() error { return e.Err }

// producerState reports whether err says the broker's state of the producer
// differs from ours.
func producerState(err error) bool {
	return errors.Is(err, kafka.OutOfOrderSequenceNumber) ||
		errors.Is(err, kafka.UnknownProducerId) ||
		errors.Is(err, kafka.InvalidProducerEpoch) ||
		errors.Is(err, kafka.ProducerFenced) ||
		errors.Is(err, kafka.InvalidProducerIDMapping)
}

// notAppended reports whether err is an answer the broker gives before it
// appends a batch, so that the batch took no sequence numbers. Everything
// else is unknown: a timeout or NOT_LEADER_OR_FOLLOWER may come after the
// leader appended the batch (acks=all waits for the replicas afterwards).
func notAppended(err error) bool {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return false
	}
	switch kerr {
	case kafka.MessageSizeTooLarge,
		kafka.InvalidMessage, // CORRUPT_MESSAGE
		kafka.InvalidRecord,
		kafka.InvalidMessageSize,
		kafka.RecordListTooLarge,
		kafka.InvalidTimestamp,
		kafka.UnsupportedForMessageFormat,
		kafka.InvalidTopic,
		kafka.UnknownTopicOrPartition,
		kafka.TopicAuthorizationFailed,
		kafka.ClusterAuthorizationFailed,
		kafka.InvalidRequiredAcks,
		kafka.NotEnoughReplicas, // checked before the append; AFTER_APPEND is not
		kafka.OutOfOrderSequenceNumber,
		kafka.UnknownProducerId,
		kafka.InvalidProducerEpoch,
		kafka.ProducerFenced,
		kafka.InvalidProducerIDMapping:
		return true
	}
	return false
}

// nextSequence is base advanced by n records, wrapping past MaxInt32 to 0
// as Kafka's DefaultRecordBatch.incrementSequence does.
func nextSequence(base int32, n int) int32 {
	if base > math.MaxInt32-int32(n) {
		return int32(n) - (math.MaxInt32 - base) - 1
	}
	return base + int32(n)
}

// initProducerIDRequest is InitProducerId without a transactional id, sent
// to the bootstrap connection. kafka-go's Client.InitProducerID first asks
// for the coordinator of the transactional id "" (FindCoordinator), which a
// cluster with ACLs refuses to a principal without DESCRIBE on that
// transactional id; a producer without transactions needs no coordinator:
// any broker hands out producer ids. Being a protocol.BrokerMessage routes it
// to a broker of our choice. kafka-go encodes a request by reflection, with
// the field indexes of the type registered for its API key
// (initproducerid.Request): this type has the same fields in the same order
// with the same tags (TestInitProducerIDRequestLayout).
type initProducerIDRequest struct {
	_                    struct{} `kafka:"min=v2,max=v4,tag"`
	TransactionalID      string   `kafka:"min=v0,max=v4,nullable"`
	TransactionTimeoutMs int32    `kafka:"min=v0,max=v4"`
	ProducerID           int64    `kafka:"min=v3,max=v4"`
	ProducerEpoch        int16    `kafka:"min=v3,max=v4"`
}

func (*initProducerIDRequest) ApiKey() protocol.ApiKey { return protocol.InitProducerId }

// Broker routes the request to the Transport's cluster connection (ID -1).
func (*initProducerIDRequest) Broker(protocol.Cluster) (protocol.Broker, error) {
	return protocol.Broker{ID: -1}, nil
}

var _ protocol.BrokerMessage = (*initProducerIDRequest)(nil)

// ErrIdempotenceNotAllowed is returned (wrapped) when the cluster refuses the
// relay's principal a producer id: it lacks the IdempotentWrite permission.
var ErrIdempotenceNotAllowed = errors.New("the Kafka principal may not write idempotently (CLUSTER_AUTHORIZATION_FAILED for InitProducerId): grant it IdempotentWrite on the cluster (Kafka before 3.0; from 3.0 WRITE on any topic implies it), or turn idempotence off")

// initProducer asks a broker for a new producer id and epoch and starts every
// partition's sequence at 0. On an error the producer stays without an id
// and the next produce asks again.
func (k *Kafka) initProducer(ctx context.Context, reason string) error {
	old := k.prod.id
	k.prod.id = -1
	clear(k.prod.seqs)
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	var res *initproducerid.Response
	for attempt := 0; ; attempt++ {
		m, err := k.transport.Load().RoundTrip(ctx, k.addr, &initProducerIDRequest{ProducerID: -1, ProducerEpoch: -1})
		if err != nil {
			return fmt.Errorf("init producer id: %w", err)
		}
		res = m.(*initproducerid.Response)
		if res.ErrorCode == 0 {
			break
		}
		kerr := kafka.Error(res.ErrorCode)
		if kerr == kafka.ClusterAuthorizationFailed {
			return fmt.Errorf("init producer id: %w: %w", ErrIdempotenceNotAllowed, kerr)
		}
		// COORDINATOR_LOAD_IN_PROGRESS while a broker fetches a block of
		// producer ids from the controller (after a start, for a moment):
		// asked again shortly, as the Java producer does.
		if !kerr.Temporary() || attempt == maxAttempts*2 {
			return fmt.Errorf("init producer id: %w", kerr)
		}
		if err := backoff.Sleep(ctx, backoff.Delay(produceBackoffMin, produceBackoffMax, attempt)); err != nil {
			return fmt.Errorf("init producer id: %w (then %w)", kerr, err)
		}
	}
	k.prod.id, k.prod.epoch = res.ProducerID, res.ProducerEpoch
	k.prod.inits++
	if k.prod.inits > 1 {
		k.stats.producerResets.Add(1)
		if k.obs != nil {
			k.obs.ProducerReset()
		}
		k.log.Warn("kafka idempotent producer reset: new producer id, sequences from 0",
			"reason", reason, "old_producer_id", old, "producer_id", k.prod.id, "epoch", k.prod.epoch)
	} else {
		k.log.Info("kafka idempotent producer", "producer_id", k.prod.id, "epoch", k.prod.epoch)
	}
	return nil
}

// sequenceOf returns the partition's sequence numbers, creating them at 0.
func (k *Kafka) sequenceOf(tp topicPartition) *sequence {
	s := k.prod.seqs[tp]
	if s == nil {
		s = &sequence{}
		k.prod.seqs[tp] = s
	}
	return s
}

// CheckIdempotence asks a broker for a producer id, as the first Write does,
// and returns nil when it hands one out, or an error saying why not (wrapping
// ErrIdempotenceNotAllowed when the principal lacks IdempotentWrite). It does
// not change the sink's producer. With idempotence off it returns nil at
// once. For `check`; safe for concurrent use.
func (k *Kafka) CheckIdempotence(ctx context.Context) error {
	if k.cfg.DisableIdempotence {
		return nil
	}
	probe := &Kafka{cfg: k.cfg, addr: k.addr, log: k.log, prod: producer{id: -1}}
	probe.transport.Store(k.transport.Load())
	return probe.initProducer(ctx, "check")
}
