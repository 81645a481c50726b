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

// sampleReport is a finished three-run report: the relay drains at 0.8, 0.95
// and 0.92 of pg_recvlogical and holds p99 under 20ms at 10k events/s.
func sampleReport() *Report {
	r := &Report{
		Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Host:    "linux/amd64, 2 CPUs",
		Config:  Settings{Events: 1000000, PayloadBytes: 300, PerTxn: 1000, Aggregates: 1000, Rate: 10000, Duration: time.Minute, SustainedPerTxn: 100, Runs: 3},
	}
	for i, ratio := range []float64{0.8, 0.95, 0.92} {
		r.Drain = append(r.Drain, DrainRun{
			Run: i + 1, Events: 1000000, WALBytes: 500e6,
			RecvSec: 10, RelaySec: 10 / ratio, RelayKafkaSec: 10/ratio - 0.1, RelayConfirmedSec: 10 / ratio,
			RelayCPUSec: 8, PeakRSS: int64(40+i) << 20, KafkaRecords: 1000000,
		})
		r.Sustained = append(r.Sustained, SustainedRun{
			Run: i + 1, TargetRate: 10000, AchievedRate: 9990, Events: 600000, Received: 600000,
			Ack:     Latency{Count: 600000, P50: ms(3), P95: ms(8), P99: ms(12 + float64(i)), Max: ms(40)},
			Receipt: Latency{Count: 600000, P50: ms(5), P95: ms(11), P99: ms(16), Max: ms(50)},
		})
	}
	r.summarize()
	return r
}

func TestSummarize_Medians(t *testing.T) {
	s := sampleReport().Summary
	checks := []struct {
		name      string
		got, want float64
	}{
		{"RecvRate", s.RecvRate, 100000},
		{"RelayRate", s.RelayRate, 92000},
		{"Ratio", s.Ratio, 0.92},
		{"RecvMBps", s.RecvMBps, 50},
		{"PeakRSSMedian", float64(s.PeakRSSMedian), 41 << 20},
		{"PeakRSSMax", float64(s.PeakRSSMax), 42 << 20},
		{"CPUPerMillion", s.CPUPerMillion, 8},
		{"Ack.P99", float64(s.Ack.P99), float64(ms(13))},
	}
	for _, c := range checks {
		if diff := c.got - c.want; diff > 1e-6*c.want || diff < -1e-6*c.want {
			t.Errorf("Summary.%s = %v; want %v", c.name, c.got, c.want)
		}
	}
}

func TestTargets(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*Report)
		target string
		pass   bool
		note   string // substring of the note; "" means no note
	}{
		{"drain passes", nil, "drain throughput", true, ""},
		{"drain fails", func(r *Report) {
			for i := range r.Drain {
				r.Drain[i].RelaySec = 20
			}
		}, "drain throughput", false, ""},
		{"rss passes at 1M", nil, "drain peak RSS", true, ""},
		{"rss judged on the max run", func(r *Report) { r.Drain[2].PeakRSS = 65 << 20 }, "drain peak RSS", false, ""},
		{"rss notes fewer events", func(r *Report) {
			for i := range r.Drain {
				r.Drain[i].Events = 20000
			}
		}, "drain peak RSS", true, "20,000 events"},
		{"cpu fails above 3.5 s per million", nil, "drain CPU", false, ""},
		{"cpu passes", func(r *Report) {
			for i := range r.Drain {
				r.Drain[i].RelayCPUSec = 3.5
			}
		}, "drain CPU", true, ""},
		{"max passes", nil, "commit→ack max", true, ""},
		{"max fails", func(r *Report) {
			for i := range r.Sustained {
				r.Sustained[i].Ack.Max = ms(150)
			}
		}, "commit→ack max", false, ""},
		{"p99 passes", nil, "commit→ack p99", true, ""},
		{"p99 fails", func(r *Report) {
			for i := range r.Sustained {
				r.Sustained[i].Ack.P99 = ms(25)
			}
		}, "commit→ack p99", false, ""},
		{"p99 notes a lower rate", func(r *Report) { r.Config.Rate = 2000 }, "commit→ack p99", true, "2,000 events/s"},
		{"p99 notes a producer that fell behind", func(r *Report) {
			for i := range r.Sustained {
				r.Sustained[i].AchievedRate = 7000
			}
		}, "commit→ack p99", true, "reached only 7,000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := sampleReport()
			if tt.edit != nil {
				tt.edit(r)
				r.summarize()
			}
			var got *Target
			for i := range r.Targets {
				if r.Targets[i].Name == tt.target {
					got = &r.Targets[i]
				}
			}
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
		r.Drain[i] = DrainRun{Run: i + 1, Events: 20000, WALBytes: 10e6, RecvSec: 0.2, Err: "relay exited"}
	}
	r.summarize()
	if len(r.Targets) != 0 {
		t.Errorf("Targets = %+v; want none without a relay result", r.Targets)
	}
	if got, want := r.Summary.RecvRate, 100000.0; got != want {
		t.Errorf("Summary.RecvRate = %v; want %v", got, want)
	}
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| pg_recvlogical (one slot's ceiling) | 3 | 100,000 | 50.0 |", "relay exited"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("writeMarkdown() = %q; want it to contain %q", md.String(), want)
		}
	}
}

