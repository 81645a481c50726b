package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestSoakSamples(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	commits := &commitTimes{t: map[int64]time.Time{
		1: t0.Add(-time.Second), // warm-up: delivered, not timed
		2: t0.Add(10 * time.Second),
		3: t0.Add(70 * time.Second),
	}}
	msg := func(txn, seq int, appended time.Time) kafka.Message {
		return kafka.Message{Value: fmt.Appendf(nil, `{"pad": "", "seq": %d, "txn": %d, "ts_ns": 1}`, seq, txn), Time: appended}
	}
	s := &soakSamples{}
	s.start(t0)
	s.add(msg(1, 0, t0), t0, commits)
	s.add(msg(2, 1, t0.Add(10*time.Second+3*time.Millisecond)), t0, commits)
	s.add(msg(2, 1, t0.Add(10*time.Second+3*time.Millisecond)), t0, commits) // duplicate
	s.add(msg(3, 100000, t0.Add(70*time.Second+9*time.Millisecond)), t0, commits)
	s.add(msg(4, 100001, t0.Add(75*time.Second)), t0, commits) // commit not yet recorded
	s.add(kafka.Message{Value: []byte(`{"x": 1}`)}, t0, commits)
	s.sampleRSS(t0.Add(5*time.Second), 30<<20)
	s.sampleRSS(t0.Add(50*time.Second), 31<<20)
	s.sampleRSS(t0.Add(65*time.Second), 29<<20)
	commits.set(4, t0.Add(74*time.Second))
	s.resolve(commits)
	if s.received != 4 || s.duplicates != 1 || s.unknown != 1 {
		t.Errorf("received, duplicates, unknown = %d, %d, %d; want 4, 1, 1", s.received, s.duplicates, s.unknown)
	}
	m := s.minutes(3)
	if m[0].Events != 1 || m[1].Events != 2 || m[2].Events != 0 {
		t.Errorf("events per minute = %d, %d, %d; want 1, 2, 0", m[0].Events, m[1].Events, m[2].Events)
	}
	if m[0].RSS != 31<<20 || m[1].RSS != 29<<20 {
		t.Errorf("RSS per minute = %d, %d; want the minute's highest sample", m[0].RSS, m[1].RSS)
	}
	if m[1].Max != time.Second {
		t.Errorf("minute 2 max = %v; want 1s (the late commit)", m[1].Max)
	}
}

func TestSoakTargets(t *testing.T) {
	flat := func() *SoakResult {
		r := &SoakResult{TargetRate: 50000, AchievedRate: 50000, Duration: 30 * time.Minute, Events: 90e6, Received: 90e6}
		for i := range 30 {
			r.Minutes = append(r.Minutes, SoakMinute{Minute: i + 1, Events: 3e6, RSS: int64(40+i%2) << 20, P99: ms(10 + float64(i%3))})
		}
		return r
	}
	tests := []struct {
		name   string
		edit   func(*SoakResult)
		target string
		pass   bool
	}{
		{"delivered", nil, "soak delivery", true},
		{"one missing", func(r *SoakResult) { r.Received-- }, "soak delivery", false},
		{"flat rss", nil, "soak RSS flat", true},
		{"rss grows", func(r *SoakResult) {
			for i := range r.Minutes {
				r.Minutes[i].RSS = int64(40+i) << 20 // +1 MiB a minute
			}
		}, "soak RSS flat", false},
		{"no drift", nil, "soak p99 drift", true},
		{"p99 drifts", func(r *SoakResult) {
			for i := 20; i < 30; i++ {
				r.Minutes[i].P99 = ms(40)
			}
		}, "soak p99 drift", false},
		{"small p99 within slack", func(r *SoakResult) {
			for i := range r.Minutes {
				r.Minutes[i].P99 = ms(2)
			}
			for i := 20; i < 30; i++ {
				r.Minutes[i].P99 = ms(5)
			}
		}, "soak p99 drift", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := flat()
			if tt.edit != nil {
				tt.edit(r)
			}
			r.summarize()
			if r.Window != 10 {
				t.Errorf("Window = %d; want 10", r.Window)
			}
			got := findTarget(r.targets(), tt.target)
			if got == nil {
				t.Fatalf("targets() has no %q", tt.target)
			}
			if got.Pass != tt.pass {
				t.Errorf("Target(%q).Pass = %v (got %q); want %v", tt.target, got.Pass, got.Got, tt.pass)
			}
		})
	}
	short := flat()
	short.Minutes = short.Minutes[:4]
	short.summarize()
	if short.Window != 1 {
		t.Errorf("4-minute soak: Window = %d; want 1", short.Window)
	}
}

func TestSoakReport(t *testing.T) {
	r := sampleReport()
	r.Soak = &SoakResult{TargetRate: 50000, PerTxn: 100, AchievedRate: 49000, CapacityRate: 100000, Duration: 3 * time.Minute, Events: 9e6, Received: 9e6}
	for i := range 3 {
		r.Soak.Minutes = append(r.Soak.Minutes, SoakMinute{Minute: i + 1, Events: 3e6, RSS: 40 << 20, P50: ms(3), P99: ms(12), Max: ms(30)})
	}
	r.Soak.summarize()
	r.summarize()
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Soak", "half of its drain measured just before, 100,000 events/s", "![soak: RSS and latency per minute](soak.svg)",
		"| 2 | 3,000,000 | 40.0 MiB | 3ms | 12ms | 30ms |", "| soak RSS flat |", "| soak delivery |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md.String())
		}
	}
	assertTables(t, md.String())
	files, err := r.plots()
	if err != nil {
		t.Fatal(err)
	}
	if err := wellFormed(files["soak.svg"]); err != nil || len(files["soak.svg"]) == 0 {
		t.Errorf("soak.svg: %d bytes, %v; want a well-formed plot", len(files["soak.svg"]), err)
	}
}

// TestSoakWriter: the soak's rows reach report.md and soak.jsonl as the
// minutes pass, under the header, before the soak ends.
func TestSoakWriter(t *testing.T) {
	dir := t.TempDir()
	rep := sampleReport()
	r := &SoakResult{TargetRate: 5000, PerTxn: 100, Duration: 30 * time.Minute}
	w, err := newSoakWriter(dir, rep, r)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := w.add(SoakMinute{Minute: i + 1, Events: 300000, RSS: 40 << 20, P50: ms(2), P99: ms(9), Max: ms(20)}); err != nil {
			t.Fatal(err)
		}
	}
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"`outbox-bench -runs 3`", "## Soak", "30m0s of the relay at 5,000 events/s in transactions of 100",
		"| minute | events | RSS |", "| 1 | 300,000 | 40.0 MiB | 2ms | 9ms | 20ms |\n| 2 | 300,000 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report.md during the soak lacks %q; got:\n%s", want, md)
		}
	}
	assertTables(t, string(md))
	// The soak ends before its last minute's row is due: finish writes it.
	if err := w.finish([]SoakMinute{{Minute: 1}, {Minute: 2}, {Minute: 3, P99: ms(9)}}); err != nil {
		t.Fatal(err)
	}
	js, err := os.ReadFile(filepath.Join(dir, "soak.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(js)), "\n")
	var m SoakMinute
	if len(lines) != 3 || json.Unmarshal([]byte(lines[1]), &m) != nil || m.Minute != 2 || m.P99 != ms(9) {
		t.Errorf("soak.jsonl = %q; want three lines, the second minute 2 with p99 9ms", js)
	}
}
