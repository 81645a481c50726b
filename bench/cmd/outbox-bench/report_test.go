package main

import (
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func mustDur(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// sampleReport is a finished three-run report. Drains of 1,000-event
// transactions: the relay at 0.8, 0.95 and 0.92 of pg_recvlogical's 100,000
// events/s; of one-event transactions: at 0.5 of its 50,000. Sustained at
// 10,000 events/s: the relay's p99 12–14 ms at 100 events per transaction and
// 30 ms at one.
func sampleReport() *Report {
	r := &Report{
		Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Command: "outbox-bench -runs 3",
		Env:     Env{Host: "linux/amd64", CPUs: 2, Go: "go1.26.8", Postgres: "PostgreSQL 15.18", Relay: "outbox-relay v1", Load: 1.5},
		Config: Settings{Events: 1000000, PayloadBytes: 300, DrainPerTxn: []int{1000, 1}, Aggregates: 1000, Rate: 10000,
			Duration: time.Minute, SustainedPerTxn: []int{100, 1}, Producers: 8, Runs: 3},
		Producer: &ProducerProbe{Connections: 8, Seconds: 5, CommitsPerSec: 12000},
	}
	for i, ratio := range []float64{0.8, 0.95, 0.92} {
		r.Drain = append(r.Drain, DrainRun{
			Run: i + 1, PerTxn: 1000, Events: 1000000, WALBytes: 500e6,
			RecvSec: 10, RecvCPUSec: 4, RelaySec: 10 / ratio, RelayKafkaSec: 10/ratio - 0.1, RelayConfirmedSec: 10 / ratio,
			RelayCPUSec: 8, PeakRSS: int64(40+i) << 20, KafkaRecords: 1000000,
		}, DrainRun{
			Run: i + 1, PerTxn: 1, Events: 1000000, WALBytes: 900e6,
			RecvSec: 20, RecvCPUSec: 6, RelaySec: 40, RelayCPUSec: 3, PeakRSS: 44 << 20, KafkaRecords: 1000000,
		})
		for _, per := range []int{100, 1} {
			p99 := ms(12 + float64(i))
			if per == 1 {
				p99 = ms(30)
			}
			r.Sustained = append(r.Sustained, SustainedRun{
				Run: i + 1, Sink: "relay", PerTxn: per, TargetRate: 10000, AchievedRate: 9990, Events: 600000, Commits: 600000 / per,
				Received: 600000, PhaseCPUSec: 4.2, PeakRSS: 30 << 20,
				Ack:     Latency{Count: 600000, P50: ms(3), P95: ms(8), P99: p99, Max: ms(40)},
				Receipt: Latency{Count: 600000, P50: ms(5), P95: ms(11), P99: ms(16), Max: ms(50)},
			})
		}
	}
	r.summarize()
	return r
}

func TestSummarize_Medians(t *testing.T) {
	s := sampleReport().Summary
	if len(s.Drains) != 2 || s.Drains[0].PerTxn != 1000 || s.Drains[1].PerTxn != 1 {
		t.Fatalf("Summary.Drains = %+v; want 1000 per txn, then 1", s.Drains)
	}
	if len(s.Sustained) != 2 || s.Sustained[0].PerTxn != 100 || s.Sustained[1].PerTxn != 1 {
		t.Fatalf("Summary.Sustained = %+v; want relay at 100 per txn, then 1", s.Sustained)
	}
	d, d1, w := s.Drains[0], s.Drains[1], s.Sustained[0]
	checks := []struct {
		name      string
		got, want float64
	}{
		{"Drains[0].RecvRate", d.RecvRate, 100000},
		{"Drains[0].RelayRate", d.RelayRate, 92000},
		{"Drains[0].Ratio", d.Ratio, 0.92},
		{"Drains[0].RecvMBps", d.RecvMBps, 50},
		{"Drains[0].RecvCPUPerMillion", d.RecvCPUPerMillion, 4},
		{"Drains[0].PeakRSSMedian", float64(d.PeakRSSMedian), 41 << 20},
		{"Drains[0].PeakRSSMax", float64(d.PeakRSSMax), 42 << 20},
		{"Drains[0].CPUPerMillion", d.CPUPerMillion, 8},
		{"Drains[1].Ratio", d1.Ratio, 0.5},
		{"Drains[1].CPUPerMillion", d1.CPUPerMillion, 3},
		{"Sustained[0].Ack.P99", float64(w.Ack.P99), float64(ms(13))},
		{"Sustained[0].AckSpread.Min.P99", float64(w.AckSpread.Min.P99), float64(ms(12))},
		{"Sustained[0].AckSpread.Max.P99", float64(w.AckSpread.Max.P99), float64(ms(14))},
		{"Sustained[0].ReceiptSpread.Max.Max", float64(w.ReceiptSpread.Max.Max), float64(ms(50))},
		{"Sustained[0].CPUPerMillion", w.CPUPerMillion, 7},
		{"Sustained[0].Events", float64(w.Events), 1800000},
	}
	for _, c := range checks {
		if diff := c.got - c.want; diff > 1e-6*c.want || diff < -1e-6*c.want {
			t.Errorf("Summary.%s = %v; want %v", c.name, c.got, c.want)
		}
	}
}

func findTarget(ts []Target, name string) *Target {
	for i := range ts {
		if ts[i].Name == name {
			return &ts[i]
		}
	}
	return nil
}

func TestTargets(t *testing.T) {
	each := func(f func(*DrainRun)) func(*Report) {
		return func(r *Report) {
			for i := range r.Drain {
				f(&r.Drain[i])
			}
		}
	}
	sustained := func(f func(*SustainedRun)) func(*Report) {
		return func(r *Report) {
			for i := range r.Sustained {
				f(&r.Sustained[i])
			}
		}
	}
	tests := []struct {
		name   string
		edit   func(*Report)
		target string
		pass   bool
		note   string // substring of the note; "" means no note
	}{
		{"drain passes", nil, "drain, 1,000 per txn: events/s", true, ""},
		{"drain of one-event txns fails", nil, "drain, 1 per txn: events/s", false, ""},
		{"drain fails", each(func(d *DrainRun) { d.RelaySec = 20 }), "drain, 1,000 per txn: events/s", false, ""},
		{"drain cpu fails above 4 s per million", nil, "drain, 1,000 per txn: CPU", false, ""},
		{"drain cpu passes", nil, "drain, 1 per txn: CPU", true, ""},
		{"rss passes", nil, "relay peak RSS", true, ""},
		{"rss judged on the max run", func(r *Report) { r.Drain[4].PeakRSS = 65 << 20 }, "relay peak RSS", false, ""},
		{"rss of a sustained run counts", func(r *Report) { r.Sustained[0].PeakRSS = 50 << 20 }, "relay peak RSS", false, ""},
		{"latency passes", nil, "100 per txn: commit→ack", true, ""},
		{"latency of one-event txns fails on p99", nil, "1 per txn: commit→ack", false, ""},
		{"latency fails on max", sustained(func(s *SustainedRun) { s.Ack.Max = ms(150) }), "100 per txn: commit→ack", false, ""},
		{"latency fails on p50", sustained(func(s *SustainedRun) { s.Ack.P50 = ms(4) }), "100 per txn: commit→ack", false, ""},
		{"latency notes a lower rate", sustained(func(s *SustainedRun) { s.TargetRate = 8000 }), "1 per txn: commit→ack", false, "8,000 events/s"},
		{"latency notes a producer that fell behind", sustained(func(s *SustainedRun) { s.AchievedRate = 7000 }), "100 per txn: commit→ack", true, "reached only 7,000"},
		{"sustained cpu passes", nil, "100 per txn: CPU", true, ""},
		{"sustained cpu fails above 8 s per million", sustained(func(s *SustainedRun) { s.PhaseCPUSec = 6 }), "100 per txn: CPU", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleReport()
			if tt.edit != nil {
				tt.edit(r)
				r.summarize()
			}
			got := findTarget(r.Targets, tt.target)
			if got == nil {
				t.Fatalf("Targets = %+v; want one named %q", r.Targets, tt.target)
			}
			if got.Pass != tt.pass {
				t.Errorf("Target(%q).Pass = %v (got %q); want %v", tt.target, got.Pass, got.Got, tt.pass)
			}
			if (tt.note == "") != (got.Note == "") || !strings.Contains(got.Note, tt.note) {
				t.Errorf("Target(%q).Note = %q; want it to contain %q", tt.target, got.Note, tt.note)
			}
		})
	}
}

func TestTargets_RelayFailedKeepsRecvlogical(t *testing.T) {
	r := sampleReport()
	r.Sustained = nil
	for i := range r.Drain {
		r.Drain[i] = DrainRun{Run: i/2 + 1, PerTxn: r.Drain[i].PerTxn, Events: 20000, WALBytes: 10e6, RecvSec: 0.2, Err: "relay exited"}
	}
	r.summarize()
	if len(r.Targets) != 0 {
		t.Errorf("Targets = %+v; want none without a relay result", r.Targets)
	}
	if got, want := r.Summary.Drains[0].RecvRate, 100000.0; got != want {
		t.Errorf("Summary.Drains[0].RecvRate = %v; want %v", got, want)
	}
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if want := "| drain 20,000, 1,000 per txn | pg_recvlogical → /dev/null | 100,000 | — | — | 0.00 | — | — |"; !strings.Contains(md.String(), want) {
		t.Errorf("writeMarkdown() = %q; want it to contain %q", md.String(), want)
	}
	assertTables(t, md.String())
}

func TestWriteMarkdown(t *testing.T) {
	r := sampleReport()
	r.Errors = []string{"run 2: a | pipe\nand newline"}
	var b strings.Builder
	if err := r.writeMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"# outbox-relay benchmark, 2026-01-02 03:04 UTC",
		"`outbox-bench -runs 3`",
		"linux/amd64, 2 CPUs, load average 1.50 at the start; go1.26.8; PostgreSQL 15.18; relay outbox-relay v1. Medians of 3 run(s)",
		"| drain 1,000,000, 1,000 per txn | pg_recvlogical → /dev/null | 100,000 | 0.92× | — | 4.00 | — | — |",
		"| drain 1,000,000, 1,000 per txn | **outbox-relay** | **92,000** | 1 | **42.0 MiB** | **8.00** | — | — |",
		"| drain 1,000,000, 1 per txn | pg_recvlogical → /dev/null | 50,000 | 0.50× | — | 6.00 | — | — |",
		"| commit → ack p50 / p99 / max | runs min–max p50 / p99 / max | delivered |",
		// The median run's p99 is 13 ms; the runs' lay from 12 to 14.
		"| 10,000 events/s, 100 per txn | **outbox-relay** | 9,990 | — | 30.0 MiB | 7.00 | 3ms / 13ms / 40ms | 3ms–3ms / 12ms–14ms / 40ms–40ms | 1,800,000 of 1,800,000, 0 duplicates |",
		"| 10,000 events/s, 1 per txn | **outbox-relay** | 9,990 | — | 30.0 MiB | 7.00 | 3ms / 30ms / 40ms |",
		"The producer held 12,000 one-event commits/s on 8 connections",
		"| drain, 1,000 per txn: events/s | ≥ 0.9 × pg_recvlogical | 0.92 × (92,000 vs 100,000) | PASS |",
		"| 100 per txn: commit→ack | p50 ≤ 3ms, p99 ≤ 15ms, max ≤ 100ms at 10,000 events/s | 3ms / 13ms / 40ms at 9,990 events/s | PASS |",
		"![drain: events/s, peak RSS, CPU](drain.svg)",
		"![commit → ack latency by percentile](latency.svg)",
		`- run 2: a \| pipe and newline`,
	} {
		if !strings.Contains(md, want) {
			t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md)
		}
	}
	if strings.Contains(md, "ran at") {
		t.Errorf("writeMarkdown() says the one-event workload ran below -rate; the producer held it:\n%s", md)
	}
	assertTables(t, md)
}

