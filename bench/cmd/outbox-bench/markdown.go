package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// writeMarkdown renders report.md: the command, the environment, one table of
// every workload and system, the targets. Every figure comes from r; the
// per-run figures are in report.json only.
func (r *Report) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	r.writeHeader(&b)
	r.writeTable(&b)
	if len(r.Targets) > 0 {
		b.WriteString("\n| target | want | got | verdict |\n| --- | --- | --- | --- |\n")
		for _, t := range r.Targets {
			got := t.Got
			if t.Note != "" {
				got += " (" + t.Note + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Name, t.Want, cell(got), verdict(t.Pass))
		}
	}
	r.writeStages(&b)
	r.writeTables(&b)
	if r.Soak != nil {
		r.Soak.writeMarkdown(&b)
	}
	r.writeTrouble(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeHeader writes the title, the command and the environment.
func (r *Report) writeHeader(b *strings.Builder) {
	c, e := r.Config, r.Env
	fmt.Fprintf(b, "# outbox-relay benchmark, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(b, "`%s`\n\n", r.Command)
	fmt.Fprintf(b, "%s, %d CPUs, load average %.2f at the start; %s; %s; relay %s. ", e.Host, e.CPUs, e.Load, e.Go, orDash(e.Postgres), orDash(e.Relay))
	fmt.Fprintf(b, "Medians of %d run(s); every figure and every run is in report.json.\n", c.Runs)
}

// writeTable writes the side-by-side table and links the plots.
func (r *Report) writeTable(b *strings.Builder) {
	s := r.Summary
	if len(s.Drains) == 0 && len(s.Sustained) == 0 {
		return
	}
	c := r.Config
	fmt.Fprintf(b, "\nEvents of ~%d-byte JSON over %d aggregates and %d topics of %d partitions. Drain: a backlog read from a slot of each "+
		"system's own, the relay until every event is in Kafka (acks=all) and its slot confirmed, Debezium from its slot going "+
		"active (start-up apart). Sustained: %s at the rate, commit → Kafka LogAppendTime", c.PayloadBytes, c.Aggregates,
		len(aggregateTypes), topicPartitions, c.Duration)
	if c.RelayWarmUp > 0 {
		fmt.Fprintf(b, ", the relay after %s unmeasured at the rate", fmtDur(c.RelayWarmUp))
	} else {
		b.WriteString(", the relay from its first transaction on (no warm-up)")
	}
	if r.Debezium != nil {
		fmt.Fprintf(b, ", Debezium after %s unmeasured at the rate (JIT warm-up); its CPU and RSS are the whole Kafka Connect JVM's", fmtDur(r.Debezium.WarmUp))
	}
	b.WriteString(".\n\n")
	b.WriteString("| workload | system | events/s | relay ÷ it | peak RSS | CPU s per M events | commit → ack p50 / p99 / max | runs min–max p50 / p99 / max | delivered |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, d := range s.Drains {
		wl := fmt.Sprintf("drain %s, %s per txn", fmtCount(int(d.Events)), fmtCount(d.PerTxn))
		if d.RecvRuns > 0 {
			fmt.Fprintf(b, "| %s | pg_recvlogical → /dev/null | %s | %s | — | %.2f | — | — | — |\n", wl, fmtRate(d.RecvRate), fmtRatio(d.Ratio), d.RecvCPUPerMillion)
		}
		if d.RelayRuns > 0 {
			fmt.Fprintf(b, "| %s | **outbox-relay** | **%s** | 1 | **%s** | **%.2f** | — | — | — |\n", wl, fmtRate(d.RelayRate), fmtMB(d.PeakRSSMax), d.CPUPerMillion)
		}
		if d.EOSRuns > 0 {
			fmt.Fprintf(b, "| %s | outbox-relay, exactly-once | %s | %s | %s | %.2f | — | — | — |\n", wl, fmtRate(d.EOSRate), fmtRatio(inverse(d.EOSRatio)),
				fmtMB(d.EOSPeakRSSMax), d.EOSCPUPerMillion)
		}
		if d.DbzRuns > 0 {
			fmt.Fprintf(b, "| %s | Debezium %s | %s (start-up %.1f s) | %s | %s | %.2f | — | — | — |\n", wl, dbzVersion(r), fmtRate(d.DbzRate),
				d.DbzStartSec, fmtRatio(d.DbzRatio), fmtMB(d.DbzPeakRSSMax), d.DbzCPUPerMillion)
		}
	}
	for _, w := range s.Sustained {
		wl := fmt.Sprintf("%s events/s, %s per txn", fmtCount(w.TargetRate), fmtCount(w.PerTxn))
		name := "**outbox-relay**"
		switch w.Sink {
		case "debezium":
			name = "Debezium " + dbzVersion(r)
		case sinkRelayEOS:
			name = "outbox-relay, exactly-once (read_committed: commit → receipt)"
		}
		if w.Runs == 0 {
			fmt.Fprintf(b, "| %s | %s | failed | — | — | — | — | — | — |\n", wl, name)
			continue
		}
		a := w.Ack
		fmt.Fprintf(b, "| %s | %s | %s | — | %s | %.2f | %s / %s / %s | %s | %s of %s, %s duplicates |\n", wl, name, fmtRate(w.AchievedRate),
			fmtMB(w.PeakRSSMax), w.CPUPerMillion, fmtDur(a.P50), fmtDur(a.P99), fmtDur(a.Max), fmtSpread(w.AckSpread, w.Runs),
			fmtCount(w.Received), fmtCount(w.Events), fmtCount(w.Duplicates))
	}
	if p := r.Producer; p != nil {
		fmt.Fprintf(b, "\nThe producer held %s one-event commits/s on %d connections (%.0f s flat out, no relay running)", fmtRate(p.CommitsPerSec), p.Connections, p.Seconds)
		for _, w := range s.Sustained {
			if w.PerTxn == 1 && w.TargetRate < c.Rate && w.RateCap == "producer" {
				fmt.Fprintf(b, ": below -rate %s, so the one-event workload ran at %s events/s", fmtCount(c.Rate), fmtCount(w.TargetRate))
				break
			}
		}
		b.WriteString(".\n")
	}
	for _, w := range s.Sustained {
		if w.Rate == 0 && w.RateCap != "" && w.RateCap != "producer" {
			fmt.Fprintf(b, "\nThe %s-per-transaction workload ran at %s events/s, %.0f%% of what %s, the slower, drained in such transactions in this run: a rate both hold, so that their latencies compare like for like.\n",
				fmtCount(w.PerTxn), fmtCount(w.TargetRate), heldFraction*100, w.RateCap)
			break
		}
	}
	if len(s.Drains) > 0 {
		b.WriteString("\n![drain: events/s, peak RSS, CPU](drain.svg)\n")
	}
	if len(s.Sustained) > 0 {
		b.WriteString("\n![commit → ack latency by percentile](latency.svg)\n")
	}
}

// writeTrouble lists errors and what was left behind.
func (r *Report) writeTrouble(b *strings.Builder) {
	if len(r.Errors) > 0 {
		b.WriteString("\n## Errors\n\n")
		for _, e := range r.Errors {
			fmt.Fprintf(b, "- %s\n", cell(e))
		}
	}
	if len(r.LeftBehind) > 0 {
		b.WriteString("\n## WARNING: left behind\n\nThe bench created these and could not remove them:\n\n")
		for _, l := range r.LeftBehind {
			fmt.Fprintf(b, "- %s\n", cell(l))
		}
	}
}

// writeSummary prints the few lines a terminal user wants.
func (r *Report) writeSummary(w io.Writer) error {
	var b strings.Builder
	for _, d := range r.Summary.Drains {
		fmt.Fprintf(&b, "drain %s per txn: pg_recvlogical %s, relay %s (%s, %s, %.2f CPU-s/M)", fmtCount(d.PerTxn),
			fmtRate(d.RecvRate), fmtRate(d.RelayRate), fmtRatio(d.Ratio), fmtMB(d.PeakRSSMax), d.CPUPerMillion)
		if d.EOSRuns > 0 {
			fmt.Fprintf(&b, ", relay exactly-once %s (%.2f of at-least-once, %.2f CPU-s/M)", fmtRate(d.EOSRate), d.EOSRatio, d.EOSCPUPerMillion)
		}
		if d.DbzRuns > 0 {
			fmt.Fprintf(&b, ", debezium %s (relay %s)", fmtRate(d.DbzRate), fmtRatio(d.DbzRatio))
		}
		b.WriteString(" events/s\n")
	}
	for _, s := range r.Summary.Sustained {
		fmt.Fprintf(&b, "sustained %s events/s, %s per txn, %s: commit→ack p50 %s p99 %s max %s\n", fmtRate(s.AchievedRate),
			fmtCount(s.PerTxn), s.Sink, fmtDur(s.Ack.P50), fmtDur(s.Ack.P99), fmtDur(s.Ack.Max))
	}
	if r.Soak != nil {
		r.Soak.writeSummary(&b)
	}
	for _, t := range r.Targets {
		note := ""
		if t.Note != "" {
			note = " (" + t.Note + ")"
		}
		fmt.Fprintf(&b, "%s %s: want %s, got %s%s\n", verdict(t.Pass), t.Name, t.Want, t.Got, note)
	}
	for _, e := range r.Errors {
		fmt.Fprintf(&b, "error: %s\n", e)
	}
	for _, l := range r.LeftBehind {
		fmt.Fprintf(&b, "WARNING: left behind: %s\n", l)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func dbzVersion(r *Report) string {
	if r.Debezium == nil {
		return ""
	}
	return r.Debezium.Version
}

func verdict(pass bool) string {
	if pass {
		return "PASS"
	}
	return "FAIL"
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// cell makes a string safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// fmtMB prints bytes as MiB with one decimal, thousands grouped: "1,163.1 MiB".
func fmtMB(b int64) string {
	whole, frac, _ := strings.Cut(fmt.Sprintf("%.1f", float64(b)/(1<<20)), ".")
	n, _ := strconv.Atoi(whole)
	return fmtCount(n) + "." + frac + " MiB"
}

func fmtRate(r float64) string { return fmtCount(int(r + 0.5)) }

func fmtRatio(x float64) string {
	if x == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", x)
}

// fmtCount groups thousands: 1234567 → "1,234,567".
func fmtCount(n int) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtDur prints a latency compactly with about three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Millisecond:
		return trimFloat(float64(d)/float64(time.Microsecond)) + "µs"
	case d < time.Second:
		return trimFloat(float64(d)/float64(time.Millisecond)) + "ms"
	default:
		return trimFloat(d.Seconds()) + "s"
	}
}

// fmtSpread is the runs' lowest and highest p50, p99 and max ("one run"
// when there is nothing to spread).
func fmtSpread(s Spread, runs int) string {
	if runs < 2 {
		return "one run"
	}
	r := func(lo, hi time.Duration) string { return fmtDur(lo) + "–" + fmtDur(hi) }
	return r(s.Min.P50, s.Max.P50) + " / " + r(s.Min.P99, s.Max.P99) + " / " + r(s.Min.Max, s.Max.Max)
}

func trimFloat(f float64) string {
	var s string
	switch {
	case f >= 100:
		s = fmt.Sprintf("%.0f", f)
	case f >= 10:
		s = fmt.Sprintf("%.1f", f)
	default:
		s = fmt.Sprintf("%.2f", f)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// writeTables writes the tables workload's medians: one relay on one slot
// against a relay and a slot per table, over the same backlog.
func (r *Report) writeTables(b *strings.Builder) {
	var ok []TablesRun
	for _, t := range r.Tables {
		if t.Err == "" {
			ok = append(ok, t)
		}
	}
	if len(ok) == 0 {
		return
	}
	med := func(f func(TablesRun) float64) float64 {
		xs := make([]float64, len(ok))
		for i, t := range ok {
			xs[i] = f(t)
		}
		return Median(xs)
	}
	t0 := ok[0]
	fmt.Fprintf(b, "\n%d outbox tables, a backlog of %s events in transactions of %s spread over them (%s of WAL): one relay on one slot "+
		"(`outbox.tables`) against a relay and a slot per table, each side until every event is in Kafka and every slot confirmed; "+
		"median of %d run(s).\n\n", t0.Tables, fmtCount(int(t0.Events)), fmtCount(t0.PerTxn), fmtMB(t0.WALBytes), len(ok))
	b.WriteString("| workload | system | events/s | seconds | relay CPU s | walsender CPU s | CPU s per M events (both) | peak RSS |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	wl := fmt.Sprintf("%d tables, %s events", t0.Tables, fmtCount(int(t0.Events)))
	for _, side := range []struct {
		name string
		get  func(TablesRun) SideRun
	}{
		{"**one relay, one slot**", func(t TablesRun) SideRun { return t.One }},
		{fmt.Sprintf("%d relays, %d slots", t0.Tables, t0.Tables), func(t TablesRun) SideRun { return t.Many }},
	} {
		sec := med(func(t TablesRun) float64 { return side.get(t).Sec })
		cpu := med(func(t TablesRun) float64 { return side.get(t).CPUSec })
		wal := med(func(t TablesRun) float64 { return side.get(t).WalsenderCPUSec })
		rss := med(func(t TablesRun) float64 { return float64(side.get(t).PeakRSS) })
		fmt.Fprintf(b, "| %s | %s | %s | %.1f | %.1f | %.1f | %.2f | %s |\n", wl, side.name,
			fmtRate(perSec(float64(t0.Events), sec)), sec, cpu, wal, (cpu+wal)/(float64(t0.Events)/1e6), fmtMB(int64(rss)))
	}
}

// inverse is 1/x, and 0 (shown as —) for 0.
func inverse(x float64) float64 {
	if x == 0 {
		return 0
	}
	return 1 / x
}
