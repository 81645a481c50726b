package main

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"
)

// The soak (-soak 30m, `make bench-soak`) runs the relay for a long time at
// half of its measured drain capacity and checks that nothing creeps: resident
// memory stays flat, the p99 latency does not drift and every event arrives.
// Per-minute figures, not per-event samples, are kept: 30 minutes at 70k
// events/s are over 100 million events.

// Soak verdicts: the median of the per-minute values over the last window
// against the first window (window = 10 minutes, or a third of a shorter soak).
const (
	soakRSSGrowth   = 0.10                 // last ≤ first × 1.10
	soakP99Drift    = 1.5                  // last ≤ first × 1.5 …
	soakP99Slack    = 5 * time.Millisecond // … or ≤ first + 5 ms: a 2 ms p99 may wobble to 4 ms
	soakWindowMax   = 10                   // minutes
	soakRSSInterval = 5 * time.Second      // VmRSS sampling
	soakWaitLast    = 120 * time.Second    // for the last events after the producer stops
	soakHistLow     = 100 * time.Microsecond
)

// SoakResult is one soak.
type SoakResult struct {
	CapacityRate float64       `json:"capacity_events_per_s"` // the relay's measured drain; 0 when -rate was given
	TargetRate   int           `json:"target_rate"`
	AchievedRate float64       `json:"achieved_rate"`
	Duration     time.Duration `json:"duration_ns"`
	Events       int64         `json:"events"`   // committed, the warm-up transaction included
	Received     int64         `json:"received"` // distinct events
	Duplicates   int64         `json:"duplicates"`
	Unknown      int64         `json:"unknown"`
	Minutes      []SoakMinute  `json:"minutes"`
	Window       int           `json:"window_minutes"`
	RSSFirst     int64         `json:"rss_first_bytes"` // median of the first window's per-minute RSS
	RSSLast      int64         `json:"rss_last_bytes"`
	P99First     time.Duration `json:"p99_first_ns"`
	P99Last      time.Duration `json:"p99_last_ns"`
	Err          string        `json:"error,omitempty"`
}

// SoakMinute is one minute of the soak, by commit time.
type SoakMinute struct {
	Minute int           `json:"minute"`
	Events int           `json:"events"`
	RSS    int64         `json:"rss_bytes"` // highest VmRSS sampled in the minute
	P50    time.Duration `json:"p50_ns"`
	P99    time.Duration `json:"p99_ns"`
	Max    time.Duration `json:"max_ns"`
}

// soakSamples aggregates the consumer's records per minute of commit time.
// Distinct events are counted with a bitset over the producer's dense seq.
type soakSamples struct {
	mu         sync.Mutex
	t0         time.Time // start of minute 0; zero until the phase starts
	hists      []*Histogram
	maxes      []time.Duration
	rss        []int64
	seen       []uint64
	received   int64
	duplicates int64
	unknown    int64
	pending    []pendingRecord // seen before their commit time was recorded
}

func (s *soakSamples) start(t0 time.Time) {
	s.mu.Lock()
	s.t0 = t0
	s.mu.Unlock()
}

func (s *soakSamples) count() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received
}

func (s *soakSamples) add(m kafka.Message, _ time.Time, commits *commitTimes) {
	txn, okTxn := payloadInt(m.Value, "txn")
	seq, okSeq := payloadInt(m.Value, "seq")
	s.mu.Lock()
	defer s.mu.Unlock()
	if !okTxn || !okSeq || seq < 0 {
		s.unknown++
		return
	}
	w, bit := seq/64, uint64(1)<<(seq%64)
	for int64(len(s.seen)) <= w {
		s.seen = append(s.seen, make([]uint64, len(s.seen)+1024)...)
	}
	if s.seen[w]&bit != 0 {
		s.duplicates++
		return
	}
	s.seen[w] |= bit
	s.received++
	if committed, ok := commits.get(txn); ok {
		s.record(committed, m.Time)
	} else {
		s.pending = append(s.pending, pendingRecord{txn: txn, appended: m.Time})
	}
}

