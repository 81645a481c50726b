package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// withDebezium adds Debezium drains (10,000 events/s over streaming, 500 MiB,
// 60 CPU-s per million) of the 1,000-event backlog and sustained runs (p50 19
// ms, p99 1.37 s) at 100 events per transaction to sampleReport.
func withDebezium(r *Report) *Report {
	for i := range r.Drain {
		if r.Drain[i].PerTxn != 1000 {
			continue
		}
		r.Drain[i].Debezium = &PeerDrain{Sec: 113, StartSec: 13, StreamSec: 100, CPUSec: 60, StartCPUSec: 8, TotalCPUSec: 70,
			PeakRSS: 500 << 20, Records: 1000000}
	}
	for _, s := range r.Sustained {
		if s.PerTxn == 100 {
			s.Sink = "debezium"
			s.PeakRSS = 600 << 20
			s.Ack = Latency{Count: 600000, P50: ms(19), P95: ms(300), P99: ms(1368), Max: ms(2000)}
			r.Sustained = append(r.Sustained, s)
		}
	}
	r.Debezium = dbzSetup()
	r.summarize()
	return r
}

func TestTargets_Debezium(t *testing.T) {
	r := withDebezium(sampleReport())
	got := findTarget(r.Targets, "100 per txn: commit→ack vs Debezium")
	if got == nil || !got.Pass || got.Got != "3ms / 13ms vs 19ms / 1.37s" {
		t.Errorf("Target(vs Debezium) = %+v; want a PASS with 3ms / 13ms vs 19ms / 1.37s", got)
	}
	if findTarget(r.Targets, "1 per txn: commit→ack vs Debezium") != nil {
		t.Error("Targets compare one-event latency with Debezium, which did not run that workload")
	}
	for i := range r.Sustained {
		if r.Sustained[i].Sink == "debezium" {
			r.Sustained[i].Ack.P50 = ms(5) // relay's 3 ms is more than half
		}
	}
	r.summarize()
	if got := findTarget(r.Targets, "100 per txn: commit→ack vs Debezium"); got == nil || got.Pass {
		t.Errorf("Target(vs Debezium) = %+v; want a FAIL when the relay's p50 is above half of Debezium's", got)
	}
}

func TestDebeziumFailedHasNoRatio(t *testing.T) {
	r := withDebezium(sampleReport())
	for i := range r.Drain {
		if r.Drain[i].Debezium != nil {
			r.Drain[i].Debezium.Err = "debezium exited while draining"
		}
	}
	r.summarize()
	if d := r.Summary.Drains[0]; d.DbzRuns != 0 || d.DbzRatio != 0 {
		t.Errorf("Summary.Drains[0] DbzRuns, DbzRatio = %d, %v; want 0, 0", d.DbzRuns, d.DbzRatio)
	}
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
		"| drain 1,000,000, 1,000 per txn | Debezium 3.1.3.Final | 10,000 (start-up 13.0 s) | 9.20× | 500.0 MiB | 60.00 | — | — |",
		"| 10,000 events/s, 100 per txn | Debezium 3.1.3.Final | 9,990 | — | 600.0 MiB | 7.00 | 19ms / 1.37s / 2s |",
		"Debezium after 15s unmeasured at the rate",
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
	if !strings.Contains(sum.String(), "debezium 10,000 (relay 9.20×)") {
		t.Errorf("writeSummary() = %q; want Debezium's drain and the ratio", sum.String())
	}
}

// TestDbzTuning: the tuning is Options of the harness's runner, recorded in
// the report as it ran, and a run's names never leak into it.
func TestDbzTuning(t *testing.T) {
	s := dbzSetup()
	checks := []struct{ name, got, want string }{
		{"max.batch.size", s.Props["max.batch.size"], "8192"},
		{"max.queue.size", s.Props["max.queue.size"], "65536"},
		{"poll.interval.ms", s.Props["poll.interval.ms"], "10"},
		{"route.topic.replacement", s.Props["transforms.outbox.route.topic.replacement"], "outbox.dbz.${routedByValue}"},
		{"producer.linger.ms", s.WorkerProps["producer.linger.ms"], "5"},
		{"producer.acks", s.WorkerProps["producer.acks"], "all"},
		{"JVM heap", strings.Join(s.JVMFlags, " "), "-Xms64m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("dbzSetup() %s = %q; want %q", c.name, c.got, c.want)
		}
	}
	for k := range s.Props {
		if strings.HasPrefix(k, "database.") || k == "slot.name" || k == "publication.name" {
			t.Errorf("dbzTuning.Props holds %s: names and the password belong to one run", k)
		}
	}
	if dbzTuning.DSN != "" || dbzTuning.Slot != "" {
		t.Error("dbzTuning holds a run's DSN or slot")
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
		{args: nil, check: func(o options) string {
			if fmt.Sprint(o.DrainPerTxn, o.SustainedPerTxn) != "[1000 1] [100 1]" || o.Rate != 10000 || o.Producers != 8 {
				return fmt.Sprintf("DrainPerTxn, SustainedPerTxn, Rate, Producers = %v, %v, %d, %d", o.DrainPerTxn, o.SustainedPerTxn, o.Rate, o.Producers)
			}
			return ""
		}},
		{args: []string{"-per-txn", "500", "-sustained-per-txn", " 10, 1 "}, check: func(o options) string {
			if fmt.Sprint(o.DrainPerTxn, o.SustainedPerTxn) != "[500] [10 1]" {
				return fmt.Sprintf("DrainPerTxn, SustainedPerTxn = %v, %v", o.DrainPerTxn, o.SustainedPerTxn)
			}
			return ""
		}},
		{args: []string{"-per-txn", "1000,0"}, wantErr: `-per-txn: "0" is not a positive number`},
		{args: []string{"-sustained-per-txn", ""}, wantErr: "-sustained-per-txn: give at least one number"},
		{args: []string{"-rate", "50"}, wantErr: "-rate 50 is below -sustained-per-txn 100"},
		{args: nil, check: func(o options) string {
			if o.HighRate != 50000 || o.CPUProfile || o.RelayWarmUp != dbzWarmUp {
				return fmt.Sprintf("HighRate, CPUProfile, RelayWarmUp = %d, %v, %v; want 50000, false, %v (Debezium's)", o.HighRate, o.CPUProfile, o.RelayWarmUp, dbzWarmUp)
			}
			return ""
		}},
		{args: []string{"-quick"}, check: func(o options) string {
			if o.HighRate != 4000 || o.RelayWarmUp != 2*time.Second {
				return fmt.Sprintf("-quick: HighRate, RelayWarmUp = %d, %v; want 4000, 2s", o.HighRate, o.RelayWarmUp)
			}
			return ""
		}},
		{args: []string{"-high-rate", "0", "-cpuprofile"}, check: func(o options) string {
			if o.HighRate != 0 || !o.CPUProfile {
				return fmt.Sprintf("HighRate, CPUProfile = %d, %v; want 0, true", o.HighRate, o.CPUProfile)
			}
			return ""
		}},
		{args: []string{"-quick", "-relay-warm-up", "0"}, check: func(o options) string {
			if o.RelayWarmUp != 0 {
				return fmt.Sprintf("-quick -relay-warm-up 0: RelayWarmUp = %v; want 0 (explicit flags win)", o.RelayWarmUp)
			}
			return ""
		}},
		{args: []string{"-high-rate", "50"}, wantErr: "-high-rate 50 is below its 100 events per transaction"},
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
