package relay

import (
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// Config configures a Relay. Zero values mean the documented defaults.
type Config struct {
	Replication replication.Config // DSN, slot and publication are required
	Table       string             // outbox table, default "public.outbox"
	Router      router.Config
	Sink        sink.Config

	CheckpointTable    string        // default "outbox_relay_checkpoint"
	CheckpointInterval time.Duration // default 200ms: longest wait between checkpoint saves

	MaxInFlightEvents int // default 50000: events read but not yet covered by a saved checkpoint
	MaxInFlightBytes  int // default 64 MiB: payload bytes read but not yet acknowledged by Kafka

	// StartLSN, when set, moves the start forward past the saved checkpoint and
	// the slot's position (operator's --start-lsn). Moving backwards behind the
	// slot is refused: the server has already discarded that WAL for this slot.
	StartLSN pglogrepl.LSN

	ShutdownTimeout time.Duration // default 30s: drain budget after ctx is cancelled
	Logger          *slog.Logger
}
