package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// probeDuration is how long the producer commits flat out to measure its
// capacity.
const probeDuration = 5 * time.Second

// highRatePerTxn is the transaction size of the high-rate workload (-high-rate):
// 500 transactions of 100 events a second at 50,000 events/s.
const highRatePerTxn = 100

// A workload is a sustained phase's shape: transactions of Per events at
// Rate events/s, 0 meaning -rate.
type workload struct {
	Per, Rate int
}

// tag tells a high-rate workload's databases, topics and files from the
// -rate one of the same transaction size.
func (w workload) tag() string {
	if w.Rate == 0 {
		return ""
	}
	return fmt.Sprintf("h%d", w.Rate)
}

// A runningSink is the relay or Debezium while it delivers a sustained phase;
// stop ends it and says what it cost.
type runningSink interface {
	exited() bool
	exitErr() string
	logTail(n int) string
	cpu() (time.Duration, error)
	peakRSS() (int64, error)
	stop() usage
}

// A sustainedSink is what delivers the sustained phase's events: the relay or
// Debezium. start launches it and returns once it reads its slot, so that its
// start-up is not counted as latency.
type sustainedSink struct {
	name       string // relay or debezium: in the report, logs and errors
	typePrefix string // aggregate-type prefix of the phase: fresh topics per sink
	topics     func(typePrefix string) []string
	start      func(ctx context.Context) (runningSink, error)
	// warmUp is run at the target rate and discarded before the timed phase:
	// a JVM's JIT compiles its hot paths in the first seconds under load,
	// and the relay's first half second at a rate is its slowest (its
	// producer's connections and buffers, the page cache: stage trace).
	warmUp time.Duration
	// readCommitted: the sink writes in transactions (the exactly-once
	// relay); its consumer reads read_committed and its commit → ack is
	// commit → receipt (eos.go).
	readCommitted bool
	// stages, for a relay, is the file of its stage trace (RELAY_STAGES).
	stages string
}

// relayProc is the relay as a runningSink; done, when set, runs once it
// stopped (the exactly-once relay's checkpoint topic is dropped).
type relayProc struct {
	*proc
	done func()
}

func (r relayProc) stop() usage {
	u := r.proc.stop(30 * time.Second)
	if r.done != nil {
		r.done()
	}
	return u
}

func (b *bench) relaySink(db *benchDB, run int, w workload) sustainedSink {
	log := filepath.Join(b.dir, fmt.Sprintf("relay-sustained-%d%s-run%d.log", w.Per, w.tag(), run))
	return sustainedSink{
		name: "relay", typePrefix: fmt.Sprintf("b%sr%ds%d%s_", b.stamp, run, w.Per, w.tag()), topics: topicsFor,
		stages: stagesPath(log), warmUp: b.o.RelayWarmUp,
		start: func(context.Context) (runningSink, error) {
			p, err := startProc(b.o.RelayBin, []string{"run"}, withStages(b.profiled(b.relayEnv(db), log), log), log)
			if err != nil {
				return nil, fmt.Errorf("relay: %w", err)
			}
			return relayProc{p, nil}, nil
		},
	}
}

// sustainedRate is the events/s of a sustained workload: its rate (-rate for
// the usual ones), unless that needs more commits/s than the producer held
// in the probe; then the highest multiple of 100 commits/s it held. With
// Debezium beside the relay, a -rate workload whose transaction size was
// drained in this run also runs at no more than heldFraction of the slower
// system's drain rate, so that both hold it and their latencies compare
// like for like (issue 39). by says what lowered it: "producer", the slower
// system's name, or "" when nothing did.
func (b *bench) sustainedRate(w workload) (rate int, by string) {
	rate = b.o.Rate
	if w.Rate > 0 {
		rate = w.Rate
	}
	if p := b.rep.Producer; p != nil && float64(rate)/float64(w.Per) > p.CommitsPerSec {
		rate, by = max(int(p.CommitsPerSec)/100*100, 1)*w.Per, "producer"
	}
	if w.Rate == 0 && b.debezium() {
		if held, slower := b.heldRate(w.Per); held > 0 && float64(rate) > held*heldFraction {
			rate, by = max(int(held*heldFraction/float64(w.Per))/100*100, 1)*w.Per, slower
		}
	}
	return max(rate, w.Per), by
}

// heldFraction is the share of the slower system's drain rate an equal-rate
// comparison runs at: at its full drain rate a system only just keeps up,
// and its queue, and so its latency, would grow with the run's length.
const heldFraction = 0.8

