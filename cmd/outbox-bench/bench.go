package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// bench runs the phases of one invocation and collects them into rep.
type bench struct {
	o       options
	dir     string
	stamp   string // lower-case, unique per invocation: part of every name created
	log     *slog.Logger
	rep     *Report
	created *created
}

// debezium reports whether Debezium runs as a peer (-peers debezium).
func (b *bench) debezium() bool { return slices.Contains(b.o.Peers, "debezium") }

// cleanupTimeout bounds cleanup, which runs on a context that is not
// cancelled by Ctrl-C: the point of cleanup is to run after it.
const cleanupTimeout = 60 * time.Second

func (b *bench) kafka() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(b.o.Brokers...), Timeout: 10 * time.Second}
}

// runOnce creates a fresh database with the outbox, the publication and the
// slots, runs the phases and drops everything again.
func (b *bench) runOnce(ctx context.Context, run int) (err error) {
	db, err := b.freshDatabase(ctx, fmt.Sprintf("outbox_bench_%s_r%d", b.stamp, run))
	if err != nil {
		return err
	}
	defer b.dropDatabase(ctx, db, &err)
	if err := b.relaySetup(ctx, db, run); err != nil {
		// The bench's own DDL below still lets the pg_recvlogical half run.
		b.log.Warn("outbox-relay setup failed; creating the objects without it", "err", err)
	}
	pubs, slots := []string{db.Publication}, []string{db.RelaySlot}
	if !b.o.SkipDrain {
		slots = append(slots, db.RecvSlot)
	}
	if b.debezium() {
		// Debezium's own publication and, for the drain, its own slot, made
		// before the backlog so that it reads the same WAL as the others.
		pubs = append(pubs, db.DbzPublication)
		if !b.o.SkipDrain {
			slots = append(slots, db.DbzSlot)
		}
	}
	if err := db.ensureObjects(ctx, pubs, slots); err != nil {
		return err
	}
	if !b.o.SkipDrain {
		d := b.drain(ctx, db, run)
		b.rep.Drain = append(b.rep.Drain, d)
		if d.Err != "" {
			err = errors.Join(err, fmt.Errorf("drain: %s", d.Err))
		}
	}
	if !b.o.SkipSustained && ctx.Err() == nil {
		s := b.sustained(ctx, db, run, b.relaySink(db, run))
		b.rep.Sustained = append(b.rep.Sustained, s)
		if s.Err != "" {
			err = errors.Join(err, fmt.Errorf("sustained: %s", s.Err))
		}
	}
	if !b.o.SkipSustained && b.debezium() && ctx.Err() == nil {
		s := b.sustained(ctx, db, run, b.dbzSink(db, run))
		b.rep.DbzSustained = append(b.rep.DbzSustained, s)
		if s.Err != "" {
			err = errors.Join(err, fmt.Errorf("debezium sustained: %s", s.Err))
		}
	}
	return err
}

