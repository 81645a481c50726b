// Package metrics exposes the relay's Prometheus metrics and its health
// endpoints.
//
// Invariants:
//
//   - Everything is registered on a private prometheus.Registry owned by a
//     Metrics value (plus the Go and process collectors); nothing touches the
//     global default registry, so tests and embedders can create as many as
//     they like.
//   - The methods the pipeline calls per event or per batch are cheap: an
//     atomic add or a histogram observation. Per-topic and per-table children
//     are resolved once (Topic, Table) and cached; callers keep the handle
//     instead of building label strings per event.
//   - A nil *Metrics, *Topic or *Table is valid and records nothing, so code
//     under test can run without metrics.
//   - Values that come from Postgres (slot lag, retry table) are sampled by a
//     Sampler every 10 s, never queried on a scrape, and are absent from
//     /metrics until known (and while the retry table does not exist), rather
//     than reported as a misleading 0. So are the gauges set by an event that
//     has not happened yet (confirmed_lsn, leader_epoch, the retention_*
//     gauges of a round): no series means "never".
//   - Every counter is exported from start-up, at 0, and so is every child of
//     a labelled counter whose label values are a fixed set (IgnoredKinds,
//     UnsolicitedKinds): increase() counts a counter's first event only if the
//     series existed before it. Per-table counters exist from the start of
//     leading (one per outbox table); per-topic ones from start-up for the
//     topics the configuration names (the relay resolves them in New), else
//     from a topic's first use, since those topics come from the data.
//   - ready agrees with /readyz: 1 on a leader whose checks pass and on a
//     standby that reaches Postgres and could lead (it is ready to take over); whether a
//     relay leads is active's business.
//
// Metrics (prefix outbox_relay_):
//
//	events_received_total{table}          counter   outbox inserts read from the WAL
//	events_delivered_total{topic}         counter   events acknowledged by Kafka
//	events_failed_total{topic}            counter   events Kafka rejected (sent to the retry table)
//	delivery_latency_seconds              histogram commit time in Postgres -> Kafka ack, per event
//	produce_batch_messages                histogram messages per Kafka write
//	kafka_produce_latency_seconds{broker} histogram produce request written -> answered (or its connection failed), per broker
//	kafka_requests_in_flight{broker}      gauge     produce requests written and not yet answered, per broker
//	kafka_produce_unanswered_total{broker} counter  produce requests written that got no answer (outcome unknown, settled by the producer)
//	kafka_produce_retries_total           counter   Kafka writes retried after a broker-wide failure
//	kafka_producer_resets_total           counter   producer ids or epochs taken after the first (sink/franz.go)
//	in_flight_events, in_flight_bytes     gauge     read but not yet covered by a saved checkpoint / acked
//	confirmed_lsn                         gauge     last LSN confirmed to Postgres (as a number); absent before the first
//	reconnects_total                      counter   replication connections re-established
//	replication_pauses_total              counter   times the pipeline took no batch for 5s and the stream paused: read and dropped what Postgres sent, to read it again later
//	decode_errors_total                   counter   pgoutput messages that could not be decoded
//	ignored_changes_total{kind}           counter   changes skipped, by kind (IgnoredKinds): update, delete, truncate, non_transactional_message, other_table
//	unsolicited_messages_total{kind}      counter   pgoutput messages proto_version 1 does not send, skipped: stream_abort, unknown
//	slot_active                           gauge     1 when a backend holds the slot (sampled)
//	slot_lag_bytes                        gauge     current WAL - confirmed_flush_lsn (sampled)
//	slot_retained_wal_bytes               gauge     current WAL - restart_lsn (sampled)
//	slot_safe_wal_size_bytes              gauge     WAL left before the slot may be lost; absent when unlimited (sampled)
//	retry_pending_events                  gauge     retry table rows waiting (sampled)
//	retry_dead_events                     gauge     dead letters (sampled)
//	retry_oldest_pending_age_seconds      gauge     age of the oldest pending retry, 0 when none (sampled)
//	sample_errors_total                   counter   failed samples (the log says why)
//	headers_dropped_total                 counter   headers-column entries dropped: named id, event_type or aggregate_type
//	headers_invalid_total                 counter   events whose headers column was not a JSON object (delivered without it)
//	schema_stops_total                    counter   stops because the outbox table lost a mapped column
//	placement_stops_total                 counter   stops before an insert under a table that may belong to the outbox but cannot be placed
//	active                                gauge     1 while this relay leads the slot, 0 while it stands by
//	leader_epoch                          gauge     the epoch this relay last took over with; absent before its first takeover
//	takeovers_total                       counter   takeovers by this relay (0 from start-up)
//	slot_gap                              gauge     1 when the slot does not continue from the checkpoint (recreated, invalidated, other system or timeline): the relay refuses to stream and exits (exit code 4)
//	refills_total                         counter   refills done: a lost slot healed from the outbox table (postgres.on_slot_loss: refill)
//	refilled_events_total                 counter   outbox rows re-delivered by refills
//	ready                                 gauge     what /readyz says, without its Kafka ping: 1 on a leader whose health checks pass and on a standby that reaches Postgres
//	health_failing{check}                 gauge     1 while a leader's check fails: replication, kafka, retry_table, checkpoint, stalled; absent on a standby
//	stalled_seconds                       gauge     how long the WAL has been ahead of the confirmed LSN without progress; 0 when not
//	retention_deleted_total               counter   outbox rows deleted by retention (outbox.retention), or removed with a dropped or detached partition
//	retention_lag_seconds                 gauge     how long the oldest row older than the retention has been due for deletion, 0 when none (after each round; absent before the first)
//	retention_last_round_timestamp_seconds gauge    when the last retention round ended (Unix time); absent before the first
//	retention_round_duration_seconds      gauge     how long the last retention round took; absent before the first
//	retention_kept_for_other_slots        gauge     rows older than the retention kept because another slot has not passed them (at most 100000; after each round; absent before the first)
package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