// TestWriteMarkdown_ProducerBelowRate: when the producer cannot hold -rate in
// one-event commits, the report says at which rate that workload ran.
func TestWriteMarkdown_ProducerBelowRate(t *testing.T) {
	r := sampleReport()
	r.Producer.CommitsPerSec = 7890
	b := &bench{o: options{Settings: r.Config}, rep: r}
	if got, by := b.sustainedRate(workload{Per: 1}); got != 7800 || by != "producer" {
		t.Errorf("sustainedRate(1) = %d, %q; want 7800 (the probe's 7,890 commits/s rounded down to 100), producer", got, by)
	}
	if got, _ := b.sustainedRate(workload{Per: 100}); got != 10000 {
		t.Errorf("sustainedRate(100) = %d; want -rate 10,000 (100 commits/s)", got)
	}
	// The high-rate workload: its own rate, lowered like the others to
	// what the producer holds (7,800 commits/s of 100 events).
	if got, _ := b.sustainedRate(workload{Per: 100, Rate: 50000}); got != 50000 {
		t.Errorf("sustainedRate(100 at 50,000/s) = %d; want 50,000 (500 commits/s)", got)
	}
	r.Producer.CommitsPerSec = 420
	if got, _ := b.sustainedRate(workload{Per: 100, Rate: 50000}); got != 40000 {
		t.Errorf("sustainedRate(100 at 50,000/s) with the producer at 420 commits/s = %d; want 40,000", got)
	}
	r.Producer.CommitsPerSec = 7890
	for i := range r.Sustained {
		if r.Sustained[i].PerTxn == 1 {
			r.Sustained[i].TargetRate, r.Sustained[i].RateCap = 7800, "producer"
		}
	}
	r.summarize()
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if want := "below -rate 10,000, so the one-event workload ran at 7,800 events/s"; !strings.Contains(md.String(), want) {
		t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md.String())
	}
}

