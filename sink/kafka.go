// Package sink writes messages to Kafka and reports, per message, which
// ones Kafka acknowledged. It knows nothing of Postgres.
//
// Its producer is franz-go's kgo (franz.go, franztxn.go): a round's
// records are produced through a kgo client and flushed one round at a
// time. The sink's own producer on kafka-go's protocol package (produce.go,
// pipeline.go, conn.go, recordbatch.go, idempotence.go, txn.go's requests),
// which the points below on sequence numbers and pipelined rounds
// describe, is selected by RELAY_PRODUCER=own while it is in the tree (issue
// 36). Both keep the same contract.
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
//     need kafka-go's error codes (failure.go).
//   - A topic's trouble is never taken for a broker outage and never holds up
//     other topics: an invalid name, a name that collides with an existing
//     topic, a missing topic, a topic the relay may not write or create. Its
//     messages fail with a *TopicError saying what is wrong, in Kafka's words
//     when Kafka gives them. A topic Kafka may be creating is waited for at
//     most TopicWait per Write; then its messages fail, not permanently.
//   - Ping sends a metadata request, never answered from a cache (admin.go):
//     it fails while no broker answers.
//   - Per-key order is input order, for every message that is acknowledged.
//     Keys map to partitions with kafka.Murmur2Balancer, the Java client's
//     partitioner (so Debezium's and ours agree).
//   - A sequence number is never used for other records (idempotence.go).
//     The producer is idempotent unless DisableIdempotence: each batch
//     carries a producer id, epoch and per-partition base sequence, taken
//     in order as batches are sent and kept by a batch until the broker
//     acknowledged it (or refused it with nothing after it that may have
//     been appended: then they are free again). A batch whose
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
// Why per-key order holds: Write caps each produce round at BatchSize
// messages and BatchBytes bytes (counted as kafka-go counts them), and a
// round sends one record batch per partition with that partition's messages
// in input order (produce.go), so a round succeeds or fails all-or-nothing
// per partition, and the messages of failed partitions are written again
// before the next round starts. Several rounds may be in flight at once
// (Send, pipeline.go, up to MaxInFlight requests per broker connection) only
// with idempotence, whose sequence numbers keep a partition's batches in
// order at the broker, and only while nothing fails: a failure drains the
// pipe and the rest is written one round at a time, as above. A message larger
// than BatchBytes would make Kafka refuse its whole partition's request, and
// an unknown topic fails the whole round at the metadata step: Write checks
// sizes and topic names up front, and on a topic-level error splits the round
// by topic, so only the culprits fail (see topic.go for what Kafka answers for
// each kind of topic trouble). When the broker answers MESSAGE_TOO_LARGE (or
// another record-level error) for a batch of several
// messages, Write writes that batch again in halves until it has the culprits.
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
// from the retry table) nor of batches still unknown when a new producer id
// is taken; those are new writes. Without idempotence a produce whose
// acknowledgement was lost is stored twice. Consumers deduplicate by the
// event id header. When Write returns the context's error, messages already
// sent may still be written afterwards; the caller should treat them as not
// acknowledged (with idempotence the next Write waits for those requests
// first, as they settle their partitions' sequence numbers).
//
// Write, Send, a Delivery's Wait and Abandon are not safe for concurrent use:
// one caller at a time keeps the per-partition order described above. Ping, Outage and Stats may be called
// from any goroutine, also while Write blocks.
package sink

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A Kafka writes messages to Kafka. See the package doc for its guarantees.
type Kafka struct {
	cfg         Config
	addr        net.Addr
	tls         *tls.Config
	mech        sasl.Mechanism
	compression kafka.Compression
	log         *slog.Logger
	stats       stats
	obs         Observer // nil: none (SetObserver)

	// transport serves metadata (for the sink's own topics only: see
	// metadataFor), producer ids and topic diagnostics; produce requests
	// go on the sink's own pipelined connections (conn.go).
	transport atomic.Pointer[kafka.Transport]
	connMu    sync.Mutex // guards conns, for Close
	conns     map[int32]*brokerConn

	// Write's (or Send's and Wait's) goroutine only: see produce.go,
	// pipeline.go and topic.go.
	balancer   kafka.Murmur2Balancer
	groupOf    map[topicPartition]int
	groups     []*partitionBatch
	spare      []*partitionBatch // partition batches whose buffers may be reused
	spareBytes int64             // their buffers' capacity
	topicParts []topicCount
	parts      []int
	brokers    map[int32]string // broker id → host:port, from metadata
	retired    []*brokerConn    // connections to a broker's former address
	topics     map[string]bool  // the topics metadata is fetched for
	missing    map[string]missing
	msgFree    []recordBufs // record buffers for the next calls (write.go)
	prod       producer
	// stragglers are produce requests a cancelled call left in flight: the
	// next call records their outcome first.
	stragglers []*flight
	pipe       pipe     // Sends not yet waited for (pipeline.go)
	txn        txnState // with a TransactionalID (txn.go)
	franz      *franz   // the producer on kgo, when chosen (franz.go)

	adminMu sync.Mutex
	kc      *kgo.Client  // admin.go's, made at the first question
	adm     *kadm.Client // on kc

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
	writes, messages, bytes, retries, brokerErrors, failures, producerResets, pipelined atomic.Int64
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
	// Pipelined counts Sends whose requests went out while an earlier
	// Send's were still unanswered (pipeline.go).
	Pipelined int64
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
	k := &Kafka{cfg: cfg, addr: kafka.TCP(cfg.Brokers...), tls: tc, mech: mech,
		compression: compression, log: cfg.Logger,
		prod: producer{id: -1, seqs: make(map[topicPartition]*sequence)}}
	k.transport.Store(k.newTransport(nil))
	if useFranz() {
		k.franz = &franz{}
	}
	return k, nil
}

