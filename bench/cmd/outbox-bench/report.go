package main

import (
	"fmt"
	"time"
)

// Report is everything one bench invocation measured: report.json is its JSON
// encoding and the source of truth; report.md and the plots are rendered from
// it alone.
type Report struct {
	Started time.Time `json:"started"`
	Command string    `json:"command"`
	Env     Env       `json:"environment"`
	Config  Settings  `json:"config"`
	// Producer is the highest rate of one-event commits the producer held,
	// which caps the one-event sustained workload.
	Producer  *ProducerProbe `json:"producer,omitempty"`
	Drain     []DrainRun     `json:"drain,omitempty"`
	Sustained []SustainedRun `json:"sustained,omitempty"`
	// Tables are the runs of the tables workload (tables.go).
	Tables []TablesRun `json:"tables,omitempty"`
	// Debezium is its tuning as it ran (-peers debezium).
	Debezium *DebeziumSetup `json:"debezium,omitempty"`
	Soak     *SoakResult    `json:"soak,omitempty"`
	Summary  Summary        `json:"summary"`
	Targets  []Target       `json:"targets"`
	Errors   []string       `json:"errors,omitempty"`
	// LeftBehind lists what the bench created and could not remove.
	LeftBehind []string `json:"left_behind,omitempty"`
	// AckHists are commit→ack histograms over all runs of one sustained
	// workload and sink, keyed by workloadKey.
	AckHists map[string]*Histogram `json:"ack_histograms,omitempty"`
}

// Env is where the figures were measured.
type Env struct {
	Host     string  `json:"host"`
	CPUs     int     `json:"cpus"`
	Go       string  `json:"go"`
	Postgres string  `json:"postgres,omitempty"`
	Relay    string  `json:"relay,omitempty"` // outbox-relay version
	Load     float64 `json:"load_average_1m"` // at the start: other work on the machine
}

// Settings are the flags a report was produced with.
type Settings struct {
	Events          int           `json:"events"`
	PayloadBytes    int           `json:"payload_bytes"`
	DrainPerTxn     []int         `json:"drain_per_txn"`
	Aggregates      int           `json:"aggregates"`
	Rate            int           `json:"rate"`
	Duration        time.Duration `json:"duration_ns"`
	RelayWarmUp     time.Duration `json:"relay_warm_up_ns,omitempty"` // unmeasured at the rate before a relay's sustained phase
	SustainedPerTxn []int         `json:"sustained_per_txn"`
	HighRate        int           `json:"high_rate,omitempty"` // events/s of the high-rate workload (transactions of highRatePerTxn); 0: none
	CPUProfile      bool          `json:"cpu_profile,omitempty"`
	Producers       int           `json:"producers"`
	Runs            int           `json:"runs"`
	Quick           bool          `json:"quick"`
	SkipDrain       bool          `json:"skip_drain"`
	SkipSustained   bool          `json:"skip_sustained"`
	ExactlyOnce     bool          `json:"exactly_once"`
	Peers           []string      `json:"peers,omitempty"`
	Soak            time.Duration `json:"soak_ns,omitempty"`
	Tables          int           `json:"tables"` // of the tables workload; 0: not run
}

// ProducerProbe is the producer's capacity: one-event transactions committed
// as fast as Connections connections can, for Seconds.
type ProducerProbe struct {
	Connections   int     `json:"connections"`
	Seconds       float64 `json:"seconds"`
	CommitsPerSec float64 `json:"commits_per_s"`
}

