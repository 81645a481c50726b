package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// withDebezium adds Debezium drains (10,000 events/s over streaming, 500 MiB,
// 60 CPU-s per million) and sustained runs to sampleReport, whose relay drains
// at ~92,000 events/s with ≤ 42 MiB and 8 CPU-s per million.
func withDebezium(r *Report) *Report {
	for i := range r.Drain {
		r.Drain[i].Debezium = &PeerDrain{Sec: 113, StartSec: 13, StreamSec: 100, CPUSec: 60, StartCPUSec: 8, TotalCPUSec: 70,
			PeakRSS: 500 << 20, Records: 1000000}
	}
	for i := range r.Sustained {
		s := r.Sustained[i]
		s.Ack = Latency{Count: 600000, P50: ms(19), P95: ms(300), P99: ms(1368), Max: ms(2000)}
		r.DbzSustained = append(r.DbzSustained, s)
	}
	r.DbzConfig = dbzConfigText()
	r.summarize()
	return r
}

func TestTargets_Debezium(t *testing.T) {
	tests := []struct {
		name   string
		edit   func(*Report)
		target string
		pass   bool
	}{
		{"drain ratio passes", nil, "drain vs Debezium", true}, // 92,000 / 10,000 = 9.2
		{"drain ratio fails below 8", func(r *Report) {
			for i := range r.Drain {
				r.Drain[i].Debezium.StreamSec = 80 // 12,500 events/s: 7.4 ×
			}
		}, "drain vs Debezium", false},
		{"rss passes at 1/10", nil, "peak RSS vs Debezium", true}, // 42 / 500
		{"rss fails above 1/10", func(r *Report) {
			r.Drain[0].Debezium.PeakRSS = 400 << 20
			r.Drain[1].Debezium.PeakRSS = 400 << 20
			r.Drain[2].Debezium.PeakRSS = 400 << 20
		}, "peak RSS vs Debezium", false},
		{"cpu fails above 1/10", nil, "CPU per event vs Debezium", false}, // 8 / 60
		{"cpu passes", func(r *Report) {
			for i := range r.Drain {
				r.Drain[i].Debezium.CPUSec = 90
			}
		}, "CPU per event vs Debezium", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := withDebezium(sampleReport())
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
		})
	}
}

func TestTargets_DebeziumFailedHasNoRatio(t *testing.T) {
	r := withDebezium(sampleReport())
	for i := range r.Drain {
		r.Drain[i].Debezium.Err = "debezium exited while draining"
	}
	r.summarize()
	if got := findTarget(r.Targets, "drain vs Debezium"); got != nil {
		t.Errorf("Targets has %+v; want no Debezium target when Debezium never finished", got)
	}
	if r.Summary.DbzRuns != 0 {
		t.Errorf("Summary.DbzRuns = %d; want 0", r.Summary.DbzRuns)
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

func TestWriteMarkdown_Debezium(t *testing.T) {
	r := withDebezium(sampleReport())
	r.LeftBehind = []string{"database outbox_bench_x_r1: DROP DATABASE outbox_bench_x_r1 WITH (FORCE) (as a superuser)"}
	var b strings.Builder
	if err := r.writeMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	md := b.String()
	for _, want := range []string{
		"## Side by side",
		"| pg_recvlogical → /dev/null | 100,000 | 0.92 × | — |",
		"| **outbox-relay** → Kafka | **92,000** | 1 | **42.0 MiB** | **8.00** | — | **3ms / 13ms / 40ms** |",
		"| Debezium 3.1.3.Final → Kafka | 10,000 (8,850 with start-up) | 9.2 × | 500.0 MiB | 60.00 | 13.0 s | 19ms / 1.37s / 2s |",
		"| drain vs Debezium | ≥ 8 × Debezium's events/s | 9.2 × (92,000 vs 10,000 events/s)",
		"| CPU per event vs Debezium | ≤ 1/10 of Debezium's | 1/7.5 (8.00 vs 60.00 s per million)",
		"### Debezium on the same backlog",
		"| 1 | 13.00 (8.0) | 100.00 | 10,000 | 8.0 | 500.0 MiB | 60.00 | 70.0 | 1,000,000 |  |",
		"### Debezium at the same rate",
		"```properties\n# JVM (Java 17): -Xms64m -Xmx1g",
		"max.batch.size=8192\n",
		"max.queue.size=65536\n",
		"poll.interval.ms=10\n",
		"producer.linger.ms=5\n",
		"snapshot.mode=no_data\n",
		"## WARNING: left behind",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md)
		}
	}
	assertTables(t, md)
	var sum strings.Builder
	if err := r.writeSummary(&sum); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"drain: debezium 10,000 events/s streaming", "PASS drain vs Debezium", "WARNING: left behind: database outbox_bench_x_r1"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("writeSummary() = %q; want it to contain %q", sum.String(), want)
		}
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

