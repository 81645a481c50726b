package replication

import (
	"log/slog"
	"time"
)

// Config configures a Stream. The zero value of every field but DSN, Slot and
// Publication means its documented default.
type Config struct {
	DSN             string        // ordinary libpq/URL DSN; the stream adds replication=database itself
	Slot            string        // existing logical slot using pgoutput (created by `setup`)
	Publication     string        // publication covering the outbox table(s)
	ApplicationName string        // default "outbox-relay"; shows in pg_stat_replication
	StatusInterval  time.Duration // default 10s: standby status cadence and receive deadline
	MaxBatchRows    int           // default 1000 rows per Batch
	MaxBatchBytes   int           // default 1 MiB of values per Batch
	ReconnectMin    time.Duration // default 100ms
	ReconnectMax    time.Duration // default 10s
	Logger          *slog.Logger  // default discards
}