func TestWriteMarkdown(t *testing.T) {
	r := sampleReport()
	r.Drain[1].Err = "a | pipe\nand newline"
	r.Errors = []string{"run 2: boom"}
	var b strings.Builder
	if err := r.writeMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"# outbox-relay benchmark, 2026-01-02 03:04:05 UTC",
		"| drain throughput | ≥ 0.9 × pg_recvlogical | 0.92 × (92,000 vs 100,000 events/s) | PASS |",
		"| drain peak RSS | ≤ 48 MiB draining 1,000,000 events | 42.0 MiB max (41.0 MiB median) | PASS |",
		"| drain CPU | ≤ 3.5 s per million events | 8.00 s per million events | FAIL |",
		"| commit→ack max | ≤ 100ms at 10,000 events/s | 40ms at 9,990 events/s | PASS |",
		"| commit→ack p99 | ≤ 20ms at 10,000 events/s | 13ms at 9,990 events/s | PASS |",
		"| pg_recvlogical (one slot's ceiling) | 3 | 100,000 | 50.0 |",
		"| commit → Kafka ack | 3ms | 8ms | 13ms | 40ms |",
		"| commit → consumer | 5ms | 11ms | 16ms | 50ms |",
		"![latency histogram](latency.svg)",
		`a \| pipe and newline |`,
		"- run 2: boom",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md)
		}
	}
	// Every table row must have as many cells as its header, or markdown
	// renderers drop the row.
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
	r := sampleReport()
	r.Sustained[0].Ack.P99, r.Sustained[1].Ack.P99, r.Sustained[2].Ack.P99 = ms(30), ms(30), ms(30)
	r.summarize()
	var b strings.Builder
	if err := r.writeSummary(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PASS drain throughput", "FAIL commit→ack p99", "relay 92,000 events/s", "pg_recvlogical 100,000 events/s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("writeSummary() = %q; want it to contain %q", b.String(), want)
		}
	}
}

func TestReportJSON(t *testing.T) {
	js, err := json.Marshal(sampleReport())
	if err != nil {
		t.Fatal(err)
	}
	var back struct {
		Summary struct {
			Ratio float64 `json:"ratio"`
			Ack   struct {
				P99 int64 `json:"p99_ns"`
			} `json:"commit_to_ack"`
		} `json:"summary"`
		Targets []Target `json:"targets"`
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if back.Summary.Ratio != 0.92 || back.Summary.Ack.P99 != int64(ms(13)) || len(back.Targets) != 5 {
		t.Errorf("results.json round trip = %+v; want ratio 0.92, ack p99 13ms, 5 targets", back)
	}
}

func TestWriteSVG(t *testing.T) {
	full := NewHistogram(100*time.Microsecond, 100*time.Second, 10)
	var samples []time.Duration
	for i := 1; i <= 1000; i++ {
		d := time.Duration(i) * 20 * time.Microsecond // 20µs … 20ms
		samples = append(samples, d)
		full.Add(d)
	}
	tests := []struct {
		name     string
		panels   []histPanel
		wantBars int
	}{
		{"data", []histPanel{{Title: `commit → ack <&>`, Hist: full, Lat: Summarize(samples)}}, nonEmpty(full)},
		{"empty", []histPanel{{Title: "empty", Hist: NewHistogram(100*time.Microsecond, time.Second, 10)}}, 0},
		{"two panels", []histPanel{{Title: "a", Hist: full, Lat: Summarize(samples)}, {Title: "b", Hist: full, Lat: Summarize(samples)}}, 2 * nonEmpty(full)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			if err := writeSVG(&b, tt.panels, nil); err != nil {
				t.Fatal(err)
			}
			bars, colors, err := parseSVG(b.String())
			if err != nil {
				t.Fatalf("writeSVG() is not well-formed XML: %v\n%s", err, b.String())
			}
			if bars != tt.wantBars {
				t.Errorf("writeSVG() drew %d bars; want %d", bars, tt.wantBars)
			}
			if tt.wantBars > 0 && len(colors) < 3 {
				t.Errorf("writeSVG() used bar colours %v; want the percentile bands (at least 3)", colors)
			}
		})
	}
}

func nonEmpty(h *Histogram) int {
	n := 0
	for _, c := range h.Counts {
		if c > 0 {
			n++
		}
	}
	return n
}

// parseSVG decodes the document strictly and counts histogram bars (rects
// with a <title> tooltip) and their fill colours.
func parseSVG(s string) (bars int, colors map[string]bool, err error) {
	dec := xml.NewDecoder(strings.NewReader(s))
	colors = map[string]bool{}
	var root bool
	var fill string
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			if !root {
				return 0, nil, errors.New("no <svg> root")
			}
			return bars, colors, nil
		}
		if err != nil {
			return 0, nil, err
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		switch se.Name.Local {
		case "svg":
			root = se.Name.Space == "http://www.w3.org/2000/svg"
		case "rect":
			fill = ""
			for _, a := range se.Attr {
				if a.Name.Local == "fill" {
					fill = a.Value
				}
			}
		case "title":
			bars++
			colors[fill] = true
		}
	}
}
