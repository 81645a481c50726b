package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// This file is the sink's producer: franz-go's kgo, as the transport of
// write.go's rounds (a transactional sink's transactions are kgo's:
// franztxn.go). It replaced the sink's own producer on kafka-go's protocol
// package (issue 36).
//
// Why a round keeps its contract on kgo:
//
//   - All-or-nothing per partition, in input order. The client flushes by
//     hand (ManualFlushing): a round's records are all buffered before
//     Flush sends them, and the next round is buffered only after Flush
//     returned. kgo keeps a partition's records in order, and when the
//     broker refuses a batch it fails every record it buffers for that
//     partition (its sequence numbers are then free again). Nothing of a
//     later round can be buffered behind that failure and written ahead of
//     a record it failed: with records buffered while a flush runs, a key's
//     later record could reach the partition after kgo dropped an earlier
//     one, before the sink learned of it. This is why rounds are not
//     pipelined here (Send writes in Wait).
//   - Acknowledged means acks=all: kgo's default with idempotence, and
//     required explicitly.
//   - A broker outage is not a record's failure: kgo sends a batch again,
//     with its sequence numbers, until the broker takes it, so a round
//     blocks through an outage until the caller's context ends, and the
//     broker stores each batch once. Outage learns of it from the client's
//     hooks (a connection that cannot be made, a produce request that
//     failed unanswered) and from the round's watchdog (nothing
//     acknowledged within WriteTimeout, as for NOT_ENOUGH_REPLICAS).
//   - A topic's trouble is found before producing, by a metadata request
//     for the round's topics (a known topic is not asked again for a
//     second), so that it
//     refuses the round, and write.go splits it by topic.

// franz is the producer's state. Write's goroutine only, but for the
// client's hooks (atomics).
type franz struct {
	cl     *kgo.Client
	inTxn  bool                 // a transaction was begun and not ended
	fenced error                // why a newer producer fenced this one: every later call fails with it
	topics map[string]time.Time // topics the brokers know → when asked
	recs   []kgo.Record
	// last is closed when the last round's records all have their answer:
	// a round given up on (ctx) is waited for before the next is buffered,
	// so that nothing is buffered while it may fail.
	last   chan struct{}
	lastID atomic.Int64 // producer id and epoch of the last round, for ProducerResets
	// warned: the current outage was logged (write.go's acked clears it),
	// so that an outage is one line, not one per reconnect.
	warned atomic.Bool
}

// franzClient returns the producer's client, made at the first round
// (a transactional sink's by InitTransactions).
func (k *Kafka) franzClient() (*kgo.Client, error) {
	f := k.franz
	if f.cl == nil {
		if k.transactional() {
			return nil, errNoTransactions
		}
		cl, err := k.newFranzClient()
		if err != nil {
			return nil, err
		}
		f.cl = cl
	}
	return f.cl, nil
}