const namespace = "outbox_relay"

// Metrics holds the relay's collectors. Its methods are safe for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	received, delivered, failed *prometheus.CounterVec
	ignored                     *prometheus.CounterVec
	unsolicited                 *prometheus.CounterVec
	latency, batch              prometheus.Histogram
	inFlightEvents              prometheus.Gauge
	inFlightBytes               prometheus.Gauge
	confirmedLSN                unsetGauge
	reconnects, decodeErrors    prometheus.Counter
	pauses                      prometheus.Counter
	sampleErrors                prometheus.Counter
	retryAttempts, retryOK      prometheus.Counter
	retryDead                   prometheus.Counter
	headersDropped              prometheus.Counter
	headersInvalid              prometheus.Counter
	traceInvalid                prometheus.Counter
	schemaStops                 prometheus.Counter
	placementStops              prometheus.Counter
	ready, stalled              prometheus.Gauge
	active                      prometheus.Gauge
	epoch                       unsetGauge
	takeovers                   prometheus.Counter
	slotGap                     prometheus.Gauge
	refills, refilled           prometheus.Counter
	role                        atomic.Pointer[func() string] // for /readyz's body; nil says only "ready"
	failing                     *prometheus.GaugeVec
	sampled                     *sampled
	retentionDeleted            prometheus.Counter
	retentionLag                unsetGauge
	retentionLast, retentionDur unsetGauge
	retentionKept               unsetGauge

	walBuffer *walBuffer
	producer  *producer

	topics sync.Map // topic name -> *Topic
	tables sync.Map // table name -> *Table
}

// LatencyBuckets are the delivery latency histogram's buckets, in seconds:
// 1 ms to 60 s.
var LatencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// BatchBuckets are the produce batch histogram's buckets, in messages.
var BatchBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}

