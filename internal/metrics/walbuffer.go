package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// walBuffer are the WAL buffer's figures (postgres.max_retained_wal,
// package walbuffer). The slot's retained WAL is the sampler's
// slot_retained_wal_bytes.
type walBuffer struct {
	active         prometheus.Gauge
	events, oldest prometheus.Gauge
	appended       prometheus.Counter
	drained        prometheus.Counter
	snapshots      prometheus.Counter
}

func newWALBuffer(reg *prometheus.Registry) *walBuffer {
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: name, Help: help})
	}
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: name, Help: help})
	}
	w := &walBuffer{
		active:    g("wal_buffer_active", "1 while the relay buffers (its slot retained half of postgres.max_retained_wal while delivery was blocked: events go to the WAL buffer table, then to Kafka) or drains the buffer before streaming live; else 0."),
		events:    g("wal_buffer_events", "Events held in the WAL buffer table for this slot, not yet delivered (sampled)."),
		oldest:    g("wal_buffer_oldest_age_seconds", "Age of the oldest event held in the WAL buffer table, 0 when none (sampled)."),
		appended:  c("wal_buffer_appended_events_total", "Events written to the WAL buffer table instead of Kafka."),
		drained:   c("wal_buffer_drained_events_total", "Events delivered from the WAL buffer table (sent to Kafka or stored in the retry table) and deleted from it."),
		snapshots: c("wal_snapshots_logged_total", "Running-xacts records the relay logged (pg_log_standby_snapshot() on Postgres 16+ where granted, else a temporary slot created and dropped) so that its slot's restart_lsn could move before the server's own, every 15 s; logged while the slot retains a quarter of postgres.max_retained_wal."),
	}
	reg.MustRegister(w.active, w.events, w.oldest, w.appended, w.drained, w.snapshots)
	return w
}

// SetBuffering records whether the relay buffers or drains its WAL buffer.
func (m *Metrics) SetBuffering(on bool) {
	if m != nil {
		m.walBuffer.active.Set(boolFloat(on))
	}
}

// SetBuffered records what the WAL buffer holds: events, and when the
// oldest was buffered (zero: none).
func (m *Metrics) SetBuffered(events int64, oldest time.Time) {
	if m == nil {
		return
	}
	m.walBuffer.events.Set(float64(events))
	age := 0.0
	if !oldest.IsZero() {
		age = max(time.Since(oldest).Seconds(), 0)
	}
	m.walBuffer.oldest.Set(age)
}

// Buffered counts events appended to the WAL buffer.
func (m *Metrics) Buffered(n int) {
	if m != nil {
		m.walBuffer.appended.Add(float64(n))
	}
}

// Drained counts events delivered from the WAL buffer and deleted.
func (m *Metrics) Drained(n int) {
	if m != nil {
		m.walBuffer.drained.Add(float64(n))
	}
}

// WALSnapshotLogged counts a running-xacts record the relay logged.
func (m *Metrics) WALSnapshotLogged() {
	if m != nil {
		m.walBuffer.snapshots.Inc()
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