// relayEnv is the environment of the relay: the caller's, with the relay's
// connection settings replaced by the bench database's.
func (b *bench) relayEnv(db *benchDB) []string {
	set := map[string]string{
		"RELAY_POSTGRES_DSN":         db.DSN,
		"RELAY_KAFKA_BROKERS":        strings.Join(b.o.Brokers, ","),
		"RELAY_POSTGRES_SLOT":        db.RelaySlot,
		"RELAY_POSTGRES_PUBLICATION": db.Publication,
		"RELAY_OUTBOX_TABLE":         "public.outbox",
		"RELAY_METRICS_LISTEN":       "",
		"RELAY_LOG_FORMAT":           "json",
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; !ours {
			env = append(env, kv)
		}
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

func (b *bench) relaySetup(ctx context.Context, db *benchDB, run int) error {
	p, err := startProc(b.o.RelayBin, []string{"setup", "--create-outbox-table"}, b.relayEnv(db),
		filepath.Join(b.dir, fmt.Sprintf("relay-setup-run%d.log", run)))
	if err != nil {
		return err
	}
	u, err := p.wait(ctx, time.Minute)
	if err != nil {
		p.stop(5 * time.Second)
		return fmt.Errorf("setup: %w", err)
	}
	if u.ExitError != "" {
		return fmt.Errorf("setup: %s: %s", u.ExitError, p.logTail(5))
	}
	return nil
}

// drain inserts the backlog with both slots in place, then lets pg_recvlogical
// and the relay each read all of it. Their order alternates between runs so
// that neither always gets the warmer page cache.
func (b *bench) drain(ctx context.Context, db *benchDB, run int) (d DrainRun) {
	d = DrainRun{Run: run, RecvFirst: run%2 == 1}
	fail := func(err error) DrainRun { d.Err = err.Error(); return d }
	prefix := fmt.Sprintf("b%sr%dd_", b.stamp, run)
	topics := topicsFor(prefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(err)
	}
	defer b.deleteTopics(ctx, client, topics)

	p, err := newProducer(ctx, db.DSN, prefix, b.o.Aggregates, b.o.PayloadBytes)
	if err != nil {
		return fail(err)
	}
	defer p.close(context.WithoutCancel(ctx))
	startLSN, err := p.walLSN(ctx)
	if err != nil {
		return fail(err)
	}
	b.log.Info("inserting backlog", "run", run, "events", b.o.Events)
	t0 := time.Now()
	var lastBefore pglogrepl.LSN
	for left := b.o.Events; left > 0; {
		n := min(left, b.o.PerTxn)
		left -= n
		if left == 0 {
			lastBefore, err = p.insertLastTxn(ctx, n)
		} else {
			_, _, err = p.insertTxn(ctx, n)
		}
		if err != nil {
			return fail(err)
		}
	}
	d.InsertSec = time.Since(t0).Seconds()
	endLSN, err := p.walLSN(ctx)
	if err != nil {
		return fail(err)
	}
	d.Events = int64(b.o.Events)
	d.WALBytes = int64(endLSN - startLSN)
	if d.PayloadBytes, err = p.payloadBytes(ctx); err != nil {
		return fail(err)
	}
	b.log.Info("backlog inserted", "run", run, "seconds", d.InsertSec, "wal_bytes", d.WALBytes, "end_lsn", endLSN.String())

	recv := func() error { return b.drainRecvlogical(ctx, db, run, endLSN, &d) }
	relay := func() error { return b.drainRelay(ctx, db, run, lastBefore, topics, client, &d) }
	order := []func() error{recv, relay}
	if !d.RecvFirst {
		order = []func() error{relay, recv}
	}
	// Debezium goes last: it is the slowest by far, and the page cache is then
	// at its warmest, which favours it rather than the relay.
	if b.debezium() {
		order = append(order, func() error { return b.drainDebezium(ctx, db, run, prefix, &d) })
	}
	var errs []error
	for _, f := range order {
		if ctx.Err() != nil {
			break
		}
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	// The pg_recvlogical and Debezium slots have served their purpose: drop
	// them now rather than let them retain WAL through the sustained phase.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	for _, slot := range []string{db.RecvSlot, db.DbzSlot} {
		if err := db.dropSlot(cctx, slot); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fail(err)
	}
	if ctx.Err() != nil {
		return fail(ctx.Err())
	}
	return d
}

func (b *bench) drainRecvlogical(ctx context.Context, db *benchDB, run int, endLSN pglogrepl.LSN, d *DrainRun) error {
	args := []string{"-d", db.DSN, "--slot", db.RecvSlot, "--start", "--endpos", endLSN.String(),
		"-o", "proto_version=1", "-o", "publication_names=" + db.Publication, "-f", "/dev/null", "--no-loop"}
	p, err := startProc(b.o.RecvBin, args, os.Environ(), filepath.Join(b.dir, fmt.Sprintf("pg_recvlogical-run%d.log", run)))
	if err != nil {
		return fmt.Errorf("pg_recvlogical: %w", err)
	}
	u, err := p.wait(ctx, b.o.Timeout)
	if err != nil {
		p.stop(5 * time.Second)
		return fmt.Errorf("pg_recvlogical: %w", err)
	}
	if u.ExitError != "" {
		return fmt.Errorf("pg_recvlogical: %s: %s", u.ExitError, p.logTail(5))
	}
	d.RecvSec, d.RecvCPUSec = u.Wall.Seconds(), u.CPU.Seconds()
	b.log.Info("pg_recvlogical drained", "run", run, "seconds", d.RecvSec, "events_per_s", int(d.RecvRate()))
	return nil
}

// drainRelay starts the relay and measures until every event is in Kafka and
// the slot confirmed the last commit; then stops it with SIGTERM.
func (b *bench) drainRelay(ctx context.Context, db *benchDB, run int, lastBefore pglogrepl.LSN, topics []string, client *kafka.Client, d *DrainRun) error {
	conn, err := pgx.Connect(ctx, db.AdminDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	p, err := startProc(b.o.RelayBin, []string{"run"}, b.relayEnv(db), filepath.Join(b.dir, fmt.Sprintf("relay-drain-run%d.log", run)))
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer p.stop(30 * time.Second) // on the error paths
	var kafkaAt, confirmedAt time.Time
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; kafkaAt.IsZero() || confirmedAt.IsZero(); i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("relay: not drained after %s (kafka %v, confirmed %v): %s", b.o.Timeout, !kafkaAt.IsZero(), !confirmedAt.IsZero(), p.logTail(5))
		case <-tick.C:
		}
		if p.exited() {
			return fmt.Errorf("relay exited while draining: %s: %s", p.usage().ExitError, p.logTail(10))
		}
		if confirmedAt.IsZero() {
			lsn, err := confirmedFlushLSN(ctx, conn, db.RelaySlot)
			if err != nil {
				return err
			}
			if lsn > lastBefore {
				confirmedAt = time.Now()
			}
		}
		// Kafka every 60 ms: ListOffsets over 40 partitions is not free on
		// two cores, and the slot check bounds the resolution anyway.
		if kafkaAt.IsZero() && i%3 == 0 {
			n, err := endOffsets(ctx, client, topics)
			if err != nil {
				return err
			}
			if n >= d.Events {
				kafkaAt = time.Now()
			}
		}
	}
	rss, rssErr := p.peakRSS()
	u := p.stop(30 * time.Second)
	if rssErr != nil {
		rss = u.MaxRSS
	}
	d.RelayKafkaSec = kafkaAt.Sub(p.started).Seconds()
	d.RelayConfirmedSec = confirmedAt.Sub(p.started).Seconds()
	d.RelaySec = max(d.RelayKafkaSec, d.RelayConfirmedSec)
	d.RelayCPUSec, d.PeakRSS, d.MaxRSS = u.CPU.Seconds(), rss, u.MaxRSS
	if d.KafkaRecords, err = endOffsets(ctx, client, topics); err != nil {
		return err
	}
	if u.ExitError != "" {
		b.log.Warn("relay did not exit cleanly on SIGTERM", "run", run, "exit", u.ExitError)
	}
	b.log.Info("relay drained", "run", run, "seconds", d.RelaySec, "events_per_s", int(d.RelayRate()), "peak_rss_bytes", d.PeakRSS)
	return nil
}

// createTopics creates the topics and records them for the left-behind check.
func (b *bench) createTopics(ctx context.Context, client *kafka.Client, topics []string) error {
	b.created.addTopics(topics...)
	return createTopics(ctx, client, topics)
}

func (b *bench) deleteTopics(ctx context.Context, client *kafka.Client, topics []string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := deleteTopics(cctx, client, topics); err != nil {
		b.log.Warn("delete topics", "err", err)
	}
}

// A sustainedSink is what delivers the sustained phase's events: the relay or
// Debezium. start launches it and returns once it reads its slot, so that its
// start-up is not counted as latency.
type sustainedSink struct {
	name       string // in logs and errors
	typePrefix string // aggregate-type prefix of the phase: fresh topics per sink
	topics     func(typePrefix string) []string
	start      func(ctx context.Context) (*proc, error)
	// warmUp is run at the target rate and discarded before the timed phase:
	// a JVM's JIT compiles its hot paths in the first seconds under load.
	warmUp       time.Duration
	ack, receipt *Histogram // where the samples go
}

func (b *bench) relaySink(db *benchDB, run int) sustainedSink {
	return sustainedSink{
		name: "relay", typePrefix: fmt.Sprintf("b%sr%ds_", b.stamp, run), topics: topicsFor,
		start: func(context.Context) (*proc, error) {
			p, err := startProc(b.o.RelayBin, []string{"run"}, b.relayEnv(db), filepath.Join(b.dir, fmt.Sprintf("relay-sustained-run%d.log", run)))
			if err != nil {
				return nil, fmt.Errorf("relay: %w", err)
			}
			return p, nil
		},
		ack: b.rep.AckHist, receipt: b.rep.ReceiptHist,
	}
}

// dbzSink runs Debezium on a slot of its own, created now: the relay's phase
// came before and its rows are not Debezium's to deliver.
func (b *bench) dbzSink(db *benchDB, run int) sustainedSink {
	return sustainedSink{
		name: "debezium", typePrefix: fmt.Sprintf("b%sr%dz_", b.stamp, run), topics: dbzTopicsFor, warmUp: dbzWarmUp,
		start: func(ctx context.Context) (*proc, error) {
			if err := db.ensureObjects(ctx, []string{db.DbzPublication}, []string{db.DbzSustainedSlot}); err != nil {
				return nil, err
			}
			conn, err := pgx.Connect(ctx, db.AdminDSN)
			if err != nil {
				return nil, fmt.Errorf("connect: %w", err)
			}
			defer conn.Close(context.WithoutCancel(ctx))
			w, err := startDebezium(db, b.o.Brokers, db.DbzSustainedSlot, db.DbzPublication, b.dir, fmt.Sprintf("debezium-sustained-run%d", run))
			if err != nil {
				return nil, err
			}
			if _, err := w.waitStreaming(ctx, conn); err != nil {
				w.stop(30 * time.Second)
				return nil, err
			}
			return w.proc, nil
		},
		ack: b.rep.DbzAckHist, receipt: b.rep.DbzReceiptHist,
	}
}

// sustained inserts at a fixed rate while the sink runs and an in-process
// consumer measures each event's latency from its producer's COMMIT return.
func (b *bench) sustained(ctx context.Context, db *benchDB, run int, sink sustainedSink) (s SustainedRun) {
	s = SustainedRun{Run: run, TargetRate: b.o.Rate}
	fail := func(err error) SustainedRun { s.Err = err.Error(); return s }
	topics := sink.topics(sink.typePrefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(err)
	}
	defer b.deleteTopics(ctx, client, topics)
	p, err := newProducer(ctx, db.DSN, sink.typePrefix, b.o.Aggregates, b.o.PayloadBytes)
	if err != nil {
		return fail(err)
	}
	defer p.close(context.WithoutCancel(ctx))

	commits := &commitTimes{t: map[int64]time.Time{}}
	samples := newLatencySamples()
	cctx, stopConsumer := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return consume(cctx, b.o.Brokers, topics, commits, samples) })
	defer func() { stopConsumer(); _ = g.Wait() }()

	relay, err := sink.start(ctx)
	if err != nil {
		return fail(err)
	}
	defer relay.stop(30 * time.Second)

	// Warm up: one transaction through the sink and the consumer, so start-up
	// of the sink and of 40 partition readers is not counted as latency.
	per := b.o.SustainedPerTxn
	txn, at, err := p.insertTxn(ctx, per)
	if err != nil {
		return fail(err)
	}
	commits.set(txn, at)
	if err := waitCount(ctx, samples, int64(per), time.Minute, relay); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	if sink.warmUp > 0 {
		b.log.Info("warm-up at the target rate", "run", run, "sink", sink.name, "duration", sink.warmUp)
		n, err := b.insertAtRate(ctx, p, commits, b.o.Rate, sink.warmUp)
		if err != nil {
			return fail(err)
		}
		if err := waitCount(ctx, samples, int64(per+n), 2*time.Minute, relay); err != nil {
			return fail(fmt.Errorf("warm-up: %w", err))
		}
	}
	samples.reset()

	b.log.Info("sustained phase", "run", run, "sink", sink.name, "rate", b.o.Rate, "duration", b.o.Duration)
	cpu0, _ := relay.cpu()
	start := time.Now()
	if s.Events, err = b.insertAtRate(ctx, p, commits, b.o.Rate, b.o.Duration); err != nil {
		return fail(err)
	}
	s.AchievedRate = float64(s.Events) / time.Since(start).Seconds()
	if err := waitCount(ctx, samples, int64(s.Events), 60*time.Second, relay); err != nil {
		s.Err = err.Error()
	}
	if rss, err := relay.peakRSS(); err == nil {
		s.PeakRSS = rss
	}
	if cpu1, err := relay.cpu(); err == nil {
		s.PhaseCPUSec = (cpu1 - cpu0).Seconds()
	}
	u := relay.stop(30 * time.Second)
	s.RelayCPUSec = u.CPU.Seconds()
	stopConsumer()
	if err := g.Wait(); err != nil && s.Err == "" {
		s.Err = err.Error()
	}
	samples.resolve(commits)
	samples.mu.Lock()
	defer samples.mu.Unlock()
	s.Received, s.Duplicates, s.Unknown, s.Early = len(samples.receipt), samples.duplicates, samples.unknown, samples.early
	if samples.unknown > 0 {
		b.log.Warn("records that are not the producer's events", "run", run, "sink", sink.name, "count", samples.unknown, "examples", samples.examples)
	}
	for _, d := range samples.ack {
		sink.ack.Add(d)
	}
	for _, d := range samples.receipt {
		sink.receipt.Add(d)
	}
	s.Ack, s.Receipt = Summarize(samples.ack), Summarize(samples.receipt)
	b.log.Info("sustained done", "run", run, "sink", sink.name, "achieved_rate", int(s.AchievedRate), "ack_p99", s.Ack.P99, "receipt_p99", s.Receipt.P99)
	return s
}

