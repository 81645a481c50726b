package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// sampled holds the values read from Postgres and exports only those known,
// so a slot that does not exist or a retry table that was never created is
// absent from /metrics rather than a misleading 0.
type sampled struct {
	mu    sync.Mutex
	slot  *ops.SlotLag
	retry *ops.Retry
}

var (
	descSlotActive  = prometheus.NewDesc(namespace+"_slot_active", "1 when a backend holds the replication slot, else 0 (sampled).", nil, nil)
	descSlotLag     = prometheus.NewDesc(namespace+"_slot_lag_bytes", "Current WAL position minus the slot's confirmed_flush_lsn (sampled).", nil, nil)
	descSlotRetain  = prometheus.NewDesc(namespace+"_slot_retained_wal_bytes", "Current WAL position minus the slot's restart_lsn: WAL kept on disk for it (sampled).", nil, nil)
	descSlotWAL     = prometheus.NewDesc(namespace+"_slot_wal_status", "1 for the slot's current wal_status (reserved, extended, unreserved, lost), by status; the other statuses are 0 (sampled).", []string{"status"}, nil)
	descSlotSafe    = prometheus.NewDesc(namespace+"_slot_safe_wal_size_bytes", "WAL that can be written before the slot may be lost; absent when max_slot_wal_keep_size is unlimited (sampled).", nil, nil)
	descRetryPend   = prometheus.NewDesc(namespace+"_retry_pending_events", "Events in the retry table waiting for another attempt (sampled).", nil, nil)
	descRetryDead   = prometheus.NewDesc(namespace+"_retry_dead_events", "Events in the retry table that will not be retried (sampled).", nil, nil)
	descRetryOldest = prometheus.NewDesc(namespace+"_retry_oldest_pending_age_seconds", "Age of the oldest pending retry, 0 when none (sampled).", nil, nil)
)

// walStatuses are the values of pg_replication_slots.wal_status.
var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

func (s *sampled) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSlotActive, descSlotLag, descSlotRetain, descSlotWAL, descSlotSafe, descRetryPend, descRetryDead, descRetryOldest} {
		ch <- d
	}
}

func (s *sampled) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	slot, retry := s.slot, s.retry
	s.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	gaugeIf := func(d *prometheus.Desc, v *int64) {
		if v != nil {
			gauge(d, float64(*v))
		}
	}
	if slot != nil {
		active := 0.0
		if slot.Active {
			active = 1
		}
		gauge(descSlotActive, active)
		gaugeIf(descSlotLag, slot.LagBytes)
		gaugeIf(descSlotRetain, slot.RetainedWALBytes)
		gaugeIf(descSlotSafe, slot.SafeWALSizeBytes)
		if slot.WALStatus != "" {
			// Every status, so that an alert on one of them has a series to
			// compare (and a 0 when the slot is fine).
			for _, st := range walStatuses {
				v := 0.0
				if st == slot.WALStatus {
					v = 1
				}
				ch <- prometheus.MustNewConstMetric(descSlotWAL, prometheus.GaugeValue, v, st)
			}
		}
	}
	if retry != nil {
		gauge(descRetryPend, float64(retry.Pending))
		gauge(descRetryDead, float64(retry.Dead))
		oldest := 0.0
		if retry.OldestPendingAgeSeconds != nil {
			oldest = *retry.OldestPendingAgeSeconds
		}
		gauge(descRetryOldest, oldest)
	}
}

// SamplerConfig configures a Sampler. The zero value of every field but Slot
// means its documented default.
type SamplerConfig struct {
	Slot       string        // replication slot; required
	RetryTable string        // default sql.DefaultRetryTable
	Interval   time.Duration // default 10s
	Timeout    time.Duration // per sample, default 5s
	Logger     *slog.Logger  // default discards
}

// A Sampler periodically reads the slot's lag and the figures of the slot's
// rows in the retry table from Postgres into the slot_* and retry_* gauges
// of a Metrics.
type Sampler struct {
	m    *Metrics
	pool *pgxpool.Pool
	cfg  SamplerConfig
}

// NewSampler validates cfg and fills defaults. It neither queries nor starts
// goroutines: call Run.
func NewSampler(m *Metrics, pool *pgxpool.Pool, cfg SamplerConfig) (*Sampler, error) {
	if m == nil || pool == nil {
		return nil, errors.New("metrics sampler: nil metrics or pool")
	}
	if cfg.Slot == "" {
		return nil, errors.New("metrics sampler: slot name is empty")
	}
	if cfg.RetryTable == "" {
		cfg.RetryTable = sql.DefaultRetryTable
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sampler{m: m, pool: pool, cfg: cfg}, nil
}

// Run samples at once and then every Interval until ctx is done, when it
// returns nil. A failed sample is counted (sample_errors_total), logged when
// sampling starts failing and when it recovers, and does not stop Run: the
// relay must not stop streaming because a metric could not be read.
func (s *Sampler) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	failing := false
	for {
		err := s.Sample(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && !failing:
			s.cfg.Logger.Warn("metrics sample failed", "slot", s.cfg.Slot, "err", err)
		case err == nil && failing:
			s.cfg.Logger.Info("metrics sample recovered", "slot", s.cfg.Slot)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Sample reads the slot and the retry table once and updates the gauges. On
// error the gauges it could not read are removed, so that a stale value does
// not look current.
func (s *Sampler) Sample(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	slot, slotErr := pgslot.Read(qctx, s.pool, s.cfg.Slot)
	retry, retryErr := ops.QueryRetry(qctx, s.pool, s.cfg.RetryTable, s.cfg.Slot)
	if err := ctx.Err(); err != nil {
		return err // shutting down: the values read so far stay as they were
	}
	s.m.sampled.mu.Lock()
	s.m.sampled.slot, s.m.sampled.retry = nil, retry
	if slotErr == nil {
		s.m.sampled.slot = &ops.SlotLag{Active: slot.Active, LagBytes: slot.LagBytes,
			RetainedWALBytes: slot.RetainedWALBytes, SafeWALSizeBytes: slot.SafeWALSizeBytes}
		if slot.WALStatus != nil {
			s.m.sampled.slot.WALStatus = *slot.WALStatus
		}
	}
	s.m.sampled.mu.Unlock()
	if err := errors.Join(slotErr, retryErr); err != nil {
		s.m.sampleErrors.Inc()
		return fmt.Errorf("sample slot %q: %w", s.cfg.Slot, err)
	}
	return nil
}
