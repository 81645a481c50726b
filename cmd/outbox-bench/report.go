package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Targets of issues #6 and #15. They are printed as PASS/FAIL by the bench,
// never asserted by unit tests: a shared two-core machine is not a test oracle.
const (
	targetDrainRatio    = 0.9
	targetCPUPerMillion = 3.5 // CPU seconds per million events drained
	targetP99           = 20 * time.Millisecond
	targetMax           = 100 * time.Millisecond
	targetP99Rate       = 10000
	targetRSS           = 48 << 20
	targetRSSEvents     = 1000000

	// Against Debezium (-peers debezium), on the same backlog and machine.
	targetDbzDrainRatio = 8.0 // ≥ 8 × Debezium's events/s
	targetDbzRSSRatio   = 0.1 // ≤ 1/10 of Debezium's peak RSS
	targetDbzCPURatio   = 0.1 // ≤ 1/10 of Debezium's CPU per event
)

// Report is everything one bench invocation measured; results.json is its
// JSON encoding and report.md its rendering.
type Report struct {
	Started   time.Time      `json:"started"`
	Host      string         `json:"host"`
	Config    Settings       `json:"config"`
	Drain     []DrainRun     `json:"drain,omitempty"`
	Sustained []SustainedRun `json:"sustained,omitempty"`
	// Debezium's sustained runs (-peers debezium), same rate and duration.
	DbzSustained []SustainedRun `json:"debezium_sustained,omitempty"`
	// DbzConfig is Debezium's tuned configuration as run (no names or password).
	DbzConfig string      `json:"debezium_config,omitempty"`
	Soak      *SoakResult `json:"soak,omitempty"`
	Summary   Summary     `json:"summary"`
	Targets   []Target    `json:"targets"`
	Errors    []string    `json:"errors,omitempty"`
	// LeftBehind lists what the bench created and could not remove.
	LeftBehind []string `json:"left_behind,omitempty"`
	// Histograms of commit→ack and commit→receipt over all sustained runs.
	AckHist        *Histogram `json:"ack_histogram,omitempty"`
	ReceiptHist    *Histogram `json:"receipt_histogram,omitempty"`
	DbzAckHist     *Histogram `json:"debezium_ack_histogram,omitempty"`
	DbzReceiptHist *Histogram `json:"debezium_receipt_histogram,omitempty"`
}

// Settings are the flags a report was produced with.
type Settings struct {
	Events          int           `json:"events"`
	PayloadBytes    int           `json:"payload_bytes"`
	PerTxn          int           `json:"per_txn"`
	Aggregates      int           `json:"aggregates"`
	Rate            int           `json:"rate"`
	Duration        time.Duration `json:"duration_ns"`
	SustainedPerTxn int           `json:"sustained_per_txn"`
	Runs            int           `json:"runs"`
	Quick           bool          `json:"quick"`
	SkipDrain       bool          `json:"skip_drain"`
	SkipSustained   bool          `json:"skip_sustained"`
	Peers           []string      `json:"peers,omitempty"`
	Soak            time.Duration `json:"soak_ns,omitempty"`
}

// DrainRun is one backlog drain: pg_recvlogical and the relay on the same WAL.
type DrainRun struct {
	Run          int     `json:"run"`
	Events       int64   `json:"events"`
	PayloadBytes int64   `json:"payload_bytes"`
	WALBytes     int64   `json:"wal_bytes"`
	InsertSec    float64 `json:"insert_seconds"`
	RecvFirst    bool    `json:"recvlogical_first"`

	RecvSec    float64 `json:"recvlogical_seconds"`
	RecvCPUSec float64 `json:"recvlogical_cpu_seconds"`

	RelaySec          float64 `json:"relay_seconds"`           // until in Kafka AND confirmed
	RelayKafkaSec     float64 `json:"relay_kafka_seconds"`     // until Kafka end offsets reached Events
	RelayConfirmedSec float64 `json:"relay_confirmed_seconds"` // until the slot confirmed the last commit
	RelayCPUSec       float64 `json:"relay_cpu_seconds"`
	PeakRSS           int64   `json:"relay_peak_rss_bytes"` // VmHWM before SIGTERM
	MaxRSS            int64   `json:"relay_maxrss_bytes"`   // rusage, includes shutdown
	KafkaRecords      int64   `json:"kafka_records"`        // more than Events means duplicates
	Err               string  `json:"error,omitempty"`

	Debezium *PeerDrain `json:"debezium,omitempty"`
}