// New creates the collectors on a new private registry, together with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	counterVec := func(name, help, label string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help}, []string{label})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	}
	m.received = counterVec("events_received_total", "Outbox inserts read from the WAL, by table.", "table")
	m.delivered = counterVec("events_delivered_total", "Events acknowledged by Kafka, by topic.", "topic")
	m.failed = counterVec("events_failed_total", "Events Kafka rejected and that went to the retry table, by topic.", "topic")
	m.ignored = counterVec("ignored_changes_total", "Changes read from the WAL and skipped, by kind (update, delete, truncate, ...).", "kind")
	m.unsolicited = counterVec("unsolicited_messages_total", "pgoutput messages that proto_version 1 does not send and that were skipped because they carry no row, by kind (stream_abort, unknown).", "kind")
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "delivery_latency_seconds",
		Help: "Time from the transaction's commit in Postgres to the Kafka acknowledgement, per event.", Buckets: LatencyBuckets})
	m.batch = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "produce_batch_messages",
		Help: "Messages per Kafka produce call.", Buckets: BatchBuckets})
	m.inFlightEvents = gauge("in_flight_events", "Events read from the WAL and not yet covered by a saved checkpoint.")
	m.inFlightBytes = gauge("in_flight_bytes", "Payload bytes read from the WAL and not yet acknowledged by Kafka.")
	m.confirmedLSN = newUnsetGauge("confirmed_lsn", "Last LSN confirmed to Postgres, as a number (exact up to 8 PiB of WAL); absent before the first.")
	m.reconnects = counter("reconnects_total", "Replication connections re-established after a failure.")
	m.pauses = counter("replication_pauses_total", "Times the pipeline took no batch for 5s and the replication stream paused: it read and dropped what Postgres sent, so that the walsender never blocked (a blocked walsender holds up checkpoints), and read it again once the pipeline moved.")
	m.decodeErrors = counter("decode_errors_total", "pgoutput messages that could not be decoded.")
	m.sampleErrors = counter("sample_errors_total", "Failed samples of the slot and retry table.")
	m.retryAttempts = counter("retry_attempts_total", "Deliveries of retry-table rows attempted by this process's worker (attempts cut short by a Kafka outage not counted).")
	m.retryOK = counter("retry_delivered_total", "Retry-table rows this process's worker delivered to Kafka.")
	m.retryDead = counter("retry_dead_lettered_total", "Retry-table rows this process's worker moved to dead.")
	m.headersDropped = counter("headers_dropped_total", "Entries of the headers column dropped because they used a header name the relay sets (id, event_type, aggregate_type).")
	m.headersInvalid = counter("headers_invalid_total", "Events whose headers column held something other than a JSON object; they were delivered without extra headers.")
	m.traceInvalid = counter("trace_context_invalid_total", "Events whose tracing span context column held no valid W3C traceparent; they were delivered without a trace context.")
	m.schemaStops = counter("schema_stops_total", "Times the relay stopped because the outbox table no longer has a mapped column.")
	m.placementStops = counter("placement_stops_total", "Times the relay stopped before an insert under a table that may belong to the outbox but cannot be placed (renamed outbox, inheritance child, dropped or detached partition).")
	m.active = gauge("active", "1 while this relay leads (streams the slot and delivers), 0 while it stands by.")
	m.epoch = newUnsetGauge("leader_epoch", "The checkpoint epoch this relay last took over with; absent before its first takeover. Every takeover in the HA group raises it: a rising epoch on one instance after another is leadership moving.")
	m.takeovers = counter("takeovers_total", "Times this relay took over the slot (a new epoch in the checkpoint row): once per start of leadership.")
	m.slotGap = gauge("slot_gap", "1 when the replication slot does not continue from the relay's checkpoint (dropped and recreated, invalidated, another system or a forked timeline): the relay refuses to stream it and exits with code 4; the log names the uncovered range and the fix.")
	m.ready = gauge("ready", "What /readyz reports, less its live Kafka ping: 1 on a leader whose health checks pass and on a standby that reaches Postgres and could lead (ready to take over), else 0. Whether it leads is outbox_relay_active.")
	m.stalled = gauge("stalled_seconds", "Seconds the WAL has been ahead of the confirmed LSN without the pipeline making progress; 0 when it is not.")
	m.failing = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "health_failing",
		Help: "1 while a leader's health check fails, by check: replication, kafka, retry_table, checkpoint, stalled. Absent on a standby, which runs none of them."}, []string{"check"})
	m.retentionDeleted = counter("retention_deleted_total", "Outbox rows deleted by retention (outbox.retention), or removed from the outbox with a partition it dropped or detached.")
	m.retentionLag = newUnsetGauge("retention_lag_seconds", "How long the oldest outbox row older than outbox.retention has been due for deletion, as of the last retention round; 0 when there is none, absent before the first round.")
	m.retentionLast = newUnsetGauge("retention_last_round_timestamp_seconds", "When the last retention round ended, as a Unix time; absent before the first (and while retention is off).")
	m.retentionDur = newUnsetGauge("retention_round_duration_seconds", "How long the last retention round took; absent before the first.")
	m.retentionKept = newUnsetGauge("retention_kept_for_other_slots", "Outbox rows older than outbox.retention that this relay delivered but another logical slot of the database has not passed, kept for it, as of the last retention round (counted up to 100000); absent before the first round.")
	m.refills = counter("refills_total", "Refills done: the slot did not continue from the checkpoint, and the relay re-delivered the uncovered range from the outbox table (outbox-relay recover, postgres.on_slot_loss: refill).")
	m.refilled = counter("refilled_events_total", "Outbox rows re-delivered by refills (sent to Kafka or stored in the retry table), duplicates of earlier deliveries included.")
	m.sampled = &sampled{}
	m.walBuffer = newWALBuffer(m.reg)
	m.producer = newProducer(m.reg)
	m.reg.MustRegister(m.received, m.delivered, m.failed, m.ignored, m.unsolicited, m.latency, m.batch,
		m.inFlightEvents, m.inFlightBytes, m.confirmedLSN, m.reconnects, m.pauses, m.decodeErrors, m.sampleErrors, m.sampled,
		m.retryAttempts, m.retryOK, m.retryDead, m.headersDropped, m.headersInvalid, m.traceInvalid, m.schemaStops, m.placementStops,
		m.ready, m.stalled, m.active, m.epoch, m.takeovers, m.slotGap, m.refills, m.refilled, m.failing, m.retentionDeleted, m.retentionLag, m.retentionLast, m.retentionDur, m.retentionKept,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// At 0 from the start, so that increase() sees the first event.
	for _, k := range IgnoredKinds {
		m.ignored.WithLabelValues(k)
	}
	for _, k := range UnsolicitedKinds {
		m.unsolicited.WithLabelValues(k)
	}
	return m
}

