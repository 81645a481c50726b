package relay

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Defaults of Config's zero values.
const (
	DefaultMaxInFlightEvents  = 50000
	DefaultMaxInFlightBytes   = 8 << 20
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultStallAfter         = time.Minute
	DefaultCheckpointInterval = 200 * time.Millisecond
	DefaultHistoryInterval    = time.Minute
	DefaultHistoryKeep        = 30 * 24 * time.Hour
)

// An OutboxTable is one more outbox table of Config.Tables: its name
// (table or schema.table, public by default) and how its rows are routed.
type OutboxTable struct {
	Table  string
	Router router.Config
}

// outbox is one outbox table as the relay reads it: the first is Table
// with Router, then Tables.
type outbox struct {
	name   string // schema.table
	router router.Config
}

// outboxes lists every outbox table, Table first. Validated names.
func (c *Config) outboxes() []outbox {
	out := []outbox{{name: c.Table, router: c.Router}}
	for _, t := range c.Tables {
		out = append(out, outbox{name: t.Table, router: t.Router})
	}
	return out
}

// routers returns a new router per outbox table, as outboxes.
func (c *Config) routers() ([]*router.Router, error) {
	var out []*router.Router
	for _, o := range c.outboxes() {
		rt, err := router.New(o.router)
		if err != nil {
			return nil, fmt.Errorf("outbox table %s: %w", o.name, err)
		}
		out = append(out, rt)
	}
	return out, nil
}

// Values of Config.Source.
const (
	SourceTable    = "table"
	SourceMessages = "messages"
	SourceBoth     = "both"
)

// DefaultMessagePrefix is the default of Replication.MessagePrefixes when
// the source includes messages.
const DefaultMessagePrefix = "outbox"

// readsTable and readsMessages say what the source includes.
func (c *Config) readsTable() bool    { return c.Source != SourceMessages }
func (c *Config) readsMessages() bool { return c.Source == SourceMessages || c.Source == SourceBoth }

// ErrOutboxMissing is wrapped by Run's error when the outbox table does not
// exist.
var ErrOutboxMissing = errors.New("outbox table does not exist")

// ErrWALLevel is Run's error when the slot does not exist and the server's
// wal_level is below logical, so that setup could not create it either.
var ErrWALLevel = errors.New("wal_level is not logical")

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
	// Source says where events come from: SourceTable (the default:
	// inserts into Table), SourceMessages (transactional logical decoding
	// messages with one of Replication.MessagePrefixes, default
	// DefaultMessagePrefix, whose content the router reads as a row,
	// router.RouteMessage; Table is then only the optional archive that
	// refill and replay read), or SourceBoth. With SourceTable,
	// Replication.MessagePrefixes is cleared.
	Source string
	// Tables are more outbox tables, read on the same slot and publication
	// as Table: each with its own routing (columns, topics, message
	// options), its events in commit order with every other table's, per
	// aggregate in order within the table. Table and Router are the first
	// outbox; a name may appear once.
	Tables []OutboxTable
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
	Sink           kafkaclient.Config

	// Delivery is DeliveryAtLeastOnce (the default) or DeliveryExactlyOnce:
	// the stream's events written in Kafka transactions together with the
	// checkpoint (package eos); the stream sink must then be transactional, with
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
	MaxInFlightBytes  int // default 8 MiB: payload bytes read but not yet acknowledged by Kafka, plus 512 per event

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
	// StopLinger is how long Run, stopped for what only an operator can fix
	// (a slot gap it does not refill, an insert it must stop before), keeps
	// serving /metrics, /healthz and /readyz (503, naming the cause) before
	// it returns that error: so that Prometheus scrapes slot_gap 1 and the
	// stop counters, and Kubernetes sees a pod not ready rather than one that
	// exits within 50 ms and crash-loops. Cancelling ctx ends the wait at
	// once, with the same error. 0 (the default) returns at once; it applies
	// only when MetricsListen is set.
	StopLinger time.Duration
	Logger     *slog.Logger

	// Metrics, when set, records the pipeline's figures; MetricsListen, when
	// not empty, serves them with /healthz and /readyz (see Relay.Ready).
	Metrics       *metrics.Metrics
	MetricsListen string
	// Spans, when set, exports the span of every acknowledged event that
	// has one (event.Span; Router.Spans mints them), e.g. *tracing.Tracer.
	Spans SpanExporter
	// StageTrace, when set, gets a line per chunk the pipeline delivered
	// whole, with the times of its stages (stages.go): for benchmarks
	// finding where commit→ack goes. Nil costs nothing.
	StageTrace io.Writer
	RetryTable string // default "outbox_relay_retry"

	// Identity is how this relay names itself as leader, in the checkpoint
	// row (what standbys, status and the log show). Default
	// "host <hostname> pid <pid> started <time>".
	Identity string
	// LeaseDuration (default 1s) is how long a proof of leadership lets a
	// leader write, and how long a new leader waits after fencing the former
	// ones before its first write (see package leader). StandbyPoll (default
	// 250ms) is how often a standby looks whether the slot is free.
	LeaseDuration, StandbyPoll time.Duration

	// OnSlotLoss is what the relay does when the slot does not continue
	// from its checkpoint for a cause a refill heals (dropped, invalidated,
	// recreated, missing after a failover): OnSlotLossFail (the default)
	// stops with the *pgslot.GapError, exit code 4; OnSlotLossRefill
	// refills the uncovered range from the outbox table (refill.go), then
	// streams on from the new slot.
	OnSlotLoss string

	// MaxRetainedWAL bounds, in bytes, the WAL the slot makes the server
	// keep while delivery is blocked (package walbuffer): past
	// walbuffer.EnterFraction of it the relay buffers what it reads in the
	// WAL buffer table and confirms the slot past it. 0: off (the slot holds
	// the WAL until Kafka takes the events). Not applied with exactly-once
	// delivery.
	MaxRetainedWAL int64

	// Retry tunes the retry worker (backoff, maximum age and attempts, poll
	// interval); its Store, Sink, Topic, Delivered and Logger are the
	// relay's own and are overwritten.
	Retry retry.WorkerConfig
}