// TestSustainedRate_EqualRate: with Debezium beside the relay, a -rate
// workload of a transaction size this run drained runs at 80% of the slower
// system's drain rate when that is below the rate, so that both hold it; the
// report says so.
func TestSustainedRate_EqualRate(t *testing.T) {
	r := sampleReport()
	r.Producer.CommitsPerSec = 20000
	o := options{Settings: r.Config}
	o.Peers = []string{"debezium"}
	b := &bench{o: o, rep: r}
	r.Drain = nil
	for run, dbz := range []float64{6000, 5000, 7000} { // Debezium drains one-event transactions at 5,000..7,000/s
		r.Drain = append(r.Drain, DrainRun{Run: run + 1, PerTxn: 1, Events: 60000, RelaySec: 1, Debezium: &PeerDrain{StreamSec: 60000 / dbz}})
	}
	if got, by := b.sustainedRate(workload{Per: 1}); got != 4800 || by != "debezium" {
		t.Errorf("sustainedRate(1) = %d, %q; want 4,800 (80%% of Debezium's median 6,000/s, in 100s of commits), debezium", got, by)
	}
	if got, by := b.sustainedRate(workload{Per: 100}); got != 10000 || by != "" {
		t.Errorf("sustainedRate(100) = %d, %q; want -rate 10,000: no drain of 100-event transactions to judge by", got, by)
	}
	if got, by := b.sustainedRate(workload{Per: 100, Rate: 50000}); got != 50000 || by != "" {
		t.Errorf("sustainedRate(100 at 50,000/s) = %d, %q; want its own rate, never equalised", got, by)
	}
	b.o.Peers = nil
	if got, by := b.sustainedRate(workload{Per: 1}); got != 10000 || by != "" {
		t.Errorf("sustainedRate(1) without Debezium = %d, %q; want -rate 10,000", got, by)
	}
	for i := range r.Sustained {
		if r.Sustained[i].PerTxn == 1 {
			r.Sustained[i].TargetRate, r.Sustained[i].RateCap = 4800, "debezium"
		}
	}
	r.summarize()
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	if want := "The 1-per-transaction workload ran at 4,800 events/s, 80% of what debezium, the slower, drained"; !strings.Contains(md.String(), want) {
		t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md.String())
	}
	if strings.Contains(md.String(), "so the one-event workload ran at") {
		t.Errorf("writeMarkdown() blames the producer for Debezium's rate:\n%s", md.String())
	}
}