func TestDbzConfig(t *testing.T) {
	db := &benchDB{Name: "outbox_bench_x_r1", DSN: "postgres://relay:s3cr%3Dt@127.0.0.1:54329/outbox_bench_x_r1?sslmode=disable"}
	worker, connector, err := dbzConfig(db, []string{"127.0.0.1:19092"}, "slot_a", "pub_a", "/tmp/o.dat", 8083)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct{ name, got, want string }{
		{"bootstrap.servers", worker["bootstrap.servers"], "127.0.0.1:19092"},
		{"listeners", worker["listeners"], "http://127.0.0.1:8083"},
		{"database.password", connector["database.password"], "s3cr=t"},
		{"database.dbname", connector["database.dbname"], "outbox_bench_x_r1"},
		{"slot.name", connector["slot.name"], "slot_a"},
		{"publication.name", connector["publication.name"], "pub_a"},
		{"publication.autocreate.mode", connector["publication.autocreate.mode"], "disabled"},
		{"route.topic.replacement", connector["transforms.outbox.route.topic.replacement"], "outbox.dbz.${routedByValue}"},
		{"value.converter", worker["value.converter"], "org.apache.kafka.connect.storage.StringConverter"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("dbzConfig()[%q] = %q; want %q", c.name, c.got, c.want)
		}
	}
	if strings.Contains(dbzConfigText(), "s3cr") || strings.Contains(dbzConfigText(), "database.password") {
		t.Errorf("dbzConfigText() shows the password:\n%s", dbzConfigText())
	}
	// The shared maps must not have been changed by one run's names.
	if _, ok := dbzConnectorProps["slot.name"]; ok {
		t.Error("dbzConfig() wrote into dbzConnectorProps")
	}
}

func TestParseStatCPU(t *testing.T) {
	// Field 2 holds a space and a parenthesis; utime 150, stime 50 ticks.
	stat := "1234 (java (main)) S 1 1234 1234 0 -1 4194560 100 0 0 0 150 50 0 0 20 0 30 0 12345 1000000 2000"
	got, err := parseStatCPU(stat)
	if err != nil || got != 2*time.Second {
		t.Errorf("parseStatCPU() = %v, %v; want 2s", got, err)
	}
	if _, err := parseStatCPU("1234 (x) S 1 2"); err == nil {
		t.Error("parseStatCPU(short line) = nil error; want one")
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := NewHistogram(100*time.Microsecond, 100*time.Second, 100)
	if got := h.Quantile(99); got != 0 {
		t.Errorf("empty Quantile(99) = %v; want 0", got)
	}
	for i := 1; i <= 1000; i++ {
		h.Add(time.Duration(i) * 10 * time.Microsecond) // 10µs … 10ms
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5 * time.Millisecond}, {99, 9900 * time.Microsecond}, {100, 10 * time.Millisecond}} {
		got := h.Quantile(c.p)
		// An upper bucket edge: at or above the true value, within one bucket (2.3%).
		if got < c.want || float64(got) > float64(c.want)*1.024 {
			t.Errorf("Quantile(%v) = %v; want within [%v, %v×1.024]", c.p, got, c.want, c.want)
		}
	}
}

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
	r.Soak = &SoakResult{TargetRate: 50000, AchievedRate: 49000, CapacityRate: 100000, Duration: 3 * time.Minute, Events: 9e6, Received: 9e6}
	for i := range 3 {
		r.Soak.Minutes = append(r.Soak.Minutes, SoakMinute{Minute: i + 1, Events: 3e6, RSS: 40 << 20, P50: ms(3), P99: ms(12), Max: ms(30)})
	}
	r.Soak.summarize()
	r.summarize()
	var md strings.Builder
	if err := r.writeMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"## Soak", "half of the relay's measured drain, 100,000 events/s", "![soak: RSS and p99 per minute](soak.svg)",
		"| 2 | 3,000,000 | 40.0 MiB | 3ms | 12ms | 30ms |", "| soak RSS flat |", "| soak delivery |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("writeMarkdown() lacks %q; got:\n%s", want, md.String())
		}
	}
	assertTables(t, md.String())
	var svg strings.Builder
	if err := writeSoakSVG(&svg, r.Soak); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseSVG(svg.String()); err != nil {
		t.Errorf("writeSoakSVG() is not well-formed: %v\n%s", err, svg.String())
	}
	if n := strings.Count(svg.String(), "<polyline"); n != 3 {
		t.Errorf("writeSoakSVG() drew %d lines; want 3 (RSS, p50, p99)", n)
	}
}