// heldRate is the median, over this run's drains of per-event transactions
// that both the relay and Debezium finished, of the slower one's events/s,
// and the name of the one that was slower in most of them; 0 when there is
// none.
func (b *bench) heldRate(per int) (float64, string) {
	var rates []float64
	dbzSlower := 0
	for _, d := range b.rep.Drain {
		relay, dbz := d.RelayRate(), d.DbzRate()
		if d.PerTxn != per || d.Err != "" || relay <= 0 || dbz <= 0 {
			continue
		}
		rates = append(rates, min(relay, dbz))
		if dbz < relay {
			dbzSlower++
		}
	}
	if len(rates) == 0 {
		return 0, ""
	}
	if 2*dbzSlower >= len(rates) {
		return Median(rates), "debezium"
	}
	return Median(rates), "relay"
}

// profiled is env with a CPU profile of the relay beside its log (-cpu-profile).
func (b *bench) profiled(env []string, logPath string) []string {
	if !b.o.CPUProfile {
		return env
	}
	return append(env, "RELAY_CPUPROFILE="+strings.TrimSuffix(logPath, ".log")+".cpu")
}

// sustainedWorkload runs the relay, then Debezium, at a fixed rate of
// transactions of per events, in a fresh database.
func (b *bench) sustainedWorkload(ctx context.Context, run int, w workload) (err error) {
	db, err := b.workloadDB(ctx, fmt.Sprintf("r%d_s%d%s", run, w.Per, w.tag()), false)
	if err != nil {
		return err
	}
	defer b.dropDatabase(ctx, db, &err)
	sinks := []sustainedSink{b.relaySink(db, run, w)}
	if b.o.ExactlyOnce {
		sinks = append(sinks, b.relayEOSSink(db, run, w))
	}
	if b.debezium() {
		sinks = append(sinks, b.dbzSink(db, run, w))
	}
	var errs []error
	for _, sink := range sinks {
		if ctx.Err() != nil {
			break
		}
		s := b.sustained(ctx, db, run, w, sink)
		b.rep.Sustained = append(b.rep.Sustained, s)
		if s.Err != "" {
			errs = append(errs, fmt.Errorf("%s: %s", sink.name, s.Err))
		}
	}
	return errors.Join(errs...)
}

// sustained inserts at a fixed rate while the sink runs and an in-process
// consumer measures each event's latency from its producer's COMMIT return.
func (b *bench) sustained(ctx context.Context, db *benchDB, run int, w workload, sink sustainedSink) (s SustainedRun) {
	per := w.Per
	rate, capped := b.sustainedRate(w)
	s = SustainedRun{Run: run, Sink: sink.name, PerTxn: per, Rate: w.Rate, TargetRate: rate, RateCap: capped}
	fail := func(err error) SustainedRun { s.Err = err.Error(); return s }
	topics := sink.topics(sink.typePrefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(err)
	}
	defer b.deleteTopics(ctx, client, topics)
	p, err := newProducer(ctx, db.DSN, sink.typePrefix, b.o.Aggregates, b.o.PayloadBytes, b.o.Producers)
	if err != nil {
		return fail(err)
	}
	defer p.close(context.WithoutCancel(ctx))

	commits := &commitTimes{t: map[int64]time.Time{}}
	samples := newLatencySamples()
	cctx, stopConsumer := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return consume(cctx, b.o.Brokers, topics, sink.readCommitted, commits, samples) })
	defer func() { stopConsumer(); _ = g.Wait() }()

	running, err := sink.start(ctx)
	if err != nil {
		return fail(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			running.stop()
		}
	}()

	// Warm up: one transaction through the sink and the consumer, so start-up
	// of the sink and of 40 partition readers is not counted as latency.
	txn, at, err := p.insertTxn(ctx, 0, per)
	if err != nil {
		return fail(err)
	}
	commits.set(txn, at)
	if err := waitCount(ctx, samples, int64(per), time.Minute, running); err != nil {
		return fail(fmt.Errorf("warm-up: %w", err))
	}
	if sink.warmUp > 0 {
		b.log.Info("warm-up at the target rate", "run", run, "sink", sink.name, "per_txn", per, "duration", sink.warmUp)
		n, _, err := insertAtRate(ctx, p, commits, rate, per, sink.warmUp)
		if err != nil {
			return fail(err)
		}
		if err := waitCount(ctx, samples, int64(per+n), 2*time.Minute, running); err != nil {
			return fail(fmt.Errorf("warm-up: %w", err))
		}
	}
	samples.reset()

	b.log.Info("sustained phase", "run", run, "sink", sink.name, "per_txn", per, "rate", rate, "duration", b.o.Duration)
	cpu0, _ := running.cpu()
	self0, _ := pidCPU(os.Getpid())
	start := time.Now()
	if s.Events, s.Commits, err = insertAtRate(ctx, p, commits, rate, per, b.o.Duration); err != nil {
		return fail(err)
	}
	s.AchievedRate = float64(s.Events) / time.Since(start).Seconds()
	if err := waitCount(ctx, samples, int64(s.Events), 60*time.Second, running); err != nil {
		s.Err = err.Error()
	}
	if rss, err := running.peakRSS(); err == nil {
		s.PeakRSS = rss
	}
	if cpu1, err := running.cpu(); err == nil {
		s.PhaseCPUSec = (cpu1 - cpu0).Seconds()
	}
	if self1, err := pidCPU(os.Getpid()); err == nil {
		s.BenchCPUSec = (self1 - self0).Seconds()
	}
	stopped = true
	s.CPUSec = running.stop().CPU.Seconds()
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
	ack := samples.ack
	if sink.readCommitted {
		ack = samples.receipt
	}
	h := b.ackHist(sink.name, w)
	for _, d := range ack {
		h.Add(d)
	}
	s.Ack, s.Receipt = Summarize(ack), Summarize(samples.receipt)
	if sink.stages != "" {
		if s.Stages, err = readStages(sink.stages, start); err != nil {
			b.log.Warn("stage trace not read", "run", run, "sink", sink.name, "err", err)
		}
	}
	b.log.Info("sustained done", "run", run, "sink", sink.name, "per_txn", per, "achieved_rate", int(s.AchievedRate),
		"ack_p50", s.Ack.P50, "ack_p99", s.Ack.P99, "ack_max", s.Ack.Max)
	return s
}