// newFranzClient returns a kgo producer as the package doc and cfg say,
// with extra options (a transactional id).
func (k *Kafka) newFranzClient(extra ...kgo.Opt) (*kgo.Client, error) {
	opts := []kgo.Opt{
		kgo.ManualFlushing(),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(0),
		kgo.ProduceRequestTimeout(k.cfg.WriteTimeout),
		// No record timeout: kgo measures it from the record's timestamp,
		// which is the event's (its commit time, or the outbox's timestamp
		// column), so a backlog's records would all time out at once. An
		// outage blocks the round instead, as the package doc promises, and
		// the hooks keep Outage.
		// No record retry limit either: a record kgo fails after retries
		// would be written again by write.go as a new record, under a new
		// sequence (kgo bumps the epoch when it gives up a batch it sent),
		// and stored twice when the first was appended after all (seen on
		// Kafka 4.4 after a kill -9). kgo retries a partition's retriable
		// error (NOT_ENOUGH_REPLICAS, a leader moving, a connection
		// refused) with the same sequence numbers until the broker takes
		// the batch; the round's watchdog keeps Outage meanwhile.
		kgo.RetryBackoffFn(func(tries int) time.Duration {
			return backoff.Delay(produceBackoffMin, produceBackoffMax, tries-1)
		}),
		kgo.ProducerBatchMaxBytes(int32(min(k.cfg.BatchBytes+batchSlack, 1<<30))),
		// A round is at most BatchSize records; what a cancelled round
		// left behind settles before the next is flushed.
		kgo.MaxBufferedRecords(4 * k.cfg.BatchSize),
		kgo.WithHooks(franzHooks{k}),
		// kgo compresses with snappy unless told; Compression's default is none.
		kgo.ProducerBatchCompression(franzCodec(k.cfg.Compression)),
	}
	if k.cfg.DisableIdempotence {
		// Stop-and-wait: a resent request could land after a later one.
		opts = append(opts, kgo.DisableIdempotentWrite(), kgo.MaxProduceRequestsInflightPerBroker(1))
	}
	// With idempotence kgo keeps up to five requests in flight per broker,
	// the most a broker deduplicates (MaxInFlight is the caller's depth).
	if k.cfg.AllowAutoTopicCreation {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	return kafkaclient.New(&k.cfg, append(opts, extra...)...)
}

// produceBackoffMin and produceBackoffMax bound kgo's backoff between a
// partition's attempts (kafka-go Writer's, which the sink always had).
const (
	produceBackoffMin = 100 * time.Millisecond
	produceBackoffMax = time.Second
)

// batchSlack is added to BatchBytes for kgo's batch limit: write.go counts
// a record as kafka-go did (messageSize), kgo adds the batch header and the
// record's varints, and a round of BatchBytes must fit one batch.
const batchSlack = 4 << 10

func franzCodec(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

// produce writes a round (see the top of the file) and returns nil, ctx's
// error, an error that refused the whole round before anything was produced
// (a topic's metadata, no producer), an error that ends the transaction
// (txnFatal), or writeErrors with one entry per message of batch (nil for
// those acknowledged).
func (k *Kafka) produce(ctx context.Context, batch []event.Event) error {
	if len(batch) == 0 {
		return nil
	}
	cl, err := k.franzClient()
	if err != nil {
		return err
	}
	f := k.franz
	if f.last != nil {
		select {
		case <-f.last:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := k.franzTopics(ctx, cl, batch); err != nil {
		return err
	}
	if err := k.franzBegin(cl); err != nil {
		return err
	}
	if err := k.franzFirstID(ctx, cl); err != nil {
		return err
	}
	recs, errs, done := k.franzBuffer(cl, batch)
	if err := k.franzWait(ctx, len(batch), done); err != nil {
		return err
	}
	clear(recs)
	if k.transactional() {
		if err := k.franzTxnFailure(errs); err != nil {
			return err
		}
	} else {
		k.franzProducerID(cl)
	}
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

// franzBuffer hands the round's records to kgo, which holds them until
// the flush, and returns the slots their answers land in and a channel
// closed once every record has its answer.
func (k *Kafka) franzBuffer(cl *kgo.Client, batch []event.Event) ([]kgo.Record, writeErrors, chan struct{}) {
	f := k.franz
	if cap(f.recs) < len(batch) {
		f.recs = make([]kgo.Record, len(batch))
	}
	recs := f.recs[:len(batch)]
	errs := make(writeErrors, len(batch))
	// One allocation for the round's headers, not one per record.
	nh := 0
	for i := range batch {
		nh += len(batch[i].Headers)
	}
	hdrs := make([]kgo.RecordHeader, nh)
	var wg sync.WaitGroup
	wg.Add(len(batch))
	for i := range batch {
		m := &batch[i]
		r := &recs[i]
		*r = kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Timestamp: m.Time}
		if n := len(m.Headers); n > 0 {
			r.Headers, hdrs = hdrs[:n:n], hdrs[n:]
			for j, h := range m.Headers {
				r.Headers[j] = kgo.RecordHeader(h)
			}
		}
		// Not ctx: a record cancelled by its context fails the records
		// buffered with it for its partition, a later round's too.
		cl.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
			errs[i] = err
			wg.Done()
		})
	}
	done := make(chan struct{})
	f.last = done
	go func() {
		// Flush returns once every buffered record has its answer; its own
		// context only ends the wait, never the records.
		_ = cl.Flush(context.Background())
		wg.Wait()
		close(done)
	}()
	return recs, errs, done
}

// franzWait waits for the round to settle. The watchdog: a round Kafka
// has not acknowledged within WriteTimeout is an outage (kgo retries
// inside, and no hook reports a partition's retriable error), which the
// next acknowledged record ends.
func (k *Kafka) franzWait(ctx context.Context, n int, done <-chan struct{}) error {
	watchdog := time.NewTimer(k.cfg.WriteTimeout)
	defer watchdog.Stop()
	for {
		select {
		case <-done:
			return nil
		case <-watchdog.C:
			cause := fmt.Errorf("kafka has not acknowledged %d records within %s: retrying", n, k.cfg.WriteTimeout)
			k.retrying(cause)
			k.log.Warn("kafka unavailable, retrying", "err", cause)
			watchdog.Reset(k.cfg.WriteTimeout)
		case <-ctx.Done():
			// The round settles on its own, and the next waits for it;
			// kgo keeps its records until then.
			k.franz.recs = nil
			return ctx.Err()
		}
	}
}

// franzTopics asks the brokers about the round's topics not asked about in
// the last second, and returns the first topic's error: an unknown topic
// (created here when auto-creation is on), an invalid one, one the relay
// may not describe.
func (k *Kafka) franzTopics(ctx context.Context, cl *kgo.Client, batch []event.Event) error {
	f := k.franz
	if f.topics == nil {
		f.topics = make(map[string]time.Time)
	}
	now := time.Now()
	var ask []string
	for i := range batch {
		t := batch[i].Topic
		if at, ok := f.topics[t]; ok && now.Sub(at) < time.Second {
			continue
		}
		if !slices.Contains(ask, t) {
			ask = append(ask, t)
		}
	}
	if len(ask) == 0 {
		return nil
	}
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = k.cfg.AllowAutoTopicCreation
	for _, t := range ask {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	rctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	resp, err := req.RequestWith(rctx, cl)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	for _, t := range resp.Topics {
		name := ""
		if t.Topic != nil {
			name = *t.Topic
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return err
		}
		if len(t.Partitions) == 0 {
			return kerr.UnknownTopicOrPartition
		}
		for _, p := range t.Partitions {
			if p.Leader < 0 {
				return kerr.LeaderNotAvailable
			}
		}
		f.topics[name] = now
	}
	return nil
}

// franzFirstID takes the idempotent producer's id before the first round,
// as the Java producer does at its first send, and says it: a principal
// without IdempotentWrite is told so (ErrIdempotenceNotAllowed), and an
// unreachable broker is a broker-wide failure of the round.
func (k *Kafka) franzFirstID(ctx context.Context, cl *kgo.Client) error {
	f := k.franz
	if f.lastID.Load() != 0 || k.cfg.DisableIdempotence || k.transactional() {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	id, epoch, err := cl.ProducerID(rctx)
	if err != nil {
		if errors.Is(err, kerr.ClusterAuthorizationFailed) {
			return fmt.Errorf("init producer id: %w: %w", ErrIdempotenceNotAllowed, err)
		}
		return fmt.Errorf("init producer id: %w", err)
	}
	f.lastID.Store(producerKey(id, epoch))
	k.log.Info("kafka idempotent producer", "producer_id", id, "epoch", epoch)
	return nil
}

// producerKey is a producer id and epoch as one comparable value (never 0
// for a taken id).
func producerKey(id int64, epoch int16) int64 { return id<<16 | int64(uint16(epoch)) }

// franzProducerID counts a new producer id or epoch after the first as a
// producer reset (Stats.ProducerResets).
func (k *Kafka) franzProducerID(cl *kgo.Client) {
	if k.cfg.DisableIdempotence {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil || id < 0 {
		return
	}
	cur := producerKey(id, epoch)
	if prev := k.franz.lastID.Swap(cur); prev != 0 && prev != cur {
		k.stats.producerResets.Add(1)
		if k.obs != nil {
			k.obs.ProducerReset()
		}
	}
}

// closeFranz flushes what a cancelled round left (within WriteTimeout) and
// closes the client.
func (k *Kafka) closeFranz() {
	if k.franz == nil || k.franz.cl == nil {
		return
	}
	defer func() { k.franz.cl = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), k.cfg.WriteTimeout)
	defer cancel()
	_ = k.franz.cl.Flush(ctx)
	k.franz.cl.Close()
}

// franzHooks feeds the Observer (produce requests per broker) and Outage
// (connections that fail) from kgo's hooks.
type franzHooks struct{ k *Kafka }

var (
	_ kgo.HookBrokerWrite   = franzHooks{}
	_ kgo.HookBrokerE2E     = franzHooks{}
	_ kgo.HookBrokerConnect = franzHooks{}
)

func brokerAddr(m kgo.BrokerMetadata) string {
	return net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port)))
}

// OnBrokerWrite: a produce request is in flight once written.
func (h franzHooks) OnBrokerWrite(m kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == 0 && err == nil && h.k.obs != nil {
		h.k.obs.ProduceInFlight(brokerAddr(m), 1)
	}
}

// OnBrokerE2E: a produce request was answered, or failed unanswered
// (kgo sends it again: a broker-wide failure).
func (h franzHooks) OnBrokerE2E(m kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if key != 0 {
		return
	}
	addr := brokerAddr(m)
	if err := e2e.Err(); err != nil {
		h.failed(fmt.Errorf("produce to kafka broker %s: %w", addr, err))
	}
	if e2e.WriteErr != nil || h.k.obs == nil {
		return
	}
	h.k.obs.ProduceInFlight(addr, -1)
	h.k.obs.ProduceAnswered(addr, e2e.TimeToRead+e2e.ReadWait, e2e.ReadErr != nil)
}

// OnBrokerConnect: a broker that cannot be reached is a broker-wide
// failure.
func (h franzHooks) OnBrokerConnect(m kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err != nil {
		h.failed(fmt.Errorf("connect to kafka broker %s: %w", brokerAddr(m), err))
	}
}

// failed records a broker-wide failure: it starts (or continues) an
// outage, which the next acknowledged record ends (write.go's acked).
func (h franzHooks) failed(cause error) {
	k := h.k
	k.stats.brokerErrors.Add(1)
	k.outageStarts(cause)
	if k.log.Enabled(context.Background(), slog.LevelWarn) && k.franz.warned.CompareAndSwap(false, true) {
		k.log.Warn("kafka unavailable, retrying", "err", cause)
	}
}
