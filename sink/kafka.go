// Package sink writes messages to Kafka and reports, per message, which
// ones Kafka acknowledged. It knows nothing of Postgres.
//
// Its producer is franz-go's kgo (franz.go, franztxn.go): a round's
// records are produced through a kgo client and flushed one round at a
// time; the rules below are the sink's own, over kgo as the transport.
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
//     would overtake it. Each Failure says whether writing it again can
//     succeed (Permanent) and why it failed (Reason), so callers never
//     need Kafka's error codes (failure.go).
//   - A topic's trouble is never taken for a broker outage and never holds up
//     other topics: an invalid name, a name that collides with an existing
//     topic, a missing topic, a topic the relay may not write or create. Its
//     messages fail with a *TopicError saying what is wrong, in Kafka's words
//     when Kafka gives them. A topic Kafka may be creating is waited for at
//     most TopicWait per Write; then its messages fail, not permanently.
//   - Ping sends a metadata request, never answered from a cache (package
//     kafkaadmin): it fails while no broker answers.
//   - Per-key order is input order, for every message that is acknowledged.
//     Keys map to partitions with the Java client's partitioner (murmur2,
//     kgo's default; kafkaadmin.KeyPartition computes the same), so
//     Debezium's and ours agree.
//   - The producer is idempotent unless DisableIdempotence: kgo gives each
//     batch a producer id, epoch and per-partition sequence, and sends a
//     batch whose outcome is unknown (timeout, connection lost) again with
//     the same numbers until the broker answers, so the broker stores it
//     once. It never gives up on such a batch for a new producer id: a
//     round whose context ended is waited for before the next is produced.
//
// Why per-key order holds: Write caps each produce round at BatchSize
// messages and BatchBytes bytes, and a round's records are all buffered
// before any is sent and flushed before the next round is buffered
// (franz.go). kgo keeps a partition's records in order, and when the broker
// refuses a batch it fails every record it buffered for that partition, so
// a round succeeds or fails in order per partition, and the messages of
// failed partitions are written again before the next round starts. A
// message larger than BatchBytes would make Kafka refuse its whole
// partition's batch, and an unknown topic fails the whole round at the
// metadata step: Write checks sizes and topic names up front, and on a
// topic-level error splits the round by topic, so only the culprits fail
// (see topic.go for what Kafka answers for each kind of topic trouble).
// When the broker answers MESSAGE_TOO_LARGE (or another record-level error)
// for a batch of several messages, Write writes that batch again in halves
// until it has the culprits.
//   - With a TransactionalID, writes go into Kafka transactions (txn.go):
//     a record Write acknowledged is visible to read_committed consumers
//     only once Commit returned nil, and never after Abort. The producer's
//     epoch, taken by InitTransactions, fences every earlier producer of
//     the id; a fenced sink (ErrFenced) never takes a new epoch by itself,
//     and a producer's trouble ends the transaction (ErrTxnAborted) instead
//     of taking a new producer id.
//
// Delivery is at least once: idempotence removes the duplicates of the
// sink's own resends, not of what the caller writes again (after a crash,
// from the retry table); those are new writes. Without idempotence a
// produce whose acknowledgement was lost is stored twice. Consumers
// deduplicate by the event id header. When Write returns the context's
// error, messages already sent may still be written afterwards; the caller
// should treat them as not acknowledged (the next Write waits for them
// first).
//
// Write, Send, a Delivery's Wait and Abandon are not safe for concurrent use:
// one caller at a time keeps the per-partition order described above.
// Ping, Outage and Stats may be called from any goroutine, also while Write
// blocks.
package sink

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// A Kafka writes messages to Kafka. See the package doc for its guarantees.
type Kafka struct {
	// The questions that are not writes (Ping, CheckAuth, topic
	// diagnostics, LastCommitted, ...), on their own client.
	*kafkaadmin.Admin

	cfg   kafkaclient.Config
	log   *slog.Logger
	stats stats
	obs   Observer // nil: none (SetObserver)

	// Write's (or Send's and Wait's) goroutine only: see write.go,
	// pipeline.go, topic.go and franz.go.
	missing map[string]missing
	pipe    pipe     // Sends not yet waited for (pipeline.go)
	txn     txnState // with a TransactionalID (txn.go)
	franz   *franz   // the producer (franz.go)
	prod    producer // the producer id, for logs and errors

	outage outage
}

// producer is what the sink knows of its producer id.
type producer struct {
	id      int64
	epoch   int16
	timeout time.Duration // the transaction timeout the id was taken with
	inits   int           // InitTransactions that succeeded
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
	Writes       int64 // produce rounds made
	Messages     int64 // messages acknowledged
	Bytes        int64 // key and value bytes acknowledged
	Retries      int64 // rounds retried after a broker-wide failure
	BrokerErrors int64 // broker-wide failures seen
	Failures     int64 // messages reported in a WriteError
	// ProducerResets counts new producer ids or epochs taken after the
	// first without transactions: kgo takes one when the broker lost track
	// of the producer.
	ProducerResets int64
}

// New validates cfg. It neither dials nor starts goroutines; the first
// Write or Ping connects.
func New(cfg kafkaclient.Config) (*Kafka, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka sink config: %w", err)
	}
	return newKafka(cfg), nil
}

func newKafka(cfg kafkaclient.Config) *Kafka {
	return &Kafka{Admin: kafkaadmin.New(cfg), cfg: cfg, log: cfg.Logger, franz: &franz{}, prod: producer{id: -1}}
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

// An Observer is told what the producer does, for metrics (the relay's
// internal/metrics implements it). Its methods are called from the
// producer's goroutines and must not block.
type Observer interface {
	// ProduceAnswered: a produce request written to broker (host:port)
	// was answered, or failed unanswered (its outcome unknown), took after
	// it was written.
	ProduceAnswered(broker string, took time.Duration, unanswered bool)
	// ProduceInFlight: the produce requests written to broker and not
	// yet answered changed by delta.
	ProduceInFlight(broker string, delta int)
	// ProduceRetried: a write retried after a broker-wide failure (Stats.Retries).
	ProduceRetried()
	// ProducerReset: a new producer id taken after the first
	// (Stats.ProducerResets).
	ProducerReset()
}

// SetObserver makes o the Observer of k's producer. Call it before the
// first Write or Send.
func (k *Kafka) SetObserver(o Observer) { k.obs = o }

// Close waits for a round a cancelled Write left in flight (within
// WriteTimeout) and closes the clients.
func (k *Kafka) Close() error {
	k.closeFranz()
	k.Admin.Close()
	return nil
}