// assertTables checks that every markdown table row has as many cells as its
// header, or renderers drop the row.
func assertTables(t *testing.T, md string) {
	t.Helper()
	var cols int
	for _, line := range strings.Split(md, "\n") {
		if !strings.HasPrefix(line, "|") {
			cols = 0
			continue
		}
		n := strings.Count(strings.ReplaceAll(line, `\|`, ""), "|")
		if cols == 0 {
			cols = n
		} else if n != cols {
			t.Errorf("table row %q has %d separators; header has %d", line, n, cols)
		}
	}
}

func TestWriteSummary(t *testing.T) {
	var b strings.Builder
	if err := sampleReport().writeSummary(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PASS drain, 1,000 per txn: events/s", "FAIL 1 per txn: commit→ack",
		"drain 1,000 per txn: pg_recvlogical 100,000, relay 92,000", "sustained 9,990 events/s, 1 per txn, relay"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("writeSummary() = %q; want it to contain %q", b.String(), want)
		}
	}
}

// TestReportJSON: report.json is the source of truth: a report read back from
// it renders the same report.md and plots.
func TestReportJSON(t *testing.T) {
	r := withDebezium(sampleReport())
	h := NewHistogram(100*time.Microsecond, 100*time.Second, 20)
	for i := 1; i <= 1000; i++ {
		h.Add(time.Duration(i) * 10 * time.Microsecond)
	}
	r.AckHists = map[string]*Histogram{workloadKey("relay", 100, 0): h}
	js, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	var want, got strings.Builder
	if err := r.writeMarkdown(&want); err != nil {
		t.Fatal(err)
	}
	if err := back.writeMarkdown(&got); err != nil {
		t.Fatal(err)
	}
	if got.String() != want.String() {
		t.Errorf("report.md from report.json differs:\n%s\nwant:\n%s", got.String(), want.String())
	}
	p1, err := r.plots()
	if err != nil {
		t.Fatal(err)
	}
	p2, err := back.plots()
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range p1 {
		if string(p2[name]) != string(b) {
			t.Errorf("%s from report.json differs", name)
		}
	}
	var fields struct {
		Summary struct {
			Drains []struct {
				Ratio float64 `json:"relay_over_recvlogical"`
			} `json:"drains"`
		} `json:"summary"`
	}
	if err := json.Unmarshal(js, &fields); err != nil || len(fields.Summary.Drains) != 2 || fields.Summary.Drains[0].Ratio != 0.92 {
		t.Errorf("report.json summary.drains = %+v, %v; want the 1,000-per-txn ratio 0.92 first", fields.Summary.Drains, err)
	}
}