// record counts one commit→ack latency in the minute of its commit; the
// warm-up (before t0) is delivered but not timed.
func (s *soakSamples) record(committed, appended time.Time) {
	if s.t0.IsZero() || committed.Before(s.t0) {
		return
	}
	i := int(committed.Sub(s.t0) / time.Minute)
	for len(s.hists) <= i {
		s.hists = append(s.hists, NewHistogram(soakHistLow, 100*time.Second, 100))
		s.maxes = append(s.maxes, 0)
	}
	d := max(appended.Sub(committed), 0)
	s.hists[i].Add(d)
	s.maxes[i] = max(s.maxes[i], d)
}

func (s *soakSamples) resolve(commits *commitTimes) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pending {
		if committed, ok := commits.get(p.txn); ok {
			s.record(committed, p.appended)
		} else {
			s.unknown++
		}
	}
	s.pending = nil
}

// sampleRSS records VmRSS in the minute it is read.
func (s *soakSamples) sampleRSS(at time.Time, rss int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.t0.IsZero() || at.Before(s.t0) {
		return
	}
	i := int(at.Sub(s.t0) / time.Minute)
	for len(s.rss) <= i {
		s.rss = append(s.rss, 0)
	}
	s.rss[i] = max(s.rss[i], rss)
}

// minutes returns the per-minute figures of the first n minutes.
func (s *soakSamples) minutes(n int) []SoakMinute {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SoakMinute, n)
	for i := range out {
		out[i].Minute = i + 1
		if i < len(s.hists) {
			h := s.hists[i]
			for _, c := range h.Counts {
				out[i].Events += c
			}
			out[i].P50, out[i].P99, out[i].Max = h.Quantile(50), h.Quantile(99), s.maxes[i]
		}
		if i < len(s.rss) {
			out[i].RSS = s.rss[i]
		}
	}
	return out
}

// summarize fills the window medians from Minutes.
func (r *SoakResult) summarize() {
	n := len(r.Minutes)
	if n == 0 {
		return
	}
	r.Window = min(soakWindowMax, max(1, n/3))
	med := func(ms []SoakMinute, f func(SoakMinute) float64) float64 {
		var xs []float64
		for _, m := range ms {
			if v := f(m); v > 0 {
				xs = append(xs, v)
			}
		}
		return Median(xs)
	}
	first, last := r.Minutes[:r.Window], r.Minutes[n-r.Window:]
	rss := func(m SoakMinute) float64 { return float64(m.RSS) }
	p99 := func(m SoakMinute) float64 { return float64(m.P99) }
	r.RSSFirst, r.RSSLast = int64(med(first, rss)), int64(med(last, rss))
	r.P99First, r.P99Last = time.Duration(med(first, p99)), time.Duration(med(last, p99))
}

// targets are the soak's verdicts.
func (r *SoakResult) targets() []Target {
	if len(r.Minutes) == 0 {
		return nil
	}
	var note string
	if r.AchievedRate < 0.95*float64(r.TargetRate) {
		note = fmt.Sprintf("the producer reached only %s of %s events/s", fmtRate(r.AchievedRate), fmtCount(r.TargetRate))
	}
	win := fmt.Sprintf("median of the last %d min vs the first %d min", r.Window, r.Window)
	p99Limit := max(time.Duration(float64(r.P99First)*soakP99Drift), r.P99First+soakP99Slack)
	return []Target{
		{
			Name: "soak delivery",
			Want: "every event delivered",
			Got:  fmt.Sprintf("%s of %s (%s duplicates, %s unknown)", fmtCount(int(r.Received)), fmtCount(int(r.Events)), fmtCount(int(r.Duplicates)), fmtCount(int(r.Unknown))),
			Pass: r.Events > 0 && r.Received == r.Events && r.Unknown == 0 && r.Err == "",
		},
		{
			Name: "soak RSS flat",
			Want: fmt.Sprintf("growth ≤ %.0f%% (%s)", soakRSSGrowth*100, win),
			Got:  fmt.Sprintf("%s → %s (%+.1f%%)", fmtMB(r.RSSFirst), fmtMB(r.RSSLast), pctChange(r.RSSFirst, r.RSSLast)),
			Pass: r.RSSFirst > 0 && float64(r.RSSLast) <= float64(r.RSSFirst)*(1+soakRSSGrowth),
			Note: note,
		},
		{
			Name: "soak p99 drift",
			Want: fmt.Sprintf("≤ %.1f × or + %s (%s)", soakP99Drift, fmtDur(soakP99Slack), win),
			Got:  fmt.Sprintf("%s → %s", fmtDur(r.P99First), fmtDur(r.P99Last)),
			Pass: r.P99First > 0 && r.P99Last <= p99Limit,
			Note: note,
		},
	}
}