// DrainRun is one backlog drain: pg_recvlogical, the relay and Debezium each
// read the same WAL from a slot of their own.
type DrainRun struct {
	Run          int     `json:"run"`
	PerTxn       int     `json:"per_txn"`
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
	// EOS is the relay with delivery: exactly-once (-exactly-once).
	EOS *RelayDrain `json:"relay_exactly_once,omitempty"`
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

// Rates derived from a DrainRun; zero when the side did not finish.
func (d DrainRun) RecvRate() float64  { return perSec(float64(d.Events), d.RecvSec) }
func (d DrainRun) RelayRate() float64 { return perSec(float64(d.Events), d.RelaySec) }
func (d DrainRun) RecvMBps() float64  { return perSec(float64(d.WALBytes)/1e6, d.RecvSec) }
func (d DrainRun) RelayMBps() float64 { return perSec(float64(d.WALBytes)/1e6, d.RelaySec) }

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

// perMillion is CPU seconds per million of n events; 0 for none.
func perMillion(cpuSec float64, n int64) float64 {
	if n <= 0 {
		return 0
	}
	return cpuSec / float64(n) * 1e6
}

func perSec(x, sec float64) float64 {
	if sec <= 0 {
		return 0
	}
	return x / sec
}

// SustainedRun is one fixed-rate run of one sink.
type SustainedRun struct {
	Run          int     `json:"run"`
	Sink         string  `json:"sink"` // relay or debezium
	PerTxn       int     `json:"per_txn"`
	Rate         int     `json:"requested_rate,omitempty"` // the workload's rate; 0: -rate
	TargetRate   int     `json:"target_rate"`
	RateCap      string  `json:"rate_lowered_by,omitempty"` // producer, or the slower system of an equal-rate comparison
	AchievedRate float64 `json:"achieved_rate"`
	Events       int     `json:"events"`
	Commits      int     `json:"commits"`
	Received     int     `json:"received"`   // distinct events
	Duplicates   int     `json:"duplicates"` // further deliveries of received events
	Unknown      int     `json:"unknown"`    // records that are not the producer's events
	Early        int     `json:"early"`      // reached the consumer before the producer saw COMMIT return
	Ack          Latency `json:"commit_to_ack"`
	Receipt      Latency `json:"commit_to_receipt"`
	PeakRSS      int64   `json:"peak_rss_bytes"`
	CPUSec       float64 `json:"cpu_seconds"`       // start to exit
	PhaseCPUSec  float64 `json:"phase_cpu_seconds"` // during the timed phase only
	// BenchCPUSec is the bench's own CPU in the timed phase (producer and
	// consumer), which the sink competes with on a small machine.
	BenchCPUSec float64 `json:"bench_cpu_seconds"`
	// Stages is where the relay's clock says commit→ack went (relays only).
	Stages *Stages `json:"stages,omitempty"`
	Err    string  `json:"error,omitempty"`
}

// Summary holds the medians over the runs that finished, per workload.
type Summary struct {
	Drains    []DrainSummary     `json:"drains,omitempty"`
	Sustained []SustainedSummary `json:"sustained,omitempty"`
}

// DrainSummary is one drain workload (PerTxn events per transaction) over the
// runs. Each side counts in every run it finished, so the pg_recvlogical half
// is reported even while the relay fails; ratios are medians of per-run
// ratios over the runs where both finished.
type DrainSummary struct {
	PerTxn int   `json:"per_txn"`
	Events int64 `json:"events"`

	RecvRuns          int     `json:"recvlogical_runs"`
	RecvRate          float64 `json:"recvlogical_events_per_s"`
	RecvMBps          float64 `json:"recvlogical_wal_mb_per_s"`
	RecvCPUPerMillion float64 `json:"recvlogical_cpu_seconds_per_million"`

	RelayRuns     int     `json:"relay_runs"`
	RelayRate     float64 `json:"relay_events_per_s"`
	RelayMBps     float64 `json:"relay_wal_mb_per_s"`
	Ratio         float64 `json:"relay_over_recvlogical"`
	PeakRSSMedian int64   `json:"relay_peak_rss_median_bytes"`
	PeakRSSMax    int64   `json:"relay_peak_rss_max_bytes"`
	CPUPerMillion float64 `json:"relay_cpu_seconds_per_million"`

	DbzRuns          int     `json:"debezium_runs"`
	DbzRate          float64 `json:"debezium_events_per_s"`            // over streaming time
	DbzRateWithStart float64 `json:"debezium_events_per_s_with_start"` // from JVM launch
	DbzStartSec      float64 `json:"debezium_start_up_seconds"`
	DbzPeakRSSMax    int64   `json:"debezium_peak_rss_max_bytes"`
	DbzCPUPerMillion float64 `json:"debezium_cpu_seconds_per_million"`
	DbzRatio         float64 `json:"relay_over_debezium"`

	EOSRuns          int     `json:"relay_exactly_once_runs"`
	EOSRate          float64 `json:"relay_exactly_once_events_per_s"`
	EOSPeakRSSMax    int64   `json:"relay_exactly_once_peak_rss_max_bytes"`
	EOSCPUPerMillion float64 `json:"relay_exactly_once_cpu_seconds_per_million"`
	EOSRatio         float64 `json:"relay_exactly_once_over_relay"` // its rate ÷ at-least-once's, per run
}

// SustainedSummary is one sink at one sustained workload over the runs.
type SustainedSummary struct {
	Sink          string  `json:"sink"`
	PerTxn        int     `json:"per_txn"`
	Rate          int     `json:"requested_rate,omitempty"` // the workload's rate; 0: -rate
	TargetRate    int     `json:"target_rate"`
	RateCap       string  `json:"rate_lowered_by,omitempty"`
	Runs          int     `json:"runs"`
	AchievedRate  float64 `json:"achieved_rate"`
	Events        int     `json:"events"` // over the runs
	Received      int     `json:"received"`
	Duplicates    int     `json:"duplicates"`
	Ack           Latency `json:"commit_to_ack"`
	Receipt       Latency `json:"commit_to_receipt"`
	AckSpread     Spread  `json:"commit_to_ack_runs"`     // min and max of the runs' figures
	ReceiptSpread Spread  `json:"commit_to_receipt_runs"` // min and max of the runs' figures
	PeakRSSMax    int64   `json:"peak_rss_max_bytes"`
	CPUPerMillion float64 `json:"cpu_seconds_per_million"` // timed phase
	Stages        *Stages `json:"stages,omitempty"`        // medians over runs
}

// workloadKey names a sustained workload of one sink: "relay/100", or
// "relay/100@50000" for one at a rate of its own.
func workloadKey(sink string, perTxn, rate int) string {
	if rate == 0 {
		return fmt.Sprintf("%s/%d", sink, perTxn)
	}
	return fmt.Sprintf("%s/%d@%d", sink, perTxn, rate)
}

// summarize fills Summary and Targets from the runs. Rates and latencies are
// medians over runs; peak RSS is also given as the maximum, and the RSS target
// is judged on the maximum because a memory bound must hold in every run.
func (r *Report) summarize() {
	r.Summary = Summary{}
	for _, per := range r.drainSizes() {
		r.Summary.Drains = append(r.Summary.Drains, summarizeDrain(per, r.Drain))
	}
	for _, w := range r.sustainedWorkloads() {
		r.Summary.Sustained = append(r.Summary.Sustained, summarizeSustained(w.sink, w.per, w.rate, r.Sustained))
	}
	r.Targets = targets(r.Summary)
	if r.Soak != nil {
		r.Targets = append(r.Targets, r.Soak.targets()...)
	}
}

// drainSizes are the drain workloads in the order they ran.
func (r *Report) drainSizes() []int {
	var out []int
	seen := map[int]bool{}
	for _, d := range r.Drain {
		if !seen[d.PerTxn] {
			seen[d.PerTxn] = true
			out = append(out, d.PerTxn)
		}
	}
	return out
}

type sustainedWorkload struct {
	sink      string
	per, rate int
}

// sustainedWorkloads are the sustained workloads in the order they ran.
func (r *Report) sustainedWorkloads() []sustainedWorkload {
	var out []sustainedWorkload
	seen := map[sustainedWorkload]bool{}
	for _, s := range r.Sustained {
		w := sustainedWorkload{s.Sink, s.PerTxn, s.Rate}
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
	}
	return out
}

func summarizeDrain(per int, runs []DrainRun) DrainSummary {
	s := DrainSummary{PerTxn: per}
	var recv, recvMB, recvCPU, relay, relayMB, ratio, rss, cpu []float64
	var dbz, dbzWith, dbzStart, dbzCPU, dbzRatio []float64
	var eos, eosCPU, eosRatio []float64
	for _, d := range runs {
		if d.PerTxn != per {
			continue
		}
		if d.RecvSec > 0 {
			s.RecvRuns++
			s.Events = d.Events
			recv = append(recv, d.RecvRate())
			recvMB = append(recvMB, d.RecvMBps())
			recvCPU = append(recvCPU, perMillion(d.RecvCPUSec, d.Events))
		}
		if d.DbzRate() > 0 {
			s.DbzRuns++
			dbz = append(dbz, d.DbzRate())
			dbzWith = append(dbzWith, d.DbzRateWithStart())
			dbzStart = append(dbzStart, d.Debezium.StartSec)
			dbzCPU = append(dbzCPU, perMillion(d.Debezium.CPUSec, d.Events))
			s.DbzPeakRSSMax = max(s.DbzPeakRSSMax, d.Debezium.PeakRSS)
			if d.RelaySec > 0 {
				dbzRatio = append(dbzRatio, d.RelayRate()/d.DbzRate())
			}
		}
		if d.EOSRate() > 0 {
			s.EOSRuns++
			eos = append(eos, d.EOSRate())
			eosCPU = append(eosCPU, perMillion(d.EOS.CPUSec, d.Events))
			s.EOSPeakRSSMax = max(s.EOSPeakRSSMax, d.EOS.PeakRSS)
			if d.RelaySec > 0 {
				eosRatio = append(eosRatio, d.EOSRate()/d.RelayRate())
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
		cpu = append(cpu, perMillion(d.RelayCPUSec, d.Events))
		s.PeakRSSMax = max(s.PeakRSSMax, d.PeakRSS)
		if d.RecvSec > 0 {
			ratio = append(ratio, d.RelayRate()/d.RecvRate())
		}
	}
	s.RecvRate, s.RecvMBps, s.RecvCPUPerMillion = Median(recv), Median(recvMB), Median(recvCPU)
	s.RelayRate, s.RelayMBps, s.Ratio = Median(relay), Median(relayMB), Median(ratio)
	s.PeakRSSMedian, s.CPUPerMillion = int64(Median(rss)), Median(cpu)
	s.DbzRate, s.DbzRateWithStart, s.DbzStartSec = Median(dbz), Median(dbzWith), Median(dbzStart)
	s.DbzCPUPerMillion, s.DbzRatio = Median(dbzCPU), Median(dbzRatio)
	s.EOSRate, s.EOSCPUPerMillion, s.EOSRatio = Median(eos), Median(eosCPU), Median(eosRatio)
	return s
}

func summarizeSustained(sink string, per, rate int, runs []SustainedRun) SustainedSummary {
	s := SustainedSummary{Sink: sink, PerTxn: per, Rate: rate}
	var acks, receipts []Latency
	var rates, cpu []float64
	var stages []*Stages
	for _, r := range runs {
		if r.Sink != sink || r.PerTxn != per || r.Rate != rate {
			continue
		}
		s.TargetRate, s.RateCap = r.TargetRate, r.RateCap
		if r.Err != "" {
			continue
		}
		s.Runs++
		s.Events += r.Events
		s.Received += r.Received
		s.Duplicates += r.Duplicates
		acks = append(acks, r.Ack)
		receipts = append(receipts, r.Receipt)
		rates = append(rates, r.AchievedRate)
		cpu = append(cpu, perMillion(r.PhaseCPUSec, int64(r.Events)))
		s.PeakRSSMax = max(s.PeakRSSMax, r.PeakRSS)
		stages = append(stages, r.Stages)
	}
	s.Ack, s.Receipt = MedianLatency(acks), MedianLatency(receipts)
	s.AckSpread, s.ReceiptSpread = SpreadOf(acks), SpreadOf(receipts)
	s.Stages = medianStages(stages)
	s.AchievedRate, s.CPUPerMillion = Median(rates), Median(cpu)
	return s
}
