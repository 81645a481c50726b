package replication

import (
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
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

	// WalSenderTimeout is sent as wal_sender_timeout for this connection
	// (Postgres 12 and later let a connection set it): the server ends a
	// walsender whose client has not replied for that long, which frees the
	// slot for a standby relay when this process freezes or loses its
	// network. Default 10s; a negative value keeps the server's setting
	// (60s by default). StatusInterval is capped at a third of it.
	WalSenderTimeout time.Duration

	// Started, if set, is called from Run's goroutine each time
	// START_REPLICATION succeeded: this process holds the slot. A leader
	// fences former leaders there, before anything is delivered.
	Started func()

	// Idle, if set, receives the positions the stream may confirm while
	// nothing is in flight (a primary keepalive's WAL end, DESIGN invariant
	// 3), instead of the stream confirming them itself: the caller records
	// one and then Confirms it. The relay saves it as its checkpoint first,
	// so that its checkpoint explains every position the slot was ever
	// confirmed to (DESIGN invariant 14; pgslot.Verify). Called from Run's
	// goroutine; it must not block.
	Idle func(pglogrepl.LSN)

	// Server, if set, is the server the caller checked its checkpoint
	// against (pgslot.Verify): every connection must reach the same system
	// on a WAL that contains the confirmed position. Unset, the server of
	// the first connection is the reference for the later ones.
	Server *pgslot.Server

	Logger *slog.Logger // default discards
}

// DefaultStatusInterval is Config.StatusInterval's default, and the CLI's
// (postgres.status_interval): well below wal_sender_timeout's default 60s.
const DefaultStatusInterval = 10 * time.Second

// DefaultWalSenderTimeout is Config.WalSenderTimeout's default, and the
// CLI's (postgres.wal_sender_timeout).
const DefaultWalSenderTimeout = 10 * time.Second

// Defaults of the other fields of Config, as documented there.
const (
	defaultApplicationName  = "outbox-relay"
	defaultMaxBatchRows     = 1000
	defaultMaxBatchBytes    = 1 << 20
	defaultReconnectMin     = 100 * time.Millisecond
	defaultReconnectMax     = 10 * time.Second
	defaultWalSenderTimeout = 10 * time.Second
)

// withDefaults returns cfg with every zero field set to its default. It never
// fails, so that New needs no error; validate reports what cannot be defaulted.
func (cfg Config) withDefaults() Config {
	if cfg.ApplicationName == "" {
		cfg.ApplicationName = defaultApplicationName
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.MaxBatchRows == 0 {
		cfg.MaxBatchRows = defaultMaxBatchRows
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = defaultMaxBatchBytes
	}
	if cfg.ReconnectMin == 0 {
		cfg.ReconnectMin = defaultReconnectMin
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = defaultReconnectMax
	}
	if cfg.WalSenderTimeout == 0 {
		cfg.WalSenderTimeout = DefaultWalSenderTimeout
	}
	if cfg.WalSenderTimeout > 0 && cfg.StatusInterval > cfg.WalSenderTimeout/3 {
		// A status update well inside the timeout, even if one is late.
		cfg.StatusInterval = cfg.WalSenderTimeout / 3
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return cfg
}

// Validate fills defaults and returns every value that cannot work, each a
// *field.Error naming its field and the fix. Run checks the same.
func (cfg *Config) Validate() error {
	*cfg = cfg.withDefaults()
	return cfg.validate()
}

// validate rejects what has no default, saying how to fix it.
func (cfg Config) validate() error {
	var v field.Checker
	if cfg.DSN == "" {
		v.Add(field.Required("DSN", "set the Postgres connection string"))
	}
	// START_REPLICATION takes the slot name unquoted, so only the
	// characters Postgres allows in slot names may pass.
	if err := sql.ValidSlotName(cfg.Slot); err != nil {
		v.Errorf("Slot", "%v", err)
	}
	if cfg.Publication == "" {
		v.Add(field.Required("Publication", "name the publication of the outbox table"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"StatusInterval", cfg.StatusInterval}, {"ReconnectMin", cfg.ReconnectMin}, {"ReconnectMax", cfg.ReconnectMax}} {
		if d.v < 0 {
			v.Errorf(d.name, "%s must not be negative", d.v)
		}
	}
	if cfg.ReconnectMax < cfg.ReconnectMin {
		v.Errorf("ReconnectMax", "%s is below {ReconnectMin} %s", cfg.ReconnectMax, cfg.ReconnectMin)
	}
	if cfg.WalSenderTimeout > 0 && cfg.WalSenderTimeout < time.Second {
		v.Errorf("WalSenderTimeout", "%s is below 1s: Postgres counts it in milliseconds but a pause of the relay (GC, a slow disk) would end its connection", cfg.WalSenderTimeout)
	}
	if cfg.MaxBatchRows < 0 {
		v.Errorf("MaxBatchRows", "%d must not be negative", cfg.MaxBatchRows)
	}
	if cfg.MaxBatchBytes < 0 {
		v.Errorf("MaxBatchBytes", "%d must not be negative", cfg.MaxBatchBytes)
	}
	return v.Err()
}