func pctChange(a, b int64) float64 {
	if a == 0 {
		return 0
	}
	return (float64(b) - float64(a)) / float64(a) * 100
}

func (r *SoakResult) writeMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "\n## Soak\n\n%s at %s events/s", r.Duration, fmtCount(r.TargetRate))
	if r.CapacityRate > 0 {
		fmt.Fprintf(b, " (half of the relay's measured drain, %s events/s)", fmtRate(r.CapacityRate))
	}
	fmt.Fprintf(b, "; achieved %s events/s. Per minute of commit time: the relay's highest VmRSS sampled every %s and "+
		"commit → Kafka ack (LogAppendTime) percentiles from a histogram with 100 buckets per decade (upper bucket edges: at most 2.3%% high). "+
		"Verdicts compare the median over the last %d minutes with the first %d.\n\n",
		fmtRate(r.AchievedRate), soakRSSInterval, r.Window, r.Window)
	fmt.Fprintf(b, "Delivered %s of %s events, %s duplicates, %s unknown records.\n\n![soak: RSS and p99 per minute](soak.svg)\n\n",
		fmtCount(int(r.Received)), fmtCount(int(r.Events)), fmtCount(int(r.Duplicates)), fmtCount(int(r.Unknown)))
	b.WriteString("| minute | events | RSS | ack p50 | ack p99 | ack max |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, m := range r.Minutes {
		fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s |\n", m.Minute, fmtCount(m.Events), fmtMB(m.RSS), fmtDur(m.P50), fmtDur(m.P99), fmtDur(m.Max))
	}
	if r.Err != "" {
		fmt.Fprintf(b, "\nError: %s\n", cell(r.Err))
	}
}

func (r *SoakResult) writeSummary(b *strings.Builder) {
	fmt.Fprintf(b, "soak %s at %s events/s (achieved %s): delivered %s of %s; RSS %s → %s; p99 %s → %s\n",
		r.Duration, fmtCount(r.TargetRate), fmtRate(r.AchievedRate), fmtCount(int(r.Received)), fmtCount(int(r.Events)),
		fmtMB(r.RSSFirst), fmtMB(r.RSSLast), fmtDur(r.P99First), fmtDur(r.P99Last))
}

// Quantile returns the upper edge of the bucket holding the p-th percentile
// (nearest rank): an upper bound within one bucket's width. 0 for no samples.
func (h *Histogram) Quantile(p float64) time.Duration {
	var n int
	for _, c := range h.Counts {
		n += c
	}
	if n == 0 {
		return 0
	}
	rank := min(max(int(math.Ceil(p/100*float64(n))), 1), n)
	for i, c := range h.Counts {
		if rank -= c; rank <= 0 {
			return h.Edge(i + 1)
		}
	}
	return h.Edge(len(h.Counts))
}