// insertAtRate commits transactions of -sustained-per-txn events at rate
// events/s for d, recording each commit time, and returns the events inserted.
func (b *bench) insertAtRate(ctx context.Context, p *producer, commits *commitTimes, rate int, d time.Duration) (int, error) {
	per := b.o.SustainedPerTxn
	interval := time.Duration(float64(time.Second) * float64(per) / float64(rate))
	start := time.Now()
	n := 0
	for i := 0; ; i++ {
		next := start.Add(time.Duration(i) * interval)
		if next.Sub(start) >= d {
			return n, nil
		}
		if w := time.Until(next); w > 0 {
			select {
			case <-ctx.Done():
				return n, ctx.Err()
			case <-time.After(w):
			}
		}
		txn, at, err := p.insertTxn(ctx, per)
		if err != nil {
			return n, err
		}
		commits.set(txn, at)
		n += per
	}
}

// countable is a consumer's tally of the events it has seen.
type countable interface{ count() int64 }

// waitCount waits until the consumer has seen n events, polling every
// 20ms, and fails early when the relay exits.
func waitCount(ctx context.Context, seen countable, n int64, timeout time.Duration, relay *proc) error {
	deadline := time.Now().Add(timeout)
	for seen.count() < n {
		if relay.exited() {
			return fmt.Errorf("relay exited: %s: %s", relay.usage().ExitError, relay.logTail(10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer saw %d of %d events after %s", seen.count(), n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// drainDebezium starts a Kafka Connect worker with Debezium on its own slot of
// the backlog and measures until every event is in its topics. The clock
// starts when the JVM is launched; start-up (until its slot is active) is
// reported apart, and rate and CPU are taken over the streaming part alone:
// a long-running Debezium pays its start-up once. The slot's confirmation is
// not waited for (Debezium confirms only after an offset flush), which again
// favours Debezium over the relay.
func (b *bench) drainDebezium(ctx context.Context, db *benchDB, run int, typePrefix string, d *DrainRun) error {
	pd := &PeerDrain{}
	d.Debezium = pd
	fail := func(err error) error { pd.Err = err.Error(); return err }
	topics := dbzTopicsFor(typePrefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(fmt.Errorf("debezium: %w", err))
	}
	defer b.deleteTopics(ctx, client, topics)
	conn, err := pgx.Connect(ctx, db.AdminDSN)
	if err != nil {
		return fail(fmt.Errorf("connect: %w", err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	w, err := startDebezium(db, b.o.Brokers, db.DbzSlot, db.DbzPublication, b.dir, fmt.Sprintf("debezium-drain-run%d", run))
	if err != nil {
		return fail(err)
	}
	defer w.stop(30 * time.Second)
	streamAt, err := w.waitStreaming(ctx, conn)
	if err != nil {
		return fail(err)
	}
	cpu0, err := w.cpu()
	if err != nil {
		return fail(err)
	}
	pd.StartSec = streamAt.Sub(w.started).Seconds()
	b.log.Info("debezium streaming", "run", run, "start_up_seconds", pd.StartSec)
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var doneAt time.Time
	for i := 0; doneAt.IsZero(); i++ {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline:
			n, _ := endOffsets(ctx, client, topics)
			return fail(fmt.Errorf("debezium: %d of %d events in Kafka after %s: %s", n, d.Events, b.o.Timeout, w.logTail(5)))
		case <-tick.C:
		}
		if w.exited() {
			return fail(fmt.Errorf("debezium exited while draining: %s: %s", w.usage().ExitError, w.logTail(10)))
		}
		if i%40 == 39 {
			if err := w.failedTask(ctx); err != nil {
				return fail(fmt.Errorf("debezium: %w", err))
			}
		}
		n, err := endOffsets(ctx, client, topics)
		if err != nil {
			return fail(err)
		}
		if n >= d.Events {
			doneAt = time.Now()
		}
	}
	cpu1, cpuErr := w.cpu()
	rss, rssErr := w.peakRSS()
	u := w.stop(30 * time.Second)
	if rssErr != nil {
		rss = u.MaxRSS
	}
	if cpuErr != nil {
		cpu1 = u.CPU
	}
	pd.Sec = doneAt.Sub(w.started).Seconds()
	pd.StreamSec = doneAt.Sub(streamAt).Seconds()
	pd.CPUSec, pd.TotalCPUSec, pd.StartCPUSec = (cpu1 - cpu0).Seconds(), u.CPU.Seconds(), cpu0.Seconds()
	pd.PeakRSS = rss
	if pd.Records, err = endOffsets(ctx, client, topics); err != nil {
		return fail(err)
	}
	b.log.Info("debezium drained", "run", run, "seconds", pd.Sec, "streaming_seconds", pd.StreamSec,
		"events_per_s", int(d.DbzRate()), "peak_rss_bytes", pd.PeakRSS)
	return nil
}

// freshDatabase creates a throwaway database, recorded so that the end of the
// bench can warn if it is left behind.
func (b *bench) freshDatabase(ctx context.Context, name string) (*benchDB, error) {
	db, err := createDatabase(ctx, b.o.PostgresDSN, b.o.CleanupDSN, name)
	if err != nil {
		return nil, err
	}
	b.created.addDB(db.Name)
	b.created.addSlots(db.slots()...)
	return db, nil
}

// dropDatabase drops db, even after ctx is cancelled, adding a failure to *err.
func (b *bench) dropDatabase(ctx context.Context, db *benchDB, err *error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if derr := db.drop(cctx); derr != nil {
		*err = errors.Join(*err, fmt.Errorf("clean up: %w", derr))
	}
}
