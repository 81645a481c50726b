package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
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
// events/s are over 100 million events. It ends at its duration, however far
// the producer got, and appends each minute's row to report.md and soak.jsonl
// once that minute's events have had soakRowGrace to arrive.

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
	soakRowGrace    = 10 * time.Second // for a minute's last events before its row is written
)

// SoakResult is one soak.
type SoakResult struct {
	CapacityRate float64       `json:"capacity_events_per_s"` // the relay's measured drain; 0 when -rate was given
	TargetRate   int           `json:"target_rate"`
	PerTxn       int           `json:"per_txn"`
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
	r.writeTableHead(b)
	for _, m := range r.Minutes {
		writeSoakRow(b, m)
	}
	fmt.Fprintf(b, "\nAchieved %s events/s; delivered %s of %s events, %s duplicates, %s unknown records.\n",
		fmtRate(r.AchievedRate), fmtCount(int(r.Received)), fmtCount(int(r.Events)), fmtCount(int(r.Duplicates)), fmtCount(int(r.Unknown)))
	if r.Err != "" {
		fmt.Fprintf(b, "\nError: %s\n", cell(r.Err))
	}
}

// writeTableHead opens the soak's section and its per-minute table, to which
// rows are appended as the minutes pass.
func (r *SoakResult) writeTableHead(b *strings.Builder) {
	fmt.Fprintf(b, "\n## Soak\n\n%s of the relay at %s events/s in transactions of %d", r.Duration, fmtCount(r.TargetRate), r.PerTxn)
	if r.CapacityRate > 0 {
		fmt.Fprintf(b, " (half of its drain measured just before, %s events/s)", fmtRate(r.CapacityRate))
	}
	fmt.Fprintf(b, ". Per minute of commit time: the relay's highest VmRSS (sampled every %s) and commit → Kafka ack "+
		"percentiles (histogram buckets of at most 2.3%%).\n\n![soak: RSS and latency per minute](soak.svg)\n\n", soakRSSInterval)
	b.WriteString("| minute | events | RSS | ack p50 | ack p99 | ack max |\n| --- | --- | --- | --- | --- | --- |\n")
}