// PeerDrain is Debezium's drain of the same backlog from its own slot. Its
// clock starts when the JVM is launched; StartSec is the part until its slot
// was active, StreamSec the rest, until every event was in its topics. CPU and
// RSS are the whole JVM's: the Kafka Connect worker's own cost is included, as
// it is in any Debezium deployment.
type PeerDrain struct {
	Sec         float64 `json:"seconds"`           // JVM launch → all events in Kafka
	StartSec    float64 `json:"start_up_seconds"`  // JVM launch → slot active
	StreamSec   float64 `json:"streaming_seconds"` // slot active → all events in Kafka
	CPUSec      float64 `json:"cpu_seconds"`       // while streaming
	StartCPUSec float64 `json:"start_up_cpu_seconds"`
	TotalCPUSec float64 `json:"total_cpu_seconds"` // launch to exit, shutdown included
	PeakRSS     int64   `json:"peak_rss_bytes"`    // VmHWM when drained
	Records     int64   `json:"kafka_records"`
	Err         string  `json:"error,omitempty"`
}

// DbzRate is Debezium's events/s over its streaming time; zero when it did
// not finish.
func (d DrainRun) DbzRate() float64 {
	if d.Debezium == nil || d.Debezium.Err != "" {
		return 0
	}
	return perSec(float64(d.Events), d.Debezium.StreamSec)
}

// DbzRateWithStart is Debezium's events/s from JVM launch.
func (d DrainRun) DbzRateWithStart() float64 {
	if d.Debezium == nil || d.Debezium.Err != "" {
		return 0
	}
	return perSec(float64(d.Events), d.Debezium.Sec)
}

// DbzCPUPerMillion is Debezium's CPU seconds per million events while streaming.
func (d DrainRun) DbzCPUPerMillion() float64 {
	if d.Debezium == nil || d.Events == 0 {
		return 0
	}
	return d.Debezium.CPUSec / float64(d.Events) * 1e6
}

// Rates derived from a DrainRun; zero when the side did not finish.
func (d DrainRun) RecvRate() float64  { return perSec(float64(d.Events), d.RecvSec) }
func (d DrainRun) RelayRate() float64 { return perSec(float64(d.Events), d.RelaySec) }
func (d DrainRun) RecvMBps() float64  { return perSec(float64(d.WALBytes)/1e6, d.RecvSec) }
func (d DrainRun) RelayMBps() float64 { return perSec(float64(d.WALBytes)/1e6, d.RelaySec) }

// Ratio is relay events/s over pg_recvlogical events/s in the same run.
func (d DrainRun) Ratio() float64 {
	if d.RecvRate() == 0 {
		return 0
	}
	return d.RelayRate() / d.RecvRate()
}

// CPUPerMillion is the relay's CPU seconds per million events.
func (d DrainRun) CPUPerMillion() float64 {
	if d.Events == 0 {
		return 0
	}
	return d.RelayCPUSec / float64(d.Events) * 1e6
}

func perSec(x, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return x / sec
}

// SustainedRun is one fixed-rate run.
type SustainedRun struct {
	Run          int     `json:"run"`
	TargetRate   int     `json:"target_rate"`
	AchievedRate float64 `json:"achieved_rate"`
	Events       int     `json:"events"`
	Received     int     `json:"received"`   // distinct events
	Duplicates   int     `json:"duplicates"` // further deliveries of received events
	Unknown      int     `json:"unknown"`    // records that are not the producer's events
	Early        int     `json:"early"`      // reached the consumer before the producer saw COMMIT return
	Ack          Latency `json:"commit_to_ack"`
	Receipt      Latency `json:"commit_to_receipt"`
	PeakRSS      int64   `json:"relay_peak_rss_bytes"`
	RelayCPUSec  float64 `json:"relay_cpu_seconds"`
	PhaseCPUSec  float64 `json:"phase_cpu_seconds"` // during the timed phase only
	Err          string  `json:"error,omitempty"`
}