// Validate fills defaults and returns every value that cannot work, each a
// *field.Error naming its field (Sink.BatchBytes, Retention.Interval, …) and
// the fix: the relay's own fields and those of the configurations it holds.
// It reads the Sink's TLS files and connects nowhere. New calls it.
func (c *Config) Validate() error {
	var v field.Checker
	v.Add(c.validate())
	v.Add(field.Within("Replication", c.Replication.Validate()))
	v.Add(field.Within("Router", c.Router.Validate()))
	for i := range c.Tables {
		v.Add(field.Within(fmt.Sprintf("Tables[%d].Router", i), c.Tables[i].Router.Validate()))
	}
	v.Add(field.Within("Sink", c.Sink.Validate()))
	v.Add(field.Within("Retention", c.Retention.Validate()))
	v.Add(field.Within("Retry", c.Retry.Validate()))
	return v.Err()
}

// validate fills the defaults of the relay's own fields and checks them: what
// the pipeline needs before the configurations it holds are built.
func (c *Config) validate() error {
	var v field.Checker
	field.Default(&c.Replication.Slot, sql.DefaultSlot)
	field.Default(&c.Replication.Publication, sql.DefaultPublication)
	field.OneOf(&v, "OnSlotLoss", &c.OnSlotLoss, OnSlotLossFail, OnSlotLossFail, OnSlotLossRefill)
	if n := c.MaxRetainedWAL; n != 0 && n < 1<<20 {
		v.Errorf("MaxRetainedWAL", "%d bytes is out of range; use at least 1MB (1GB is a good start), or 0 for off", n)
	}
	field.OneOf(&v, "Source", &c.Source, SourceTable, SourceTable, SourceMessages, SourceBoth)
	switch {
	case !c.readsMessages():
		c.Replication.MessagePrefixes = nil
	case len(c.Replication.MessagePrefixes) == 0:
		c.Replication.MessagePrefixes = []string{DefaultMessagePrefix}
	}
	field.OneOf(&v, "Delivery", &c.Delivery, DeliveryAtLeastOnce, DeliveryAtLeastOnce, DeliveryExactlyOnce)
	if c.Delivery == DeliveryExactlyOnce && c.Sink.DisableIdempotence {
		v.Errorf("Delivery", "exactly-once needs the idempotent producer: enable it ({Sink.DisableIdempotence}), or deliver %s", DeliveryAtLeastOnce)
	}
	field.Default(&c.CheckpointTopic, DefaultCheckpointTopic)
	field.Positive(&v, "TransactionMaxEvents", &c.TransactionMaxEvents, DefaultTransactionMaxEvents)
	field.Positive(&v, "TransactionMaxBytes", &c.TransactionMaxBytes, DefaultTransactionMaxBytes)
	if n := c.TransactionMaxBytes; n > 0 && n < MinInFlightBytes {
		v.Errorf("TransactionMaxBytes", "%d is out of range; use at least %d (64 KiB) (default %d)", n, MinInFlightBytes, DefaultTransactionMaxBytes)
	}
	c.validateTables(&v)
	field.Default(&c.CheckpointTable, sql.DefaultCheckpointTable)
	if _, err := sql.ParseTable(c.CheckpointTable); err != nil {
		v.Errorf("CheckpointTable", "%v", err)
	}
	field.Positive(&v, "CheckpointInterval", &c.CheckpointInterval, DefaultCheckpointInterval)
	field.Positive(&v, "HistoryInterval", &c.HistoryInterval, DefaultHistoryInterval)
	field.Positive(&v, "HistoryKeep", &c.HistoryKeep, DefaultHistoryKeep)
	if c.HistoryKeep > 0 && c.HistoryKeep < c.HistoryInterval {
		v.Errorf("HistoryKeep", "%s is shorter than {HistoryInterval} (%s); keep at least one interval of history (the default keeps 30 days)", c.HistoryKeep, c.HistoryInterval)
	}
	// The retention's tables and slot are the relay's own.
	c.Retention.Table, c.Retention.CheckpointTable, c.Retention.Slot = c.Table, c.CheckpointTable, c.Replication.Slot
	field.Positive(&v, "MaxInFlightEvents", &c.MaxInFlightEvents, DefaultMaxInFlightEvents)
	field.Positive(&v, "MaxInFlightBytes", &c.MaxInFlightBytes, DefaultMaxInFlightBytes)
	// The window is memory: bounds that a typo cannot pass (2^63 bytes
	// overflowed the soft memory limit derived from it).
	if n := c.MaxInFlightEvents; n > MaxInFlightEventsLimit {
		v.Errorf("MaxInFlightEvents", "%d is out of range; allowed 1 to %d (default %d)", n, MaxInFlightEventsLimit, DefaultMaxInFlightEvents)
	}
	if n := c.MaxInFlightBytes; n > 0 && (n < MinInFlightBytes || n > MaxInFlightBytesLimit) {
		v.Errorf("MaxInFlightBytes", "%d is out of range; allowed %d (64 KiB) to %d (16 GiB) (default %d)", n, MinInFlightBytes, MaxInFlightBytesLimit, DefaultMaxInFlightBytes)
	}
	field.Positive(&v, "ShutdownTimeout", &c.ShutdownTimeout, DefaultShutdownTimeout)
	field.Positive(&v, "StallAfter", &c.StallAfter, DefaultStallAfter)
	field.Default(&c.Sink.BatchSize, kafkaclient.DefaultBatchSize)
	field.Default(&c.Sink.BatchBytes, kafkaclient.DefaultBatchBytes)
	field.Default(&c.Sink.MaxInFlight, kafkaclient.DefaultMaxInFlight)
	field.Default(&c.RetryTable, sql.DefaultRetryTable)
	if _, err := sql.ParseTable(c.RetryTable); err != nil {
		v.Errorf("RetryTable", "%v", err)
	}
	if c.MetricsListen != "" && c.Metrics == nil {
		c.Metrics = metrics.New()
	}
	if c.Identity == "" {
		host, _ := os.Hostname()
		c.Identity = fmt.Sprintf("host %s pid %d started %s", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	}
	field.Positive(&v, "LeaseDuration", &c.LeaseDuration, leader.DefaultLeaseDuration)
	field.Positive(&v, "StandbyPoll", &c.StandbyPoll, leader.DefaultStandbyPoll)
	if wst := c.Replication.WalSenderTimeout; wst > 0 && wst <= 2*c.LeaseDuration {
		// A leader that froze must lose the slot only after its lease ran out.
		v.Errorf("Replication.WalSenderTimeout", "%s is too short: a frozen leader must lose the slot only after its write lease ({LeaseDuration}, %s) ran out; use more than twice the lease (default %s)",
			wst, c.LeaseDuration, replication.DefaultWalSenderTimeout)
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
	return v.Err()
}

// validateTables fills and checks the outbox tables (Table, Tables) and the
// tables the placer is told of (OtherTables): each schema-qualified, named
// once, and read only with a source that reads tables.
func (c *Config) validateTables(v *field.Checker) {
	field.Default(&c.Table, sql.DefaultOutboxTable)
	if !strings.Contains(c.Table, ".") {
		c.Table = "public." + c.Table
	}
	if _, err := sql.ParseTable(c.Table); err != nil {
		v.Errorf("Table", "%v", err)
	}
	seen := map[string]bool{c.Table: true}
	for i := range c.Tables {
		t := &c.Tables[i]
		name := fmt.Sprintf("Tables[%d].Table", i)
		if t.Table == "" {
			v.Add(field.Required(name, "name the outbox table"))
			continue
		}
		if !strings.Contains(t.Table, ".") {
			t.Table = "public." + t.Table
		}
		if _, err := sql.ParseTable(t.Table); err != nil {
			v.Errorf(name, "%v", err)
		} else if seen[t.Table] {
			v.Errorf(name, "%s is named twice: list each outbox table once", t.Table)
		} else if _, other := c.OtherTables[t.Table]; other {
			v.Errorf(name, "%s is also in {OtherTables}: remove it there", t.Table)
		}
		seen[t.Table] = true
	}
	if len(c.Tables) > 0 && !c.readsTable() {
		v.Errorf("Tables", "lists outbox tables but {Source} is %s: read tables too (%s), or remove the list", c.Source, SourceBoth)
	}
	for name, a := range c.OtherTables {
		if t, err := sql.ParseTable(name); err != nil || t.Schema == "" {
			v.Errorf("OtherTables", "%q is not schema.table: name each table with its schema, as inserts arrive under it", name)
		} else if name == c.Table {
			v.Errorf("OtherTables", "names the outbox table %s itself: remove it", name)
		} else if a != placement.Deliver && a != placement.Ignore {
			v.Errorf("OtherTables", "%s: want deliver or ignore", name)
		}
	}
}

// A SpanExporter exports the spans of events Kafka acknowledged at ack. It
// must not block: the writer calls it between produce rounds.
type SpanExporter interface {
	Delivered(evs []event.Event, ack time.Time)
}