// soak runs one soak in a fresh database: a drain to measure capacity (unless
// -rate was given), then the relay at half of it for -soak.
func (b *bench) soak(ctx context.Context) (err error) {
	db, err := b.freshDatabase(ctx, fmt.Sprintf("outbox_bench_%s_soak", b.stamp))
	if err != nil {
		return err
	}
	defer b.dropDatabase(ctx, db, &err)
	if err := b.relaySetup(ctx, db, 1); err != nil {
		b.log.Warn("outbox-relay setup failed; creating the objects without it", "err", err)
	}
	slots := []string{db.RelaySlot}
	if !b.o.RateSet {
		slots = append(slots, db.RecvSlot)
	}
	if err := db.ensureObjects(ctx, []string{db.Publication}, slots); err != nil {
		return err
	}
	r := &SoakResult{TargetRate: b.o.Rate, Duration: b.o.Soak}
	b.rep.Soak = r
	if !b.o.RateSet {
		d := b.drain(ctx, db, 1)
		b.rep.Drain = append(b.rep.Drain, d)
		if d.Err != "" {
			return fmt.Errorf("capacity drain: %s", d.Err)
		}
		r.CapacityRate = d.RelayRate()
		r.TargetRate = max(int(r.CapacityRate/2), b.o.SustainedPerTxn)
	}
	if err := b.soakPhase(ctx, db, r); err != nil {
		r.Err = err.Error()
		return err
	}
	return nil
}

func (b *bench) soakPhase(ctx context.Context, db *benchDB, r *SoakResult) error {
	prefix := fmt.Sprintf("b%sk_", b.stamp)
	topics := topicsFor(prefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return err
	}
	defer b.deleteTopics(ctx, client, topics)
	p, err := newProducer(ctx, db.DSN, prefix, b.o.Aggregates, b.o.PayloadBytes)
	if err != nil {
		return err
	}
	defer p.close(context.WithoutCancel(ctx))

	commits := &commitTimes{t: map[int64]time.Time{}}
	samples := &soakSamples{}
	cctx, stopBackground := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return consume(cctx, b.o.Brokers, topics, commits, samples) })
	defer func() { stopBackground(); _ = g.Wait() }()

	relay, err := startProc(b.o.RelayBin, []string{"run"}, b.relayEnv(db), b.dir+"/relay-soak.log")
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer relay.stop(30 * time.Second)
	per := b.o.SustainedPerTxn
	txn, at, err := p.insertTxn(ctx, per)
	if err != nil {
		return err
	}
	commits.set(txn, at)
	r.Events += int64(per)
	if err := waitCount(ctx, samples, r.Events, time.Minute, relay); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	start := time.Now()
	samples.start(start)
	g.Go(func() error {
		t := time.NewTicker(soakRSSInterval)
		defer t.Stop()
		for {
			select {
			case <-cctx.Done():
				return nil
			case now := <-t.C:
				if rss, err := relay.rss(); err == nil {
					samples.sampleRSS(now, rss)
				}
			}
		}
	})
	b.log.Info("soak", "rate", r.TargetRate, "duration", r.Duration)
	interval := time.Duration(float64(time.Second) * float64(per) / float64(r.TargetRate))
	var phaseEvents int64
	lastLog := start
	for i := 0; ; i++ {
		next := start.Add(time.Duration(i) * interval)
		if next.Sub(start) >= r.Duration {
			break
		}
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(d):
			}
		}
		if relay.exited() {
			return fmt.Errorf("relay exited: %s: %s", relay.usage().ExitError, relay.logTail(10))
		}
		txn, at, err := p.insertTxn(ctx, per)
		if err != nil {
			return err
		}
		commits.set(txn, at)
		phaseEvents += int64(per)
		if time.Since(lastLog) >= time.Minute {
			lastLog = time.Now()
			b.log.Info("soak progress", "elapsed", time.Since(start).Round(time.Second), "events", phaseEvents, "delivered", samples.count())
		}
	}
	r.AchievedRate = float64(phaseEvents) / time.Since(start).Seconds()
	r.Events += phaseEvents
	waitErr := waitCount(ctx, samples, r.Events, soakWaitLast, relay)
	stopBackground()
	_ = g.Wait()
	samples.resolve(commits)
	minutes := int(math.Ceil(r.Duration.Minutes()))
	r.Minutes = samples.minutes(minutes)
	samples.mu.Lock()
	r.Received, r.Duplicates, r.Unknown = samples.received, samples.duplicates, samples.unknown
	samples.mu.Unlock()
	r.summarize()
	return waitErr
}