// Summary holds the medians over the runs that finished.
type Summary struct {
	Runs              int     `json:"drain_runs"` // runs where both sides finished
	RecvRuns          int     `json:"recvlogical_runs"`
	RelayRuns         int     `json:"relay_runs"`
	Events            int64   `json:"events"`
	RecvRate          float64 `json:"recvlogical_events_per_s"`
	RecvMBps          float64 `json:"recvlogical_wal_mb_per_s"`
	RelayRate         float64 `json:"relay_events_per_s"`
	RelayMBps         float64 `json:"relay_wal_mb_per_s"`
	Ratio             float64 `json:"ratio"`
	PeakRSSMedian     int64   `json:"relay_peak_rss_median_bytes"`
	PeakRSSMax        int64   `json:"relay_peak_rss_max_bytes"`
	CPUPerMillion     float64 `json:"relay_cpu_seconds_per_million"`
	SustainedRuns     int     `json:"sustained_runs"`
	SustainedRate     float64 `json:"sustained_achieved_rate"`
	Ack               Latency `json:"commit_to_ack"`
	Receipt           Latency `json:"commit_to_receipt"`
	SustainedPeakRSS  int64   `json:"sustained_relay_peak_rss_max_bytes"`
	RecvCPUPerMillion float64 `json:"recvlogical_cpu_seconds_per_million"`

	// Debezium (-peers debezium): medians over the runs it finished.
	DbzRuns          int     `json:"debezium_runs"`
	DbzRate          float64 `json:"debezium_events_per_s"`            // over streaming time
	DbzRateWithStart float64 `json:"debezium_events_per_s_with_start"` // from JVM launch
	DbzStartSec      float64 `json:"debezium_start_up_seconds"`
	DbzPeakRSSMax    int64   `json:"debezium_peak_rss_max_bytes"`
	DbzCPUPerMillion float64 `json:"debezium_cpu_seconds_per_million"`
	DbzRatio         float64 `json:"relay_over_debezium_events_per_s"` // median of per-run ratios
	DbzRSSRatio      float64 `json:"relay_over_debezium_peak_rss"`
	DbzCPURatio      float64 `json:"relay_over_debezium_cpu_per_event"`
	DbzSustainedRuns int     `json:"debezium_sustained_runs"`
	DbzSustainedRate float64 `json:"debezium_sustained_achieved_rate"`
	DbzAck           Latency `json:"debezium_commit_to_ack"`
	DbzReceipt       Latency `json:"debezium_commit_to_receipt"`
	DbzSustainedRSS  int64   `json:"debezium_sustained_peak_rss_max_bytes"`
}

// Target is one of the goals with its verdict.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	Pass bool   `json:"pass"`
	Note string `json:"note,omitempty"`
}