// IgnoredKinds are the kinds IgnoredChange counts, each exported at 0 from
// start-up. A kind not listed here is counted all the same, but its series
// appears only at its first change (and increase() misses that one).
var IgnoredKinds = []string{"update", "delete", "truncate", "non_transactional_message", "other_table"}

// UnsolicitedKinds are the kinds UnsolicitedMessages counts, each exported
// at 0 from start-up.
var UnsolicitedKinds = []string{"stream_abort", "unknown"}

// An unsetGauge is a gauge without a series until its first Set: a value
// that does not exist yet (no round, no takeover, nothing confirmed) is
// "never" on a dashboard rather than a 0 that reads as 1970.
type unsetGauge struct{ *prometheus.GaugeVec }

func newUnsetGauge(name, help string) unsetGauge {
	return unsetGauge{prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help}, nil)}
}

func (g unsetGauge) Set(v float64) { g.WithLabelValues().Set(v) }

// Registry returns the private registry, for adding collectors or gathering in tests.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Topic holds the per-topic counters. Resolve it once per topic (or per batch)
// with Metrics.Topic and keep it.
type Topic struct {
	delivered, failed prometheus.Counter
}

// Topic returns the counters of topic, creating them on first use.
func (m *Metrics) Topic(name string) *Topic {
	if m == nil {
		return nil
	}
	if t, ok := m.topics.Load(name); ok {
		return t.(*Topic)
	}
	t, _ := m.topics.LoadOrStore(name, &Topic{
		delivered: m.delivered.WithLabelValues(name),
		failed:    m.failed.WithLabelValues(name),
	})
	return t.(*Topic)
}

// Delivered counts n events acknowledged by Kafka.
func (t *Topic) Delivered(n int) {
	if t != nil {
		t.delivered.Add(float64(n))
	}
}

// Failed counts n events rejected by Kafka.
func (t *Topic) Failed(n int) {
	if t != nil {
		t.failed.Add(float64(n))
	}
}

// Table holds the per-table counter of received events.
type Table struct{ received prometheus.Counter }