// TestPlots checks that each plot is well-formed SVG and drawn only when its
// figures were measured.
func TestPlots(t *testing.T) {
	r := withDebezium(sampleReport())
	h := NewHistogram(100*time.Microsecond, 100*time.Second, 20)
	for i := 1; i <= 1000; i++ {
		h.Add(time.Duration(i) * 10 * time.Microsecond)
	}
	r.AckHists = map[string]*Histogram{workloadKey("relay", 100, 0): h, workloadKey("debezium", 100, 0): h}
	files, err := r.plots()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"drain.svg", "latency.svg"} {
		svg, ok := files[name]
		if !ok {
			t.Errorf("plots() has no %s", name)
			continue
		}
		if err := wellFormed(svg); err != nil {
			t.Errorf("%s is not well-formed: %v", name, err)
		}
		for _, want := range map[string][]string{"drain.svg": {"pg_recvlogical", "outbox-relay", "Debezium", "1,000 per txn"},
			"latency.svg": {"relay, 100 per txn", "debezium, 100 per txn", "p99"}}[name] {
			if !strings.Contains(string(svg), want) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
	}
	if _, ok := files["soak.svg"]; ok {
		t.Error("plots() drew soak.svg without a soak")
	}
	r.Drain, r.AckHists = nil, nil
	r.summarize()
	if files, err = r.plots(); err != nil || len(files) != 0 {
		t.Errorf("plots() of nothing measured = %d files, %v; want none", len(files), err)
	}
}