// summarize fills Summary and Targets from the runs. Rates and latencies are
// medians over runs; peak RSS is also given as the maximum, and the RSS target
// is judged on the maximum because a memory bound must hold in every run.
func (r *Report) summarize() {
	var s Summary
	var recv, relay, recvMB, relayMB, ratio, rss, cpu, recvCPU []float64
	var dbz, dbzWith, dbzStart, dbzCPU, dbzRatio []float64
	// Each side counts in every run it finished, so the pg_recvlogical half is
	// reported even while the relay fails; the ratio only over runs with both.
	for _, d := range r.Drain {
		if d.RecvSec > 0 {
			s.RecvRuns++
			s.Events = d.Events
			recv = append(recv, d.RecvRate())
			recvMB = append(recvMB, d.RecvMBps())
			recvCPU = append(recvCPU, d.RecvCPUSec/float64(d.Events)*1e6)
		}
		if d.DbzRate() > 0 {
			s.DbzRuns++
			dbz = append(dbz, d.DbzRate())
			dbzWith = append(dbzWith, d.DbzRateWithStart())
			dbzStart = append(dbzStart, d.Debezium.StartSec)
			dbzCPU = append(dbzCPU, d.DbzCPUPerMillion())
			s.DbzPeakRSSMax = max(s.DbzPeakRSSMax, d.Debezium.PeakRSS)
			if d.RelaySec > 0 {
				dbzRatio = append(dbzRatio, d.RelayRate()/d.DbzRate())
			}
		}
		if d.RelaySec == 0 {
			continue
		}
		s.RelayRuns++
		s.Events = d.Events
		relay = append(relay, d.RelayRate())
		relayMB = append(relayMB, d.RelayMBps())
		rss = append(rss, float64(d.PeakRSS))
		cpu = append(cpu, d.CPUPerMillion())
		s.PeakRSSMax = max(s.PeakRSSMax, d.PeakRSS)
		if d.RecvSec > 0 {
			s.Runs++
			ratio = append(ratio, d.Ratio())
		}
	}
	s.RecvRate, s.RelayRate = Median(recv), Median(relay)
	s.RecvMBps, s.RelayMBps = Median(recvMB), Median(relayMB)
	s.Ratio, s.PeakRSSMedian, s.CPUPerMillion = Median(ratio), int64(Median(rss)), Median(cpu)
	s.RecvCPUPerMillion = Median(recvCPU)
	s.DbzRate, s.DbzRateWithStart, s.DbzStartSec, s.DbzCPUPerMillion = Median(dbz), Median(dbzWith), Median(dbzStart), Median(dbzCPU)
	s.DbzRatio = Median(dbzRatio)
	if s.DbzPeakRSSMax > 0 && s.PeakRSSMax > 0 {
		s.DbzRSSRatio = float64(s.PeakRSSMax) / float64(s.DbzPeakRSSMax)
	}
	if s.DbzCPUPerMillion > 0 && s.CPUPerMillion > 0 {
		s.DbzCPURatio = s.CPUPerMillion / s.DbzCPUPerMillion
	}

	var acks, receipts []Latency
	var rates []float64
	for _, sr := range r.Sustained {
		if sr.Err != "" {
			continue
		}
		s.SustainedRuns++
		acks = append(acks, sr.Ack)
		receipts = append(receipts, sr.Receipt)
		rates = append(rates, sr.AchievedRate)
		s.SustainedPeakRSS = max(s.SustainedPeakRSS, sr.PeakRSS)
	}
	s.Ack, s.Receipt, s.SustainedRate = MedianLatency(acks), MedianLatency(receipts), Median(rates)
	acks, receipts, rates = nil, nil, nil
	for _, sr := range r.DbzSustained {
		if sr.Err != "" {
			continue
		}
		s.DbzSustainedRuns++
		acks = append(acks, sr.Ack)
		receipts = append(receipts, sr.Receipt)
		rates = append(rates, sr.AchievedRate)
		s.DbzSustainedRSS = max(s.DbzSustainedRSS, sr.PeakRSS)
	}
	s.DbzAck, s.DbzReceipt, s.DbzSustainedRate = MedianLatency(acks), MedianLatency(receipts), Median(rates)
	r.Summary = s
	r.Targets = targets(r.Config, s)
	if r.Soak != nil {
		r.Targets = append(r.Targets, r.Soak.targets()...)
	}
}