// ackHist is the commit→ack histogram of a sink and workload over all runs.
func (b *bench) ackHist(sink string, w workload) *Histogram {
	k := workloadKey(sink, w.Per, w.Rate)
	if b.rep.AckHists == nil {
		b.rep.AckHists = map[string]*Histogram{}
	}
	if b.rep.AckHists[k] == nil {
		b.rep.AckHists[k] = NewHistogram(100*time.Microsecond, 100*time.Second, 20)
	}
	return b.rep.AckHists[k]
}

// insertAtRate commits transactions of per events at rate events/s for d over
// all of p's connections, each recording its commit time, and returns the
// events and transactions committed. It ends at d, also when the producer
// has fallen behind its schedule: a slow producer lowers the achieved rate,
// never stretches the phase.
func insertAtRate(ctx context.Context, p *producer, commits *commitTimes, rate, per int, d time.Duration) (events, txns int, err error) {
	interval := time.Duration(float64(time.Second) * float64(per) / float64(rate))
	start := time.Now()
	var next, done atomic.Int64
	g, ctx := errgroup.WithContext(ctx)
	for c := range p.conns {
		g.Go(func() error {
			for {
				i := next.Add(1) - 1
				due := time.Duration(i) * interval
				if due >= d || time.Since(start) >= d {
					return nil
				}
				if w := time.Until(start.Add(due)); w > 0 {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(w):
					}
				}
				txn, at, err := p.insertTxn(ctx, c, per)
				if err != nil {
					return err
				}
				commits.set(txn, at)
				done.Add(1)
			}
		})
	}
	err = g.Wait()
	n := int(done.Load())
	return n * per, n, err
}

// probeProducer measures the producer's capacity: one-event transactions
// committed flat out on -producers connections for probeDuration, in a
// database of its own with no slot, so that nothing reads them.
func (b *bench) probeProducer(ctx context.Context) (probe *ProducerProbe, err error) {
	db, err := b.freshDatabase(ctx, fmt.Sprintf("outbox_bench_%s_probe", b.stamp))
	if err != nil {
		return nil, err
	}
	defer b.dropDatabase(ctx, db, &err)
	if err := db.ensureObjects(ctx, nil, nil); err != nil {
		return nil, err
	}
	p, err := newProducer(ctx, db.DSN, "probe_", b.o.Aggregates, b.o.PayloadBytes, b.o.Producers)
	if err != nil {
		return nil, err
	}
	defer p.close(context.WithoutCancel(ctx))
	commits := &commitTimes{t: map[int64]time.Time{}}
	start := time.Now()
	// A rate no producer reaches: the schedule is always behind, so every
	// connection commits back to back.
	_, n, err := insertAtRate(ctx, p, commits, 1e9, 1, probeDuration)
	if err != nil {
		return nil, err
	}
	sec := time.Since(start).Seconds()
	probe = &ProducerProbe{Connections: len(p.conns), Seconds: sec, CommitsPerSec: float64(n) / sec}
	b.log.Info("producer capacity", "connections", probe.Connections, "commits_per_s", int(probe.CommitsPerSec))
	return probe, nil
}