// Table returns the counter of the outbox table name, creating it on first use.
func (m *Metrics) Table(name string) *Table {
	if m == nil {
		return nil
	}
	if t, ok := m.tables.Load(name); ok {
		return t.(*Table)
	}
	t, _ := m.tables.LoadOrStore(name, &Table{received: m.received.WithLabelValues(name)})
	return t.(*Table)
}

// Received counts n outbox inserts read from the WAL.
func (t *Table) Received(n int) {
	if t != nil {
		t.received.Add(float64(n))
	}
}

// ObserveDelivery records the delivery latency of events events of one
// transaction: from its commit time in Postgres to the Kafka acknowledgement.
// Commit time comes from the server's clock and ack from the relay's, so clock
// skew shows here; a negative latency is recorded as 0.
func (m *Metrics) ObserveDelivery(commitTime, ackTime time.Time, events int) {
	if m == nil {
		return
	}
	s := ackTime.Sub(commitTime).Seconds()
	if s < 0 {
		s = 0
	}
	for range events {
		m.latency.Observe(s)
	}
}

// ObserveBatch records the size of one Kafka produce call, in messages.
func (m *Metrics) ObserveBatch(messages int) {
	if m != nil {
		m.batch.Observe(float64(messages))
	}
}

// SetInFlight sets the in-flight gauges to absolute values.
func (m *Metrics) SetInFlight(events, bytes int) {
	if m != nil {
		m.inFlightEvents.Set(float64(events))
		m.inFlightBytes.Set(float64(bytes))
	}
}

// SetConfirmedLSN records the LSN last confirmed to Postgres.
func (m *Metrics) SetConfirmedLSN(lsn pglogrepl.LSN) {
	if m != nil {
		m.confirmedLSN.Set(float64(lsn))
	}
}

// Reconnected counts one re-established replication connection.
func (m *Metrics) Reconnected() {
	if m != nil {
		m.reconnects.Inc()
	}
}

// ReplicationPaused counts n pauses of the replication stream.
func (m *Metrics) ReplicationPaused(n uint64) {
	if m != nil && n > 0 {
		m.pauses.Add(float64(n))
	}
}

// RetryWorked adds what the retry worker did since the last call: rows
// attempted, delivered and dead-lettered.
func (m *Metrics) RetryWorked(attempted, delivered, dead int64) {
	if m != nil {
		m.retryAttempts.Add(float64(attempted))
		m.retryOK.Add(float64(delivered))
		m.retryDead.Add(float64(dead))
	}
}

// DecodeError counts one pgoutput message that could not be decoded.
func (m *Metrics) DecodeError() {
	if m != nil {
		m.decodeErrors.Inc()
	}
}

// IgnoredChange counts one skipped change of the given kind. Keep kinds to a
// small fixed set ("update", "delete", "truncate", "other_table", ...): each
// distinct kind is a time series.
func (m *Metrics) IgnoredChange(kind string) {
	if m != nil {
		m.ignored.WithLabelValues(kind).Inc()
	}
}

// UnsolicitedMessages counts n skipped pgoutput messages of the given kind
// ("stream_abort", "unknown") that proto_version 1 does not send.
func (m *Metrics) UnsolicitedMessages(kind string, n uint64) {
	if m != nil && n > 0 {
		m.unsolicited.WithLabelValues(kind).Add(float64(n))
	}
}

// HeadersDropped counts n headers-column entries dropped for using a name the
// relay sets.
func (m *Metrics) HeadersDropped(n int) {
	if m != nil {
		m.headersDropped.Add(float64(n))
	}
}

// HeadersInvalid counts one event whose headers column was ignored.
func (m *Metrics) HeadersInvalid() {
	if m != nil {
		m.headersInvalid.Inc()
	}
}

// SchemaStop counts one stop for a mapped column missing from the outbox table.
func (m *Metrics) SchemaStop() {
	if m != nil {
		m.schemaStops.Inc()
	}
}

// PlacementStop counts one stop before an insert the relay cannot place.
func (m *Metrics) PlacementStop() {
	if m != nil {
		m.placementStops.Inc()
	}
}

// RetentionDeleted counts n outbox rows deleted by retention.
func (m *Metrics) RetentionDeleted(n int64) {
	if m != nil {
		m.retentionDeleted.Add(float64(n))
	}
}

