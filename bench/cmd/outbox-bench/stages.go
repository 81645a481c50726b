package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Stages is where the relay's own clock says a sustained run's commit→ack
// went (RELAY_STAGES: a line per chunk the relay delivered whole, see
// internal/relay/stages.go), per event, for the first event of each chunk:
// the one that waited longest in it. Total is the relay's share of
// commit→ack (Kafka's LogAppendTime comes before the relay's ack, the
// answer's way back after it).
type Stages struct {
	Read   Latency `json:"read"`   // commit (Postgres's clock) → the route stage took its batch from the stream
	Route  Latency `json:"route"`  // → the writer took its chunk (waiting for the writer included)
	Divert Latency `json:"divert"` // → handed to the Kafka sink (retry-table gate, lease check)
	Kafka  Latency `json:"kafka"`  // → every event acknowledged and the chunk finished in order
	Total  Latency `json:"total"`  // commit → acknowledged
	// Runs is each stage's spread over the runs (min and max of their
	// figures), by name: read, route, divert, kafka, total.
	Runs map[string]Spread `json:"runs,omitempty"`
	// Slowest is the chunk of the largest total, split by stage.
	Slowest *StageSplit `json:"slowest,omitempty"`
}

// StageSplit is one chunk's stages.
type StageSplit struct {
	Events int           `json:"events"`
	At     time.Duration `json:"at_ns"` // its commit, after the timed phase began

	Read   time.Duration `json:"read_ns"`
	Route  time.Duration `json:"route_ns"`
	Divert time.Duration `json:"divert_ns"`
	Kafka  time.Duration `json:"kafka_ns"`
	Total  time.Duration `json:"total_ns"`
}

// stagesPath is where a relay whose log is logPath writes its stage trace.
func stagesPath(logPath string) string { return strings.TrimSuffix(logPath, ".log") + ".stages" }

// withStages is env with the relay's stage trace beside its log.
func withStages(env []string, logPath string) []string {
	return append(env, "RELAY_STAGES="+stagesPath(logPath))
}

// readStages reads a stage trace, counting the chunks committed from from on
// (the timed phase), each event of a chunk once. It returns nil, and no
// error, for a relay that wrote none (an older binary).
func readStages(path string, from time.Time) (*Stages, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var read, route, divert, kafka, total []time.Duration
	var slowest *StageSplit
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		sp, commit, err := parseStageLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if commit.Before(from) {
			continue
		}
		sp.At = commit.Sub(from)
		for range sp.Events {
			read, route, divert = append(read, sp.Read), append(route, sp.Route), append(divert, sp.Divert)
			kafka, total = append(kafka, sp.Kafka), append(total, sp.Total)
		}
		if slowest == nil || sp.Total > slowest.Total {
			slowest = &sp
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(total) == 0 {
		return nil, nil
	}
	return &Stages{Read: Summarize(read), Route: Summarize(route), Divert: Summarize(divert),
		Kafka: Summarize(kafka), Total: Summarize(total), Slowest: slowest}, nil
}

// parseStageLine parses "events commit read took sent acked" (Unix ns).
func parseStageLine(line string) (StageSplit, time.Time, error) {
	fields := strings.Fields(line)
	if len(fields) != 6 {
		return StageSplit{}, time.Time{}, fmt.Errorf("%q: want 6 fields (events commit read took sent acked)", line)
	}
	var v [6]int64
	for i, s := range fields {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return StageSplit{}, time.Time{}, fmt.Errorf("%q: field %d: %w", line, i+1, err)
		}
		v[i] = n
	}
	d := func(a, b int) time.Duration { return max(time.Duration(v[b]-v[a]), 0) }
	return StageSplit{Events: int(v[0]), Read: d(1, 2), Route: d(2, 3), Divert: d(3, 4), Kafka: d(4, 5), Total: d(1, 5)},
		time.Unix(0, v[1]), nil
}

// medianStages is the median of each stage's figures over the runs that
// have them, and the slowest chunk of all.
func medianStages(runs []*Stages) *Stages {
	var read, route, divert, kafka, total []Latency
	var slowest *StageSplit
	for _, s := range runs {
		if s == nil {
			continue
		}
		read, route, divert = append(read, s.Read), append(route, s.Route), append(divert, s.Divert)
		kafka, total = append(kafka, s.Kafka), append(total, s.Total)
		if s.Slowest != nil && (slowest == nil || s.Slowest.Total > slowest.Total) {
			slowest = s.Slowest
		}
	}
	if len(total) == 0 {
		return nil
	}
	return &Stages{Read: MedianLatency(read), Route: MedianLatency(route), Divert: MedianLatency(divert),
		Kafka: MedianLatency(kafka), Total: MedianLatency(total), Slowest: slowest,
		Runs: map[string]Spread{"read": SpreadOf(read), "route": SpreadOf(route), "divert": SpreadOf(divert),
			"kafka": SpreadOf(kafka), "total": SpreadOf(total)}}
}

// writeStages writes, for each relay workload with a stage trace, where its
// commit→ack went.
func (r *Report) writeStages(b *strings.Builder) {
	first := true
	for _, s := range r.Summary.Sustained {
		st := s.Stages
		if st == nil {
			continue
		}
		if first {
			b.WriteString("\nWhere the relay's commit→ack went, by its own clock (`RELAY_STAGES`), for the first event of each chunk " +
				"(medians of the runs; the slowest chunk of all runs): read is commit → taken from the stream by the route stage, " +
				"route → taken by the writer, divert → handed to the Kafka sink, kafka → acknowledged and finished in order.\n\n" +
				"| workload | stage | p50 | p99 | max | runs min–max p50 / p99 / max |\n| --- | --- | --- | --- | --- | --- |\n")
			first = false
		}
		wl := fmt.Sprintf("%s, %s per txn at %s events/s", s.Sink, fmtCount(s.PerTxn), fmtCount(s.TargetRate))
		for _, row := range []struct {
			name, key string
			l         Latency
		}{{"read", "read", st.Read}, {"route", "route", st.Route}, {"divert", "divert", st.Divert}, {"kafka", "kafka", st.Kafka}, {"**total**", "total", st.Total}} {
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s |\n", wl, row.name, fmtDur(row.l.P50), fmtDur(row.l.P99), fmtDur(row.l.Max), fmtSpread(st.Runs[row.key], s.Runs))
		}
		if w := st.Slowest; w != nil {
			fmt.Fprintf(b, "| %s | slowest chunk (%s events, committed %s into the phase) | read %s, route %s, divert %s, kafka %s | | %s | |\n", wl, fmtCount(w.Events),
				fmtDur(w.At), fmtDur(w.Read), fmtDur(w.Route), fmtDur(w.Divert), fmtDur(w.Kafka), fmtDur(w.Total))
		}
	}
}