func TestWriteSVG_ComparisonBars(t *testing.T) {
	r := withDebezium(sampleReport())
	groups := comparisonBars(r)
	if len(groups) != 3 || len(groups[0].Bars) != 3 {
		t.Fatalf("comparisonBars() = %+v; want 3 groups, the first with pg_recvlogical, relay and Debezium", groups)
	}
	var b strings.Builder
	if err := writeSVG(&b, nil, groups); err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseSVG(b.String()); err != nil {
		t.Errorf("writeSVG() is not well-formed: %v", err)
	}
	if !strings.Contains(b.String(), "relay 9.2 ×") {
		t.Errorf("writeSVG() lacks the drain ratio label:\n%s", b.String())
	}
	if got := comparisonBars(sampleReport()); got != nil {
		t.Errorf("comparisonBars() without a peer = %+v; want none", got)
	}
}

func TestParseOptions(t *testing.T) {
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay:relay@127.0.0.1:54329/outbox")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:19092")
	t.Setenv("RELAY_BENCH_CLEANUP_DSN", "")
	tests := []struct {
		args    []string
		wantErr string
		check   func(options) string
	}{
		{args: []string{"-peers", "debezium"}, check: func(o options) string {
			if len(o.Peers) != 1 || o.Peers[0] != "debezium" {
				return fmt.Sprintf("Peers = %v", o.Peers)
			}
			return ""
		}},
		{args: []string{"-peers", "sequin"}, wantErr: `unknown peer "sequin"`},
		{args: []string{"-soak", "30m"}, check: func(o options) string {
			if o.Soak != 30*time.Minute || o.Runs != 1 || o.RateSet {
				return fmt.Sprintf("Soak, Runs, RateSet = %v, %d, %v", o.Soak, o.Runs, o.RateSet)
			}
			return ""
		}},
		{args: []string{"-soak", "30m", "-rate", "40000"}, check: func(o options) string {
			if !o.RateSet || o.Rate != 40000 {
				return fmt.Sprintf("RateSet, Rate = %v, %d", o.RateSet, o.Rate)
			}
			return ""
		}},
		{args: []string{"-soak", "30s"}, wantErr: "at least 1m"},
		{args: []string{"-soak", "5m", "-peers", "debezium"}, wantErr: "leave out -peers"},
		{args: []string{"-cleanup-dsn", "postgres://postgres@10.0.0.1/postgres"}, wantErr: "-cleanup-dsn"},
	}
	for _, tt := range tests {
		o, err := parseOptions(tt.args, io.Discard)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("parseOptions(%q) error = %v; want one containing %q", tt.args, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("parseOptions(%q) error = %v", tt.args, err)
		default:
			if msg := tt.check(o); msg != "" {
				t.Errorf("parseOptions(%q): %s", tt.args, msg)
			}
		}
	}
}

// TestCreatedLeftBehindNothing checks the bookkeeping without servers: with
// nothing recorded there is nothing to look up.
func TestCreatedLeftBehindNothing(t *testing.T) {
	left, err := (&created{}).leftBehind(context.Background(), "postgres://x@127.0.0.1:1/x", nil)
	if err != nil || len(left) != 0 {
		t.Errorf("leftBehind() = %v, %v; want nothing", left, err)
	}
}
