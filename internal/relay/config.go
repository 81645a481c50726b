package relay

import (
	"errors"
	"fmt"
	"github.com/outbox-relay/outbox-relay/event"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Defaults of Config's zero values, exported for the CLI's key table.
const (
	DefaultMaxInFlightEvents  = 50000
	DefaultMaxInFlightBytes   = 8 << 20
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultStallAfter         = time.Minute
	DefaultCheckpointInterval = 200 * time.Millisecond
	DefaultHistoryInterval    = time.Minute
	DefaultHistoryKeep        = 30 * 24 * time.Hour
)

// Bounds of the in-flight window (Config.MaxInFlightEvents, MaxInFlightBytes).
const (
	MaxInFlightEventsLimit = 10_000_000
	MinInFlightBytes       = 64 << 10
	MaxInFlightBytesLimit  = 16 << 30
)

// Config configures a Relay. Zero values mean the documented defaults.
type Config struct {
	Replication replication.Config // DSN, slot and publication are required
	Table       string             // outbox table, default "public.outbox"
	// Failover (postgres.failover) requires a server that has failover
	// slots (Postgres 17+): refused at start on an older one, since the
	// operator counts on a slot that survives a promotion. A slot that is
	// not a failover slot (made before, or re-created by a refill) is
	// altered at start.
	Failover bool
	// OtherTables holds the operator's decisions for tables whose inserts
	// the relay cannot place by itself (package placement), by
	// "schema.name"; OtherTablesKey names the setting, for messages.
	OtherTables    map[string]placement.Action
	OtherTablesKey string
	Router         router.Config
	Sink           sink.Config

	// Delivery is DeliveryAtLeastOnce (the default) or DeliveryExactlyOnce:
	// the stream's events written in Kafka transactions together with the
	// checkpoint (eos.go); the stream sink must then be transactional, with
	// TransactionalID(slot). CheckpointTopic (default
	// "outbox-relay-checkpoints", compacted, made by setup) holds the
	// checkpoint records. TransactionMaxEvents (default 10000) and
	// TransactionMaxBytes (default 4 MiB) bound a Kafka transaction, which
	// exceeds them only by holding a single larger Postgres transaction.
	Delivery             string
	CheckpointTopic      string
	TransactionMaxEvents int
	TransactionMaxBytes  int

	CheckpointTable    string        // default "outbox_relay_checkpoint"
	CheckpointInterval time.Duration // default 200ms: longest wait between checkpoint saves

	// HistoryInterval is the least time between two rows of the checkpoint
	// history (package checkpoint), default 1m; HistoryKeep how long they
	// are kept, default 30 days. The history table is created at start when
	// missing and the role may.
	HistoryInterval, HistoryKeep time.Duration

	// Retention, when Retention.Retention is set, deletes delivered outbox
	// rows older than that every Retention.Interval (package retention). Its
	// Table, CheckpointTable and Slot are the relay's own and are
	// overwritten. The zero value is off.
	Retention retention.Config

	MaxInFlightEvents int // default 50000: events read but not yet covered by a saved checkpoint
	MaxInFlightBytes  int // default 8 MiB: payload bytes read but not yet acknowledged by Kafka

	// StartLSN, when set, moves the start forward past the saved checkpoint and
	// the slot's position (operator's --start-lsn). Moving backwards behind the
	// slot is refused: the server has already discarded that WAL for this slot.
	StartLSN pglogrepl.LSN
	// StartLSNForce allows a StartLSN beyond the server's current WAL
	// position (operator's --force): every event committed before the WAL
	// reaches it is then skipped for good. Without it such a StartLSN is
	// refused at start-up.
	StartLSNForce bool

	ShutdownTimeout time.Duration // default 30s: drain budget after ctx is cancelled

	// StallAfter is how long the WAL may be ahead of the confirmed LSN with no
	// progress before /readyz, the metrics and the log call the relay stalled.
	// Default 60s.
	StallAfter time.Duration
	Logger     *slog.Logger

	// Metrics, when set, records the pipeline's figures; MetricsListen, when
	// not empty, serves them with /healthz and /readyz (see Relay.Ready).
	Metrics       *metrics.Metrics
	MetricsListen string
	// Spans, when set, exports the span of every acknowledged event that
	// has one (event.Span; Router.Spans mints them), e.g. *tracing.Tracer.
	Spans      SpanExporter
	RetryTable string // default "outbox_relay_retry"

	// Identity is how this relay names itself as leader, in the checkpoint
	// row (what standbys, status and the log show). Default
	// "host <hostname> pid <pid> started <time>".
	Identity string
	// LeaseDuration (default 1s) is how long a proof of leadership lets a
	// leader write, and how long a new leader waits after fencing the former
	// ones before its first write (see lease.go). StandbyPoll (default
	// 250ms) is how often a standby looks whether the slot is free.
	LeaseDuration, StandbyPoll time.Duration

	// OnSlotLoss is what the relay does when the slot does not continue
	// from its checkpoint for a cause a refill heals (dropped, invalidated,
	// recreated, missing after a failover): OnSlotLossFail (the default)
	// stops with the *pgslot.GapError, exit code 4; OnSlotLossRefill
	// refills the uncovered range from the outbox table (refill.go), then
	// streams on from the new slot.
	OnSlotLoss string

	// Retry tunes the retry worker (backoff, maximum age and attempts, poll
	// interval); its Store, Sink, Topic, Delivered and Logger are the
	// relay's own and are overwritten.
	Retry retry.WorkerConfig
}

// validate fills defaults and rejects what cannot work, saying how to fix it.
func (c *Config) validate() error {
	if c.Replication.DSN == "" {
		return errors.New("postgres.dsn is empty: set it in the config file or RELAY_POSTGRES_DSN")
	}
	if c.Replication.Slot == "" {
		c.Replication.Slot = sql.DefaultSlot
	}
	switch c.OnSlotLoss {
	case "":
		c.OnSlotLoss = OnSlotLossFail
	case OnSlotLossFail, OnSlotLossRefill:
	default:
		return fmt.Errorf("postgres.on_slot_loss %q is not one of fail (stop with exit code 4, the default) or refill (re-deliver the lost range from the outbox table, then stream on)", c.OnSlotLoss)
	}
	switch c.Delivery {
	case "":
		c.Delivery = DeliveryAtLeastOnce
	case DeliveryAtLeastOnce, DeliveryExactlyOnce:
	default:
		return fmt.Errorf("relay: delivery %q is not one of %s (the default) or %s", c.Delivery, DeliveryAtLeastOnce, DeliveryExactlyOnce)
	}
	if c.CheckpointTopic == "" {
		c.CheckpointTopic = DefaultCheckpointTopic
	}
	if c.TransactionMaxEvents < 0 || c.TransactionMaxBytes < 0 {
		return errors.New("relay: negative transaction bound: use 0 for the default")
	}
	if c.TransactionMaxEvents == 0 {
		c.TransactionMaxEvents = DefaultTransactionMaxEvents
	}
	if c.TransactionMaxBytes == 0 {
		c.TransactionMaxBytes = DefaultTransactionMaxBytes
	}
	if c.Replication.Publication == "" {
		c.Replication.Publication = sql.DefaultPublication
	}
	if c.Table == "" {
		c.Table = sql.DefaultOutboxTable
	}
	if !strings.Contains(c.Table, ".") {
		c.Table = "public." + c.Table
	}
	if _, err := sql.ParseTable(c.Table); err != nil {
		return fmt.Errorf("relay: outbox table: %w", err)
	}
	for name, a := range c.OtherTables {
		if t, err := sql.ParseTable(name); err != nil || t.Schema == "" {
			return fmt.Errorf("relay: %s: %q is not schema.table: name each table with its schema, as inserts arrive under it", c.OtherTablesKey, name)
		}
		if name == c.Table {
			return fmt.Errorf("relay: %s names the outbox table %s itself: remove it", c.OtherTablesKey, name)
		}
		if a != placement.Deliver && a != placement.Ignore {
			return fmt.Errorf("relay: %s: %s: want deliver or ignore", c.OtherTablesKey, name)
		}
	}
	if c.CheckpointTable == "" {
		c.CheckpointTable = sql.DefaultCheckpointTable
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.HistoryInterval <= 0 {
		c.HistoryInterval = DefaultHistoryInterval
	}
	if c.HistoryKeep <= 0 {
		c.HistoryKeep = DefaultHistoryKeep
	}
	if c.HistoryKeep < c.HistoryInterval {
		return fmt.Errorf("checkpoint.history_keep (%s) is shorter than checkpoint.history_interval (%s): keep at least one interval of history; the default keeps 30 days", c.HistoryKeep, c.HistoryInterval)
	}
	if c.Retention.Retention > 0 {
		c.Retention.Table, c.Retention.CheckpointTable, c.Retention.Slot = c.Table, c.CheckpointTable, c.Replication.Slot
		if err := c.Retention.Validate(); err != nil {
			return err
		}
	}
	if c.MaxInFlightEvents <= 0 {
		c.MaxInFlightEvents = DefaultMaxInFlightEvents
	}
	if c.MaxInFlightBytes <= 0 {
		c.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.StallAfter <= 0 {
		c.StallAfter = DefaultStallAfter
	}
	// The window is memory: bounds that a typo cannot pass (2^63 bytes
	// overflowed the soft memory limit derived from it).
	if c.MaxInFlightEvents > MaxInFlightEventsLimit {
		return fmt.Errorf("pipeline.max_in_flight_events is %d, above the limit of %d: lower it (the default is 50000)", c.MaxInFlightEvents, MaxInFlightEventsLimit)
	}
	if c.MaxInFlightBytes > MaxInFlightBytesLimit || c.MaxInFlightBytes < MinInFlightBytes {
		return fmt.Errorf("pipeline.max_in_flight_bytes is %d: it must be between %d (64 KiB) and %d (16 GiB); the default is 8 MiB", c.MaxInFlightBytes, MinInFlightBytes, MaxInFlightBytesLimit)
	}
	if c.Sink.BatchSize <= 0 {
		c.Sink.BatchSize = 10000
	}
	if c.Sink.BatchBytes <= 0 {
		c.Sink.BatchBytes = 1 << 20
	}
	if c.RetryTable == "" {
		c.RetryTable = sql.DefaultRetryTable
	}
	if c.MetricsListen != "" && c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = fmt.Sprintf("host %s pid %d started %s", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.StandbyPoll <= 0 {
		c.StandbyPoll = DefaultStandbyPoll
	}
	if wst := c.Replication.WalSenderTimeout; wst > 0 && wst <= 2*c.LeaseDuration {
		// A leader that froze must lose the slot only after its lease ran out.
		return fmt.Errorf("postgres.wal_sender_timeout (%s) must be more than twice the leader lease (%s): a frozen leader would lose the slot while it may still write", wst, c.LeaseDuration)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Replication.Logger == nil {
		c.Replication.Logger = c.Logger
	}
	if c.Sink.Logger == nil {
		c.Sink.Logger = c.Logger
	}
	return nil
}

// A SpanExporter exports the spans of events Kafka acknowledged at ack. It
// must not block: the writer calls it between produce rounds.
type SpanExporter interface {
	Delivered(evs []event.Event, ack time.Time)
}
