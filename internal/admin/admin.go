// Package admin prepares, examines and changes what the relay keeps in
// Postgres and Kafka: Setup creates what is missing (the `outbox-relay setup`
// command), Check runs the preflight checks (`outbox-relay check`), PlanSkip
// and Skip.Apply move a checkpoint forward (`outbox-relay checkpoint set`),
// and TakeOver starts the relay's checkpoint where Debezium stopped
// (`outbox-relay migrate debezium --takeover`). They take their names from a
// Config; Setup, Check and TakeOver write one line per finding for people.
// The CLI only loads the configuration, calls them and prints.
//
// Names travel to the catalog as query parameters; only DDL built by package
// sql puts them into SQL text. Every line written is escaped
// (ops.Printable): names from the configuration and the catalog, and server
// messages, may hold control characters.
package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Config names what Setup creates and Check examines. Names are validated by
// the caller (the CLI's configuration); empty names are errors, not defaults.
type Config struct {
	DSN string
	// ReplicationDSN is postgres.replication_dsn: where replication
	// connections go, "" for DSN (see ReplicationConnDSN).
	ReplicationDSN string
	Slot           string
	Publication    string
	// Failover is postgres.failover: setup makes the slot a failover slot
	// (Postgres 17+), check verifies the primary's and standbys' side.
	Failover    bool
	OutboxTable sql.Table
	// MessagesOnly: the relay reads logical decoding messages only
	// (outbox.source messages): the outbox table is then the optional
	// archive, and the publication must cover no table the relay would
	// read inserts of. Messages (messages or both) needs Postgres 14+.
	MessagesOnly, Messages bool
	Layout                 sql.Layout  // the outbox.layout preset: setup's table types
	Columns                sql.Columns // empty fields: the layout's
	// Router is the relay's routing: the columns it reads (check and
	// setup compare them with the table, as run does at start).
	Router router.Config
	// Tables are more outbox tables (outbox.tables), read on the same
	// slot: setup creates (with createOutbox) and publishes each, check
	// checks each.
	Tables          []Table
	CheckpointTable sql.Table
	RetryTable      sql.Table
	Kafka           kafkaclient.Config // the settings Check's Kafka connects with, for its messages
	// ExactlyOnce is delivery: exactly-once. Setup then creates
	// CheckpointTopic with Topics, and Check checks that the principal may
	// write it in transactions under TransactionalID's prefix.
	ExactlyOnce     bool
	CheckpointTopic string
	TransactionalID string
	Topics          TopicCreator // nil without ExactlyOnce
	// Retention is outbox.retention (0: off): Check then checks what it
	// needs of the outbox table.
	Retention time.Duration
	// RetentionPartitions is outbox.retention_partitions: with drop or
	// detach, Check also checks the partitioning and ownership they need.
	RetentionPartitions retention.PartitionMode
	// MaxRetainedWAL is postgres.max_retained_wal (0: off): Check reports
	// it against max_slot_wal_keep_size; Setup creates the WAL buffer
	// table either way.
	MaxRetainedWAL int64

	// RedactedDSN is DSN without its password, for messages.
	RedactedDSN string
	// Scrub removes secrets from an error's text before it is written or
	// returned (libraries echo what they were given). Default: unchanged.
	Scrub func(error) error
	// Fix, when set, says how to fix an error a package returned, in the
	// command line's words (which command, flag or key); "" for none.
	Fix func(error) string
	// Text, when set, is an error's text as the operator reads it: a
	// *field.Error of the relay's Config under its key. Default: Error().
	Text func(error) string
}

// A Table is one more outbox table: its name, its layout and columns (what
// setup creates), and its routing (the columns the relay reads).
type Table struct {
	Name    sql.Table
	Layout  sql.Layout
	Columns sql.Columns
	Router  router.Config
}

func (c *Config) text(err error) string {
	if c.Text == nil {
		return err.Error()
	}
	return c.Text(err)
}

func (c *Config) scrub(err error) error {
	if c.Scrub == nil || err == nil {
		return err
	}
	return c.Scrub(err)
}

// ReplicationConnDSN is the DSN of replication connections, and of the checks
// that must reach Postgres itself: ReplicationDSN, or DSN when it is unset.
func (c *Config) ReplicationConnDSN() string {
	if c.ReplicationDSN != "" {
		return c.ReplicationDSN
	}
	return c.DSN
}

func (c *Config) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := sqlconn.Connect(ctx, c.DSN)
	if err != nil {
		return nil, fmt.Errorf("connect to postgres %s: %w", c.RedactedDSN, err)
	}
	return conn, nil
}

// A TopicCreator creates a compacted topic of one partition and says whether
// it did (false, nil: it exists): sink.Kafka's CreateCompactedTopic. It blocks
// until the broker answers or ctx is done.
type TopicCreator interface {
	CreateCompactedTopic(ctx context.Context, topic string) (created bool, err error)
}