func wellFormed(svg []byte) error {
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func TestPercentileCurve(t *testing.T) {
	h := NewHistogram(100*time.Microsecond, 100*time.Second, 20)
	for i := 1; i <= 100; i++ {
		h.Add(time.Duration(i) * time.Millisecond) // 1ms … 100ms
	}
	xys := percentileCurve(h)
	if len(xys) == 0 {
		t.Fatal("percentileCurve() is empty")
	}
	for i := 1; i < len(xys); i++ {
		if xys[i].X <= xys[i-1].X || xys[i].Y <= xys[i-1].Y {
			t.Errorf("percentileCurve()[%d] = %v after %v; want both rising", i, xys[i], xys[i-1])
		}
	}
	// The last point is the maximum, at log10(n) nines, its bucket's upper edge.
	last := xys[len(xys)-1]
	if last.X != 2 || last.Y < 100 || last.Y > 100*1.13 {
		t.Errorf("percentileCurve() ends at %v; want (2, 100ms up to one bucket above)", last)
	}
	if got := percentileCurve(nil); got != nil {
		t.Errorf("percentileCurve(nil) = %v; want nil", got)
	}
}

// The high-rate workload (-high-rate) is a workload of its own beside the
// -rate one of the same transaction size: its runs are summarised apart,
// its curve has its own histogram, and the relay is judged on its p99
// (≤ 25 ms) at the rate it was asked for, not on the 10,000/s targets.
func TestSummarize_HighRateWorkload(t *testing.T) {
	r := sampleReport()
	for i, p99 := range []float64{20, 31, 24} {
		r.Sustained = append(r.Sustained, SustainedRun{
			Run: i + 1, Sink: "relay", PerTxn: 100, Rate: 50000, TargetRate: 50000, AchievedRate: 49800, Events: 3000000, Commits: 30000,
			Received: 3000000, PhaseCPUSec: 20, PeakRSS: 45 << 20,
			Ack: Latency{Count: 3000000, P50: ms(2), P99: ms(p99), Max: ms(60)},
		})
	}
	r.summarize()
	s := r.Summary
	if len(s.Sustained) != 3 || s.Sustained[2].Rate != 50000 || s.Sustained[0].Rate != 0 {
		t.Fatalf("Summary.Sustained = %+v; want relay 100, 1, then 100 at 50,000/s", s.Sustained)
	}
	if w := s.Sustained[0]; w.Ack.P99 != ms(13) || w.Events != 1800000 {
		t.Errorf("the 10,000/s workload took the high-rate runs in: p99 %v, events %d; want 13ms, 1,800,000", w.Ack.P99, w.Events)
	}
	if w := s.Sustained[2]; w.Ack.P99 != ms(24) || w.Events != 9000000 || w.Runs != 3 {
		t.Errorf("high-rate summary: p99 %v, events %d, runs %d; want the median 24ms, 9,000,000, 3", w.Ack.P99, w.Events, w.Runs)
	}
	if got := workloadKey("relay", 100, 50000); got == workloadKey("relay", 100, 0) {
		t.Errorf("workloadKey of the high-rate workload = %q, the same as the -rate one's", got)
	}
	var high []Target
	for _, tg := range r.Targets {
		if strings.Contains(tg.Name, "50,000 events/s") {
			high = append(high, tg)
		}
	}
	if len(high) != 1 || !high[0].Pass || !strings.Contains(high[0].Want, "p99 ≤ 25ms") {
		t.Fatalf("high-rate targets = %+v; want one, passing, p99 ≤ 25ms", high)
	}
	// Run below the asked rate (the producer could not hold it): not a pass,
	// however low the p99, and the note says why.
	w := s.Sustained[2]
	w.TargetRate = 30000
	if tg := highRateTarget(w); tg.Pass || !strings.Contains(tg.Note, "run at 30,000 events/s") {
		t.Errorf("highRateTarget at 30,000 of 50,000 events/s = %+v; want a failure noting the rate", tg)
	}
	w.TargetRate, w.Ack.P99 = 50000, ms(26)
	if tg := highRateTarget(w); tg.Pass {
		t.Errorf("highRateTarget with p99 26ms = %+v; want a failure", tg)
	}
}

// -cpuprofile gives every relay process a profile named after its log;
// without it the environment is left as it was.
func TestProfiled(t *testing.T) {
	env := []string{"A=1"}
	b := &bench{}
	if got := b.profiled(env, "/r/relay-sustained-100h50000-run2.log"); len(got) != 1 {
		t.Errorf("profiled without -cpuprofile = %v; want the environment unchanged", got)
	}
	b.o.CPUProfile = true
	got := b.profiled(env, "/r/relay-sustained-100h50000-run2.log")
	if len(got) != 2 || got[1] != "RELAY_CPUPROFILE=/r/relay-sustained-100h50000-run2.cpu" {
		t.Errorf("profiled with -cpuprofile = %v; want RELAY_CPUPROFILE beside the log", got)
	}
}
