package replication

import (
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Config configures a Stream. The zero value of every field but DSN, Slot and
// Publication means its documented default.
type Config struct {
	DSN string // ordinary libpq/URL DSN; the stream adds replication=database itself
	// ReplicationDSN, when set, is where the replication connection goes
	// instead of DSN: Postgres itself when DSN is a connection pooler's
	// (ReplicationConnDSN). The stream opens no other connection.
	ReplicationDSN  string
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

	// MaxUnread is the longest the stream leaves its connection unread
	// while the caller does not take the next Batch (default 5s, at most
	// 1 minute). Past it the stream pauses: it reads and drops what the
	// server sends until the caller takes the Batch, then reads the dropped
	// part again (see the package doc). A walsender whose client does not
	// read blocks in its socket write, where Postgres cannot end it: the
	// checkpointer, which ends it to invalidate its slot
	// (max_slot_wal_keep_size), then waits for it, and with it every
	// checkpoint of the server.
	MaxUnread time.Duration

	// ReceiveLinger, when positive, lets transactions that arrive less than
	// this apart be read together: after such a transaction the next read of
	// the connection waits until ReceiveLinger after it, so that a stream of
	// small transactions is read, routed and produced in groups (fewer
	// system calls, wake-ups and produce requests) at the cost of at most
	// this much latency. Sparse and large transactions are read as they
	// come. Zero (the default here; the CLI's is 1ms) reads every message as
	// it comes. At most 100ms.
	ReceiveLinger time.Duration

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

	// MessagePrefixes, when not empty, asks pgoutput for logical decoding
	// messages (its messages option, Postgres 14 and later; Run refuses an
	// older server with ErrMessagesUnsupported) and hands on, as Rows of
	// their transaction, the transactional ones whose prefix is listed.
	// Messages of other prefixes are skipped and counted.
	MessagePrefixes []string
	// NonTransactional is what a non-transactional message with a listed
	// prefix does: such a message is written at once, committed or not
	// (a rolled-back transaction's too), and belongs to no transaction, so
	// it is never handed on. NonTransactionalStop (the default) ends Run
	// with a *NonTransactionalError before anything past it is confirmed;
	// NonTransactionalIgnore skips it, counted (Stats) and logged once.
	NonTransactional string

	Logger *slog.Logger // default discards
}

// ReplicationConnDSN is the DSN of the replication connection:
// ReplicationDSN, or DSN when it is unset.
func (cfg Config) ReplicationConnDSN() string {
	if cfg.ReplicationDSN != "" {
		return cfg.ReplicationDSN
	}
	return cfg.DSN
}

// Values of Config.NonTransactional.
const (
	NonTransactionalStop   = "stop"
	NonTransactionalIgnore = "ignore"
)

// DefaultReceiveLinger is the CLI's postgres.receive_linger (Config's own
// default is 0: read every message as it comes).
const DefaultReceiveLinger = time.Millisecond

// DefaultStatusInterval is Config.StatusInterval's default, and the CLI's
// (postgres.status_interval): well below wal_sender_timeout's default 60s.
const DefaultStatusInterval = 10 * time.Second

// DefaultMaxUnread is Config.MaxUnread's default: long enough that a
// pipeline busy with a backlog or a slow Kafka write never pauses the
// stream, short enough that a checkpoint waiting on the walsender goes on
// within seconds.
const DefaultMaxUnread = 5 * time.Second

// maxMaxUnread is the most Config.MaxUnread may be.
const maxMaxUnread = time.Minute

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
	if cfg.MaxUnread == 0 {
		cfg.MaxUnread = DefaultMaxUnread
	}
	if cfg.WalSenderTimeout > 0 && cfg.StatusInterval > cfg.WalSenderTimeout/3 {
		// A status update well inside the timeout, even if one is late.
		cfg.StatusInterval = cfg.WalSenderTimeout / 3
	}
	if cfg.NonTransactional == "" {
		cfg.NonTransactional = NonTransactionalStop
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
	if cfg.ReceiveLinger < 0 || cfg.ReceiveLinger > 100*time.Millisecond {
		v.Errorf("ReceiveLinger", "%s is outside 0 to 100ms: it is added to the latency of small transactions; 1ms groups them well, 0 reads each as it comes", cfg.ReceiveLinger)
	}
	if cfg.MaxUnread < 0 || cfg.MaxUnread > maxMaxUnread {
		v.Errorf("MaxUnread", "%s is outside 0 (the default, %s) to %s: a walsender whose client does not read cannot exit, and a checkpoint that ends it waits that long", cfg.MaxUnread, DefaultMaxUnread, maxMaxUnread)
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
	seen := map[string]bool{}
	for _, p := range cfg.MessagePrefixes {
		switch {
		case p == "":
			// pg_logical_emit_message refuses an empty prefix.
			v.Errorf("MessagePrefixes", "an empty prefix: Postgres refuses to emit a message without one; name the prefix the application writes")
		case seen[p]:
			v.Errorf("MessagePrefixes", "%q twice: list each prefix once", p)
		case strings.ContainsRune(p, 0):
			v.Errorf("MessagePrefixes", "%q holds a NUL byte, which no prefix can", p)
		}
		seen[p] = true
	}
	if cfg.NonTransactional != NonTransactionalStop && cfg.NonTransactional != NonTransactionalIgnore {
		v.Errorf("NonTransactional", "%q: want %q (stop before it) or %q (skip it)", cfg.NonTransactional, NonTransactionalStop, NonTransactionalIgnore)
	}
	return v.Err()
}