func writeSoakRow(b *strings.Builder, m SoakMinute) {
	fmt.Fprintf(b, "| %d | %s | %s | %s | %s | %s |\n", m.Minute, fmtCount(m.Events), fmtMB(m.RSS), fmtDur(m.P50), fmtDur(m.P99), fmtDur(m.Max))
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

// soak measures the relay's drain capacity (unless -rate was given), then runs
// it at half of that for -soak in a fresh database.
func (b *bench) soak(ctx context.Context) error {
	per := b.o.SustainedPerTxn[0]
	r := &SoakResult{TargetRate: b.o.Rate, PerTxn: per, Duration: b.o.Soak}
	b.rep.Soak = r
	if !b.o.RateSet {
		d, err := b.drainWorkload(ctx, 1, b.o.DrainPerTxn[0])
		b.rep.Drain = append(b.rep.Drain, d)
		if err != nil {
			return fmt.Errorf("capacity drain: %w", err)
		}
		r.CapacityRate = d.RelayRate()
		r.TargetRate = max(int(r.CapacityRate/2), per)
	}
	db, err := b.workloadDB(ctx, "soak", false)
	if err != nil {
		return err
	}
	defer b.dropDatabase(ctx, db, &err)
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
	p, err := newProducer(ctx, db.DSN, prefix, b.o.Aggregates, b.o.PayloadBytes, b.o.Producers)
	if err != nil {
		return err
	}
	defer p.close(context.WithoutCancel(ctx))

	commits := &commitTimes{t: map[int64]time.Time{}}
	samples := &soakSamples{}
	cctx, stopBackground := context.WithCancel(ctx)
	var g errgroup.Group
	g.Go(func() error { return consume(cctx, b.o.Brokers, topics, false, commits, samples) })
	defer func() { stopBackground(); _ = g.Wait() }()

	log := filepath.Join(b.dir, "relay-soak.log")
	relay, err := startProc(b.o.RelayBin, []string{"run"}, b.profiled(b.relayEnv(db), log), log)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer relay.stop(30 * time.Second)
	txn, at, err := p.insertTxn(ctx, 0, r.PerTxn)
	if err != nil {
		return err
	}
	commits.set(txn, at)
	r.Events += int64(r.PerTxn)
	if err := waitCount(ctx, samples, r.Events, time.Minute, relay); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	start := time.Now()
	samples.start(start)
	// The producer stops at once when the relay exits: nothing would deliver.
	pctx, stopProducer := context.WithCancelCause(ctx)
	defer stopProducer(nil)
	w, err := newSoakWriter(b.dir, b.rep, r)
	if err != nil {
		return err
	}
	g.Go(func() error { b.soakWatch(cctx, start, relay, samples, w, stopProducer); return nil })
	b.log.Info("soak", "rate", r.TargetRate, "per_txn", r.PerTxn, "duration", r.Duration)
	phaseEvents, _, err := insertAtRate(pctx, p, commits, r.TargetRate, r.PerTxn, r.Duration)
	if cause := context.Cause(pctx); cause != nil && ctx.Err() == nil {
		err = cause
	}
	r.AchievedRate = float64(phaseEvents) / time.Since(start).Seconds()
	r.Events += int64(phaseEvents)
	if err != nil {
		return err
	}
	waitErr := waitCount(ctx, samples, r.Events, soakWaitLast, relay)
	stopBackground()
	_ = g.Wait()
	samples.resolve(commits)
	r.Minutes = samples.minutes(int(math.Ceil(r.Duration.Minutes())))
	if err := w.finish(r.Minutes); err != nil {
		b.log.Warn("soak: write the last minutes' rows", "err", err)
	}
	samples.mu.Lock()
	r.Received, r.Duplicates, r.Unknown = samples.received, samples.duplicates, samples.unknown
	samples.mu.Unlock()
	r.summarize()
	return waitErr
}

// soakWatch samples the relay's RSS, writes each minute's row once its events
// have had soakRowGrace to arrive, and stops the producer if the relay exits.
func (b *bench) soakWatch(ctx context.Context, start time.Time, relay *proc, s *soakSamples, w *soakWriter, stopProducer context.CancelCauseFunc) {
	t := time.NewTicker(soakRSSInterval)
	defer t.Stop()
	minutes := int(math.Ceil(b.o.Soak.Minutes()))
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if relay.exited() {
				stopProducer(fmt.Errorf("relay exited: %s: %s", relay.exitErr(), relay.logTail(10)))
				return
			}
			if rss, err := relay.rss(); err == nil {
				s.sampleRSS(now, rss)
			}
			for w.written < minutes && now.Sub(start) >= time.Duration(w.written+1)*time.Minute+soakRowGrace {
				m := s.minutes(w.written + 1)[w.written]
				if err := w.add(m); err != nil {
					b.log.Warn("soak: write the minute's row", "err", err)
				}
				b.log.Info("soak minute", "minute", m.Minute, "events", m.Events, "rss_bytes", m.RSS, "p99", m.P99, "delivered", s.count())
			}
		}
	}
}

// soakWriter appends each minute of the soak to report.md (begun with the
// header) and to soak.jsonl while the soak runs, so that a long soak shows its
// progress and a killed one leaves what it measured. The final report.md
// replaces the first with every late event counted.
type soakWriter struct {
	md, jsonl string
	written   int // minutes written
}

func newSoakWriter(dir string, rep *Report, r *SoakResult) (*soakWriter, error) {
	w := &soakWriter{md: filepath.Join(dir, "report.md"), jsonl: filepath.Join(dir, "soak.jsonl")}
	var b strings.Builder
	rep.writeHeader(&b)
	r.writeTableHead(&b)
	if err := os.WriteFile(w.md, []byte(b.String()), 0o644); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	if err := os.WriteFile(w.jsonl, nil, 0o644); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	return w, nil
}

func (w *soakWriter) add(m SoakMinute) error {
	var b strings.Builder
	writeSoakRow(&b, m)
	js, err := json.Marshal(m)
	if err != nil {
		return err
	}
	w.written++
	return errors.Join(appendFile(w.md, []byte(b.String())), appendFile(w.jsonl, append(js, '\n')))
}

// finish writes the minutes the soak ended before writing.
func (w *soakWriter) finish(ms []SoakMinute) error {
	var errs []error
	for _, m := range ms[min(w.written, len(ms)):] {
		errs = append(errs, w.add(m))
	}
	return errors.Join(errs...)
}

func appendFile(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	return errors.Join(err, f.Close())
}
