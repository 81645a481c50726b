package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// The relay with delivery: exactly-once, beside the default at-least-once in
// the same invocation: a drain from a slot of its own over the same backlog
// (its own topics, template outbox.eos.{aggregate_type}), and a sustained
// phase after the at-least-once relay's, read by a read_committed consumer.
// Its commit → ack is commit → receipt by that consumer: a record is visible
// only once its transaction commits, so the broker's append time says
// nothing of when a consumer may read it.

// sinkRelayEOS names the exactly-once relay in the report.
const sinkRelayEOS = "relay-exactly-once"

// eosTopicsFor returns the topics of the exactly-once relay's drain.
func eosTopicsFor(typePrefix string) []string {
	ts := topicsFor(typePrefix)
	for i := range ts {
		ts[i] = "outbox.eos." + strings.TrimPrefix(ts[i], "outbox.event.")
	}
	return ts
}

// RelayDrain is the exactly-once relay's drain of the backlog: until its slot
// confirmed the last commit, which it does only after the Kafka commit that
// covers it.
type RelayDrain struct {
	Sec     float64 `json:"seconds"`
	CPUSec  float64 `json:"cpu_seconds"`
	PeakRSS int64   `json:"peak_rss_bytes"`
	Err     string  `json:"error,omitempty"`
}

// EOSRate is the exactly-once relay's events/s; zero when it did not finish.
func (d DrainRun) EOSRate() float64 {
	if d.EOS == nil || d.EOS.Err != "" {
		return 0
	}
	return perSec(float64(d.Events), d.EOS.Sec)
}

// eosEnv is the relay's environment with exactly-once delivery on slot, its
// checkpoints in cpTopic, and template as its topic template ("" keeps it).
func (b *bench) eosEnv(db *benchDB, slot, cpTopic, template string) []string {
	env := b.relayEnv(db)
	set := []string{"RELAY_POSTGRES_SLOT=" + slot, "RELAY_DELIVERY=exactly-once", "RELAY_KAFKA_CHECKPOINT_TOPIC=" + cpTopic}
	if template != "" {
		set = append(set, "RELAY_TOPICS_TEMPLATE="+template)
	}
	// Later entries win (os/exec keeps the last of a key).
	return append(env, set...)
}

// checkpointTopic creates the exactly-once relay's checkpoint topic of one
// workload (one partition; compaction does not matter for minutes) and
// returns it with its cleanup.
func (b *bench) checkpointTopic(ctx context.Context, client *kafka.Client, label string) (string, func(), error) {
	topic := fmt.Sprintf("b%s_%s_checkpoints", b.stamp, label)
	b.created.addTopics(topic)
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		return "", nil, fmt.Errorf("create checkpoint topic %s: %w", topic, err)
	}
	return topic, func() { b.deleteTopics(ctx, client, []string{topic}) }, nil
}

// drainRelayEOS starts the exactly-once relay on its own slot of the backlog
// and measures until the slot confirmed the last commit.
func (b *bench) drainRelayEOS(ctx context.Context, db *benchDB, lastBefore pglogrepl.LSN, prefix string, client *kafka.Client, d *DrainRun) error {
	d.EOS = &RelayDrain{}
	fail := func(err error) error { d.EOS.Err = err.Error(); return err }
	topics := eosTopicsFor(prefix)
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(err)
	}
	defer b.deleteTopics(ctx, client, topics)
	cpTopic, dropCP, err := b.checkpointTopic(ctx, client, fmt.Sprintf("r%dd%d", d.Run, d.PerTxn))
	if err != nil {
		return fail(err)
	}
	defer dropCP()
	conn, err := pgx.Connect(ctx, db.AdminDSN)
	if err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	log := filepath.Join(b.dir, fmt.Sprintf("relay-eos-drain-%d-run%d.log", d.PerTxn, d.Run))
	p, err := startProc(b.o.RelayBin, []string{"run"}, b.profiled(b.eosEnv(db, db.EOSSlot, cpTopic, "outbox.eos.{aggregate_type}"), log), log)
	if err != nil {
		return fail(fmt.Errorf("relay exactly-once: %w", err))
	}
	defer p.stop(30 * time.Second) // on the error paths
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var confirmedAt time.Time
	for confirmedAt.IsZero() {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline:
			return fail(fmt.Errorf("relay exactly-once: not drained after %s: %s", b.o.Timeout, p.logTail(5)))
		case <-tick.C:
		}
		if p.exited() {
			return fail(fmt.Errorf("relay exactly-once exited while draining: %s: %s", p.exitErr(), p.logTail(10)))
		}
		lsn, err := confirmedFlushLSN(ctx, conn, db.EOSSlot)
		if err != nil {
			return fail(err)
		}
		if lsn > lastBefore {
			confirmedAt = time.Now()
		}
	}
	rss, rssErr := p.peakRSS()
	u := p.stop(30 * time.Second)
	if rssErr != nil {
		rss = u.MaxRSS
	}
	d.EOS.Sec, d.EOS.CPUSec, d.EOS.PeakRSS = confirmedAt.Sub(p.started).Seconds(), u.CPU.Seconds(), rss
	// Its slot has served its purpose (see drainRecvlogical).
	if err := b.dropSlot(ctx, db, db.EOSSlot); err != nil {
		return fail(err)
	}
	b.log.Info("relay exactly-once drained", "run", d.Run, "per_txn", d.PerTxn, "seconds", d.EOS.Sec, "events_per_s", int(d.EOSRate()), "peak_rss_bytes", d.EOS.PeakRSS)
	return nil
}

// relayEOSSink is the exactly-once relay as a sustained sink: on the relay's
// slot after the at-least-once relay's phase (it resumes from their shared
// checkpoint), read by a read_committed consumer.
func (b *bench) relayEOSSink(db *benchDB, run int, w workload) sustainedSink {
	var dropCP func()
	log := filepath.Join(b.dir, fmt.Sprintf("relay-eos-sustained-%d%s-run%d.log", w.Per, w.tag(), run))
	return sustainedSink{
		name: sinkRelayEOS, typePrefix: fmt.Sprintf("b%sr%de%d%s_", b.stamp, run, w.Per, w.tag()), topics: topicsFor, readCommitted: true,
		stages: stagesPath(log), warmUp: b.o.RelayWarmUp,
		start: func(ctx context.Context) (runningSink, error) {
			cpTopic, drop, err := b.checkpointTopic(ctx, b.kafka(), fmt.Sprintf("r%ds%d%s", run, w.Per, w.tag()))
			if err != nil {
				return nil, err
			}
			dropCP = drop
			p, err := startProc(b.o.RelayBin, []string{"run"}, withStages(b.profiled(b.eosEnv(db, db.RelaySlot, cpTopic, ""), log), log), log)
			if err != nil {
				drop()
				return nil, fmt.Errorf("relay exactly-once: %w", err)
			}
			return relayProc{p, dropCP}, nil
		},
	}
}

// controlRecord reports whether m is a transaction marker as kafka-go's
// Reader hands them out (it does not skip control batches): a 4-byte key of
// version 0 and type 0 (abort) or 1 (commit). The producer's keys are
// aggregate ids in text, never that.
func controlRecord(m kafka.Message) bool {
	k := m.Key
	return len(k) == 4 && k[0] == 0 && k[1] == 0 && k[2] == 0 && k[3] <= 1 && len(m.Headers) == 0
}