// newTransport returns a kafka-go Transport whose metadata cache holds the
// given topics (none: the brokers only).
func (k *Kafka) newTransport(topics []string) *kafka.Transport {
	if topics == nil {
		topics = []string{}
	}
	return &kafka.Transport{
		ClientID: k.cfg.ClientID,
		TLS:      k.tls,
		SASL:     k.mech,
		// kafka-go caches topic metadata for 6s by default: a topic an
		// operator just created would still be "unknown" to a retry for that
		// long. One metadata request a second is cheap, for the sink's own
		// topics: kafka-go asks for every topic of the cluster unless told
		// which (11% of the relay's CPU with a broker of thousands of
		// topics).
		MetadataTTL:    time.Second,
		MetadataTopics: topics,
		Dial:           k.cfg.Dial,
	}
}

// metadataFor returns the Transport whose metadata cache covers topic. The
// first time a topic is asked for, the Transport is replaced by one whose
// cache holds it too (kafka-go fixes a Transport's topics when it is made);
// topics are few and change rarely.
func (k *Kafka) metadataFor(topic string) *kafka.Transport {
	t := k.transport.Load()
	if k.topics[topic] {
		return t
	}
	if k.topics == nil {
		k.topics = make(map[string]bool)
	}
	k.topics[topic] = true
	names := make([]string, 0, len(k.topics))
	for name := range k.topics {
		names = append(names, name)
	}
	slices.Sort(names)
	nt := k.newTransport(names)
	k.transport.Store(nt)
	t.CloseIdleConnections()
	return nt
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
		Pipelined:      k.stats.pipelined.Load(),
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

// Close waits for produce requests in flight (after a cancelled Write; each
// ends within WriteTimeout) and closes the connections.
func (k *Kafka) Close() error {
	k.connMu.Lock()
	conns := k.conns
	k.conns = nil
	k.connMu.Unlock()
	for _, c := range conns {
		c.close()
	}
	for _, c := range k.retired {
		c.close()
	}
	k.transport.Load().CloseIdleConnections()
	k.closeFranz()
	k.closeAdmin()
	return nil
}