// RetentionRound records a finished retention round: when it ended, how
// long it took, and how long the oldest expired row left has been due.
func (m *Metrics) RetentionRound(end time.Time, took, overdue time.Duration) {
	if m != nil {
		m.retentionLast.Set(float64(end.UnixNano()) / 1e9)
		m.retentionDur.Set(took.Seconds())
		m.retentionLag.Set(overdue.Seconds())
	}
}

// RetentionKept records how many rows the last retention round kept for
// other slots.
func (m *Metrics) RetentionKept(n int64) {
	if m != nil {
		m.retentionKept.Set(float64(n))
	}
}

// HealthChecks are the checks SetHealth reports, in a fixed order so that
// every series exists from the start.
var HealthChecks = []string{"replication", "kafka", "retry_table", "checkpoint", "stalled"}

// SetHealth records the health checks' state: failing holds the checks that
// fail now (names from HealthChecks), stalled how long the pipeline has made
// no progress while behind.
func (m *Metrics) SetHealth(failing map[string]bool, stalled time.Duration) {
	if m == nil {
		return
	}
	ready := 1.0
	for _, c := range HealthChecks {
		v := 0.0
		if failing[c] {
			v, ready = 1, 0
		}
		m.failing.WithLabelValues(c).Set(v)
	}
	m.ready.Set(ready)
	m.stalled.Set(stalled.Seconds())
}

// SetStandby records a standby's readiness, as /readyz judges it: ready
// while it reaches Postgres, since waiting to take over is its job. The
// leader's checks do not run on a standby, so their series are removed
// rather than left at a former term's values.
func (m *Metrics) SetStandby(reachable bool) {
	if m == nil {
		return
	}
	m.ready.Set(gauge(reachable))
	m.failing.Reset()
	m.stalled.Set(0)
}

// SetStopped records a relay that stopped for an operator and lingers
// (relay.Config.StopLinger): neither ready nor leading; the leader's checks
// no longer run, so their series are removed.
func (m *Metrics) SetStopped() {
	if m == nil {
		return
	}
	m.ready.Set(0)
	m.active.Set(0)
	m.failing.Reset()
	m.stalled.Set(0)
}

// SetSlotGap records whether the slot was found not to continue from the
// checkpoint (pgslot.Verify).
func (m *Metrics) SetSlotGap(gap bool) {
	if m == nil {
		return
	}
	m.slotGap.Set(gauge(gap))
}

// TraceContextInvalid counts an event delivered without the trace context
// its row held, which was not valid.
func (m *Metrics) TraceContextInvalid() {
	if m != nil {
		m.traceInvalid.Inc()
	}
}

// TookOver records a takeover of the slot with epoch, after which this relay
// leads (SetActive(true)).
func (m *Metrics) TookOver(epoch int64) {
	if m == nil {
		return
	}
	m.takeovers.Inc()
	m.epoch.Set(float64(epoch))
	m.active.Set(1)
}

// Refilled records a refill that re-delivered events rows.
func (m *Metrics) Refilled(events int64) {
	if m == nil {
		return
	}
	m.refills.Inc()
	m.refilled.Add(float64(events))
}

// SetActive records whether this relay leads the slot (1) or stands by (0).
func (m *Metrics) SetActive(leading bool) {
	if m == nil {
		return
	}
	m.active.Set(gauge(leading))
}

// gauge is a condition as a gauge's value: 1 when it holds, else 0.
func gauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Value is the value of the series name{label="value", ...} of m, a
// counter's or a gauge's, 0 when there is no such series: what tests read
// without scraping. labels are label and value in turn; a series matches
// when it has every one of them.
func (m *Metrics) Value(name string, labels ...string) float64 {
	mfs, err := m.reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, s := range mf.GetMetric() {
			if hasLabels(s.GetLabel(), labels) {
				if c := s.GetCounter(); c != nil {
					return c.GetValue()
				}
				return s.GetGauge().GetValue()
			}
		}
	}
	return 0
}

func hasLabels(have []*dto.LabelPair, want []string) bool {
	for i := 0; i+1 < len(want); i += 2 {
		found := false
		for _, l := range have {
			if l.GetName() == want[i] && l.GetValue() == want[i+1] {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}