func targets(cfg Settings, s Summary) []Target {
	var ts []Target
	if s.Runs > 0 {
		ts = append(ts, Target{
			Name: "drain throughput",
			Want: fmt.Sprintf("≥ %.1f × pg_recvlogical", targetDrainRatio),
			Got:  fmt.Sprintf("%.2f × (%s vs %s events/s)", s.Ratio, fmtRate(s.RelayRate), fmtRate(s.RecvRate)),
			Pass: s.Ratio >= targetDrainRatio,
		})
	}
	if s.RelayRuns > 0 {
		t := Target{
			Name: "drain peak RSS",
			Want: fmt.Sprintf("≤ %d MiB draining %s events", targetRSS>>20, fmtCount(targetRSSEvents)),
			Got:  fmt.Sprintf("%s max (%s median)", fmtMB(s.PeakRSSMax), fmtMB(s.PeakRSSMedian)),
			Pass: s.PeakRSSMax <= targetRSS,
		}
		if s.Events < targetRSSEvents {
			t.Note = fmt.Sprintf("this run drained %s events, fewer than the target's %s", fmtCount(int(s.Events)), fmtCount(targetRSSEvents))
		}
		ts = append(ts, t, Target{
			Name: "drain CPU",
			Want: fmt.Sprintf("≤ %.1f s per million events", targetCPUPerMillion),
			Got:  fmt.Sprintf("%.2f s per million events", s.CPUPerMillion),
			Pass: s.CPUPerMillion <= targetCPUPerMillion,
		})
	}
	if s.DbzRuns > 0 && s.RelayRuns > 0 {
		ts = append(ts,
			Target{
				Name: "drain vs Debezium",
				Want: fmt.Sprintf("≥ %.0f × Debezium's events/s", targetDbzDrainRatio),
				Got:  fmt.Sprintf("%.1f × (%s vs %s events/s)", s.DbzRatio, fmtRate(s.RelayRate), fmtRate(s.DbzRate)),
				Pass: s.DbzRatio >= targetDbzDrainRatio,
				Note: "Debezium timed from its slot going active: its start-up is not counted",
			},
			Target{
				Name: "peak RSS vs Debezium",
				Want: fmt.Sprintf("≤ 1/%.0f of Debezium's", 1/targetDbzRSSRatio),
				Got:  fmt.Sprintf("1/%.1f (%s vs %s)", 1/s.DbzRSSRatio, fmtMB(s.PeakRSSMax), fmtMB(s.DbzPeakRSSMax)),
				Pass: s.DbzRSSRatio > 0 && s.DbzRSSRatio <= targetDbzRSSRatio,
			},
			Target{
				Name: "CPU per event vs Debezium",
				Want: fmt.Sprintf("≤ 1/%.0f of Debezium's", 1/targetDbzCPURatio),
				Got:  fmt.Sprintf("1/%.1f (%.2f vs %.2f s per million)", 1/s.DbzCPURatio, s.CPUPerMillion, s.DbzCPUPerMillion),
				Pass: s.DbzCPURatio > 0 && s.DbzCPURatio <= targetDbzCPURatio,
				Note: "Debezium's CPU while streaming; its start-up is not counted",
			})
	}
	if s.SustainedRuns > 0 {
		t := Target{
			Name: "commit→ack p99",
			Want: fmt.Sprintf("≤ %s at %s events/s", fmtDur(targetP99), fmtCount(targetP99Rate)),
			Got:  fmt.Sprintf("%s at %s events/s", fmtDur(s.Ack.P99), fmtRate(s.SustainedRate)),
			Pass: s.Ack.P99 <= targetP99,
		}
		if cfg.Rate < targetP99Rate {
			t.Note = fmt.Sprintf("this run inserted %s events/s, below the target's %s", fmtCount(cfg.Rate), fmtCount(targetP99Rate))
		} else if s.SustainedRate < 0.95*float64(cfg.Rate) {
			t.Note = fmt.Sprintf("the producer reached only %s of %s events/s", fmtRate(s.SustainedRate), fmtCount(cfg.Rate))
		}
		m := Target{
			Name: "commit→ack max",
			Want: fmt.Sprintf("≤ %s at %s events/s", fmtDur(targetMax), fmtCount(targetP99Rate)),
			Got:  fmt.Sprintf("%s at %s events/s", fmtDur(s.Ack.Max), fmtRate(s.SustainedRate)),
			Pass: s.Ack.Max <= targetMax,
			Note: t.Note,
		}
		ts = append(ts, t, m)
	}
	return ts
}

// writeMarkdown renders the report.
func (r *Report) writeMarkdown(w io.Writer) error {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "# outbox-relay benchmark, %s\n\n", r.Started.UTC().Format("2006-01-02 15:04:05 UTC"))
	fmt.Fprintf(&b, "Host: %s. Runs: %d%s. Medians over runs unless marked.\n\n", r.Host, c.Runs, map[bool]string{true: " (quick)", false: ""}[c.Quick])

	b.WriteString("## Targets\n\n| target | want | got | verdict |\n| --- | --- | --- | --- |\n")
	for _, t := range r.Targets {
		got := t.Got
		if t.Note != "" {
			got += " (" + t.Note + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Name, t.Want, got, verdict(t.Pass))
	}
	if len(r.Targets) == 0 {
		b.WriteString("| (nothing measured) | | | |\n")
	}
	r.writeComparison(&b)

	if len(r.Drain) > 0 {
		fmt.Fprintf(&b, "\n## Backlog drain\n\n%s events of ~%d-byte JSON, %d per transaction, %d aggregates over %d aggregate types, "+
			"8 partitions per topic. MB/s is WAL bytes of the backlog per second. Relay time runs from process start until every "+
			"event is in Kafka (end offsets) and the slot's confirmed_flush_lsn passed the last commit.\n\n",
			fmtCount(c.Events), c.PayloadBytes, c.PerTxn, c.Aggregates, len(aggregateTypes))
		s := r.Summary
		if s.RecvRuns+s.RelayRuns > 0 {
			b.WriteString("| | runs | events/s | MB/s |\n| --- | --- | --- | --- |\n")
			fmt.Fprintf(&b, "| pg_recvlogical (one slot's ceiling) | %d | %s | %.1f |\n", s.RecvRuns, fmtRate(s.RecvRate), s.RecvMBps)
			fmt.Fprintf(&b, "| outbox-relay (Kafka acks=all, LSN confirmed) | %d | %s | %.1f |\n", s.RelayRuns, fmtRate(s.RelayRate), s.RelayMBps)
		}
		if s.Runs > 0 {
			fmt.Fprintf(&b, "\nRatio %.2f (median of per-run ratios).", s.Ratio)
		}
		if s.RelayRuns > 0 {
			fmt.Fprintf(&b, " Relay peak RSS %s (max %s), CPU %.2f s per million events.", fmtMB(s.PeakRSSMedian), fmtMB(s.PeakRSSMax), s.CPUPerMillion)
		}
		b.WriteString("\n")
		b.WriteString("\n| run | events | insert s | pg_recvlogical s | relay s (Kafka / confirmed) | ratio | peak RSS | CPU s/M events | Kafka records | error |\n")
		b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
		for _, d := range r.Drain {
			fmt.Fprintf(&b, "| %d | %s | %.2f | %.2f | %.2f (%.2f / %.2f) | %.2f | %s | %.2f | %s | %s |\n",
				d.Run, fmtCount(int(d.Events)), d.InsertSec, d.RecvSec, d.RelaySec, d.RelayKafkaSec, d.RelayConfirmedSec,
				d.Ratio(), fmtMB(d.PeakRSS), d.CPUPerMillion(), fmtCount(int(d.KafkaRecords)), cell(d.Err))
		}
		r.writeDbzDrain(&b)
	}

	if len(r.Sustained) > 0 {
		fmt.Fprintf(&b, "\n## Sustained rate\n\n%s events/s for %s, %d events per transaction. Latency from the producer's "+
			"COMMIT return to the broker's LogAppendTime (ack; millisecond resolution) and to the in-process consumer's receipt.\n\n",
			fmtCount(c.Rate), c.Duration, c.SustainedPerTxn)
		if r.Summary.SustainedRuns > 0 {
			s := r.Summary
			b.WriteString("| latency | p50 | p95 | p99 | max |\n| --- | --- | --- | --- | --- |\n")
			fmt.Fprintf(&b, "| commit → Kafka ack | %s | %s | %s | %s |\n", fmtDur(s.Ack.P50), fmtDur(s.Ack.P95), fmtDur(s.Ack.P99), fmtDur(s.Ack.Max))
			fmt.Fprintf(&b, "| commit → consumer | %s | %s | %s | %s |\n", fmtDur(s.Receipt.P50), fmtDur(s.Receipt.P95), fmtDur(s.Receipt.P99), fmtDur(s.Receipt.Max))
			b.WriteString("\n![latency histogram](latency.svg)\n")
		}
		b.WriteString("\nReceived counts distinct events; duplicates are further deliveries, early ones reached the consumer " +
			"before the producer saw its COMMIT return (latency 0).\n")
		writeSustainedRuns(&b, r.Sustained)
	}
	if len(r.DbzSustained) > 0 {
		fmt.Fprintf(&b, "\n### Debezium at the same rate\n\nA fresh slot of its own, its own topics, the relay stopped; "+
			"%s at the rate first that is not measured (JIT warm-up), then measured as above.\n\n", dbzWarmUp)
		writeSustainedRuns(&b, r.DbzSustained)
	}
	if r.DbzConfig != "" {
		b.WriteString("\n## Debezium's configuration\n\nKafka Connect 3.9.1 standalone, Debezium " + dbzVersion +
			" PostgreSQL connector and outbox EventRouter, jars from Maven Central. Tuned for throughput: batches of 8192 from a " +
			"65,536-record queue polled every 10 ms, producer batches of up to 1 MiB lingering 5 ms, StringConverter (no JSON " +
			"re-encoding), offsets flushed every second, no snapshot. CPU and RSS are the whole JVM's, the Connect worker's own " +
			"cost included, as in any Debezium deployment.\n\n```properties\n")
		b.WriteString(r.DbzConfig)
		b.WriteString("```\n")
	}
	if r.Soak != nil {
		r.Soak.writeMarkdown(&b)
	}
	if len(r.LeftBehind) > 0 {
		b.WriteString("\n## WARNING: left behind\n\nThe bench created these and could not remove them:\n\n")
		for _, l := range r.LeftBehind {
			fmt.Fprintf(&b, "- %s\n", cell(l))
		}
	}
	if len(r.Errors) > 0 {
		b.WriteString("\n## Errors\n\n")
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "- %s\n", cell(e))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeSummary prints the few lines a terminal user wants.
func (r *Report) writeSummary(w io.Writer) error {
	var b strings.Builder
	s := r.Summary
	if s.RecvRuns > 0 {
		fmt.Fprintf(&b, "drain: pg_recvlogical %s events/s (%.1f MB/s)\n", fmtRate(s.RecvRate), s.RecvMBps)
	}
	if s.RelayRuns > 0 {
		fmt.Fprintf(&b, "drain: relay %s events/s (%.1f MB/s), ratio %.2f, peak RSS %s, CPU %.2f s/M events\n",
			fmtRate(s.RelayRate), s.RelayMBps, s.Ratio, fmtMB(s.PeakRSSMax), s.CPUPerMillion)
	}
	if s.DbzRuns > 0 {
		fmt.Fprintf(&b, "drain: debezium %s events/s streaming (%s with %.1f s start-up), relay ÷ debezium %.1f, peak RSS %s, CPU %.2f s/M events\n",
			fmtRate(s.DbzRate), fmtRate(s.DbzRateWithStart), s.DbzStartSec, s.DbzRatio, fmtMB(s.DbzPeakRSSMax), s.DbzCPUPerMillion)
	}
	if s.DbzSustainedRuns > 0 {
		fmt.Fprintf(&b, "sustained debezium %s events/s: commit→ack p50 %s p95 %s p99 %s max %s\n",
			fmtRate(s.DbzSustainedRate), fmtDur(s.DbzAck.P50), fmtDur(s.DbzAck.P95), fmtDur(s.DbzAck.P99), fmtDur(s.DbzAck.Max))
	}
	if r.Soak != nil {
		r.Soak.writeSummary(&b)
	}
	if s.SustainedRuns > 0 {
		fmt.Fprintf(&b, "sustained %s events/s: commit→ack p50 %s p95 %s p99 %s max %s; commit→consumer p50 %s p95 %s p99 %s max %s\n",
			fmtRate(s.SustainedRate), fmtDur(s.Ack.P50), fmtDur(s.Ack.P95), fmtDur(s.Ack.P99), fmtDur(s.Ack.Max),
			fmtDur(s.Receipt.P50), fmtDur(s.Receipt.P95), fmtDur(s.Receipt.P99), fmtDur(s.Receipt.Max))
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

func verdict(pass bool) string {
	if pass {
		return "PASS"
	}
	return "FAIL"
}

// cell makes a string safe inside a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

func fmtMB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func fmtRate(r float64) string { return fmtCount(int(r + 0.5)) }

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

func writeSustainedRuns(b *strings.Builder, runs []SustainedRun) {
	b.WriteString("\n| run | achieved events/s | received | duplicates | early | ack p50 / p99 / max | receipt p50 / p99 / max | peak RSS | CPU s (phase) | error |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, s := range runs {
		fmt.Fprintf(b, "| %d | %s | %s / %s | %d | %d | %s / %s / %s | %s / %s / %s | %s | %.2f | %s |\n",
			s.Run, fmtRate(s.AchievedRate), fmtCount(s.Received), fmtCount(s.Events), s.Duplicates, s.Early,
			fmtDur(s.Ack.P50), fmtDur(s.Ack.P99), fmtDur(s.Ack.Max),
			fmtDur(s.Receipt.P50), fmtDur(s.Receipt.P99), fmtDur(s.Receipt.Max), fmtMB(s.PeakRSS), s.PhaseCPUSec, cell(s.Err))
	}
}

// writeComparison writes the one table of docs/performance.md (the README's Figures copy it):
// pg_recvlogical, the relay and the peers, from this invocation.
func (r *Report) writeComparison(b *strings.Builder) {
	s := r.Summary
	if s.RelayRuns == 0 && s.RecvRuns == 0 && s.SustainedRuns == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Side by side\n\nSame backlog (%s events, ~%d-byte JSON), same machine, same run. Sustained: %s events/s for %s, "+
		"commit → Kafka ack (LogAppendTime).\n\n", fmtCount(int(s.Events)), r.Config.PayloadBytes, fmtCount(r.Config.Rate), r.Config.Duration)
	b.WriteString("| | drain events/s | relay ÷ it | peak RSS | CPU s per M events | start-up | ack p50 / p99 / max |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- |\n")
	lat := func(runs int, l Latency) string {
		if runs == 0 {
			return "—"
		}
		return fmt.Sprintf("%s / %s / %s", fmtDur(l.P50), fmtDur(l.P99), fmtDur(l.Max))
	}
	if s.RecvRuns > 0 {
		fmt.Fprintf(b, "| pg_recvlogical → /dev/null | %s | %.2f × | — | %.2f | — | — |\n", fmtRate(s.RecvRate), s.Ratio, s.RecvCPUPerMillion)
	}
	if s.RelayRuns > 0 || s.SustainedRuns > 0 {
		fmt.Fprintf(b, "| **outbox-relay** → Kafka | **%s** | 1 | **%s** | **%.2f** | — | **%s** |\n",
			fmtRate(s.RelayRate), fmtMB(s.PeakRSSMax), s.CPUPerMillion, lat(s.SustainedRuns, s.Ack))
	}
	if s.DbzRuns > 0 || s.DbzSustainedRuns > 0 {
		fmt.Fprintf(b, "| Debezium %s → Kafka | %s (%s with start-up) | %.1f × | %s | %.2f | %.1f s | %s |\n",
			dbzVersion, fmtRate(s.DbzRate), fmtRate(s.DbzRateWithStart), s.DbzRatio, fmtMB(s.DbzPeakRSSMax), s.DbzCPUPerMillion,
			s.DbzStartSec, lat(s.DbzSustainedRuns, s.DbzAck))
	}
}

// writeDbzDrain writes Debezium's per-run drain table.
func (r *Report) writeDbzDrain(b *strings.Builder) {
	var any bool
	for _, d := range r.Drain {
		any = any || d.Debezium != nil
	}
	if !any {
		return
	}
	b.WriteString("\n### Debezium on the same backlog\n\nFrom its own slot and publication, after pg_recvlogical and the relay " +
		"(the page cache is warmest then). Timed from the JVM's launch; start-up is until its slot is active, streaming from then " +
		"until every event is in its topics (end offsets); events/s and CPU are over streaming. Its slot's confirmation is not " +
		"waited for (it confirms after an offset flush).\n\n")
	b.WriteString("| run | start-up s (CPU s) | streaming s | events/s | relay ÷ Debezium | peak RSS | CPU s/M events | total CPU s | Kafka records | error |\n")
	b.WriteString("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, d := range r.Drain {
		p := d.Debezium
		if p == nil {
			continue
		}
		ratio := 0.0
		if d.DbzRate() > 0 {
			ratio = d.RelayRate() / d.DbzRate()
		}
		fmt.Fprintf(b, "| %d | %.2f (%.1f) | %.2f | %s | %.1f | %s | %.2f | %.1f | %s | %s |\n",
			d.Run, p.StartSec, p.StartCPUSec, p.StreamSec, fmtRate(d.DbzRate()), ratio, fmtMB(p.PeakRSS), d.DbzCPUPerMillion(),
			p.TotalCPUSec, fmtCount(int(p.Records)), cell(p.Err))
	}
}
