package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// A setting is one configuration key: everything the command line knows of
// it. The loader, the environment variable (envName), the flag, the
// unknown-key check, the mapping of a package's *field.Error back to the key,
// config.example.yaml and the reference in docs/configuration.md all come
// from settings. Adding a setting is one entry here plus its field in the
// owning package's Config (see docs/contributing.md).
type setting struct {
	key  string
	def  string // the default as an operator writes it; "" for none
	kind kind   // how the value is read
	// doc says what it is, in Markdown: the reference's row, and (as plain
	// text) its comment in config.example.yaml.
	doc string
	// shown is the reference's default column when the default is not def
	// as it is ("(required)", "the layout's").
	shown string
	// example is config.example.yaml's value when not def: for the keys
	// without a default. The hint for such a key, left empty, shows it too.
	example string
	// flag names a flag every command takes for it, with its help.
	flag, usage string
	// entry describes a map's entries ("aggregate_type: topic"); example
	// is then its variable's form ("Order=orders,Payment=payments").
	entry string
	// field is where the value goes: a field of a package's Config (within
	// the relay's) or one of cmd's own. A package's *field.Error naming that
	// field is reported under this key. nil for an ignored key.
	field func(c *config) any
}

// kind is how a setting's text is read.
type kind uint8

const (
	text       kind = iota // trimmed
	lower                  // trimmed, folded to lower case
	secret                 // as written: a password may begin or end with a space
	duration               // Go's form or days (parseDuration)
	off                    // a duration, or "" / "off" for 0
	integer                // a whole number (int or int64 field)
	boolean                // true or false
	negated                // true or false, stored negated (idempotence → DisableIdempotence)
	list                   // a YAML list, or a comma-separated string
	headers                // a list; "-" for none, "" for the default
	fields                 // router.ParseFields
	mapping                // a map of name: value, case kept
	placements             // a map of schema.table: deliver|ignore
	tables                 // outbox.tables: a list of objects (tables.go)
	ignored                // accepted for compatibility, warned about, unused
	size                   // bytes: 1GB, 512MB, 64kB (Postgres's units, ×1024) or a number; "off" or 0 for 0 (int64 field)
)

// settings lists every key, in the order of config.example.yaml and of the
// reference. Generated from it (go generate ./cmd/outbox-relay):
// config.example.yaml and docs/configuration.md's reference tables.
//
//go:generate go test -run ^TestSettingsGenerated$ -update .
var settings = []setting{
	{key: "postgres.dsn", def: "", kind: text,
		doc:     "where the outbox lives; the role needs `LOGIN`, `REPLICATION` and the grants of `setup --print-sql`, never superuser (see [Security](security.md)). Leave the password out. A password in a URL must be URL-encoded (`@` as `%40`, `/` as `%2F`, `?` as `%3F`, `%` as `%25`); a DSN that does not parse, or whose `@` shows an unencoded password, fails at start, shown only up to its user name, before anything is dialled. TLS: `sslmode=verify-full sslrootcert=… [sslcert=… sslkey=…]`, libpq style",
		example: "postgres://relay@localhost:5432/app?sslmode=disable", flag: "postgres-dsn", usage: "Postgres DSN; prefer RELAY_POSTGRES_DSN, flags show in ps", shown: "(required)",
		field: func(c *config) any { return &c.Replication.DSN }},
	{key: "postgres.replication_dsn", def: "", kind: text,
		doc:   "where the replication connection (and the few checks that must reach Postgres itself) connect when `postgres.dsn` points at a connection pooler such as PgBouncer, which cannot carry logical replication: Postgres directly, same database and role; empty: `postgres.dsn` serves both (see [Connection poolers](poolers.md)). Same rules for passwords as `postgres.dsn`",
		field: func(c *config) any { return &c.Replication.ReplicationDSN }},
	{key: "postgres.password_file", def: "", kind: text,
		doc:   "a file holding only the Postgres password (one trailing newline ignored), e.g. a mounted Kubernetes secret; or `RELAY_POSTGRES_PASSWORD`. There is no `postgres.password` key (see [Passwords](security.md#passwords))",
		field: func(c *config) any { return &c.PasswordFile }},
	{key: "postgres.slot", def: sql.DefaultSlot, kind: text,
		doc:  "the logical replication slot (pgoutput), created by `setup`; lower-case letters, digits and underscores",
		flag: "slot", usage: "replication slot",
		field: func(c *config) any { return &c.Replication.Slot }},
	{key: "postgres.publication", def: sql.DefaultPublication, kind: text,
		doc:  "the publication of the outbox table, inserts only, created by `setup`",
		flag: "publication", usage: "publication",
		field: func(c *config) any { return &c.Replication.Publication }},
	{key: "postgres.status_interval", def: durationText(replication.DefaultStatusInterval), kind: duration,
		doc:   "standby status cadence (how often the relay confirms its position when nothing else prompts it; also the receive deadline); capped at a third of `postgres.wal_sender_timeout`",
		field: func(c *config) any { return &c.Replication.StatusInterval }},
	{key: "postgres.wal_sender_timeout", def: durationText(replication.DefaultWalSenderTimeout), kind: duration,
		doc:   "sent as `wal_sender_timeout` for the relay's own replication connection: a leader silent this long (frozen, cut off) loses the slot to a standby (see [Running highly available](high-availability.md)); 3s or more",
		field: func(c *config) any { return &c.Replication.WalSenderTimeout }},
	{key: "postgres.receive_linger", def: durationText(replication.DefaultReceiveLinger), kind: duration,
		doc:   "when transactions arrive less than this apart, the next read of the replication connection waits until this long after the last one, so that many small transactions are read, routed and produced together (fewer system calls, wake-ups and produce requests; at 5,000 one-event transactions per second it cut the relay's CPU per event by 28%, see [Performance](performance.md#where-the-time-goes)); adds at most this to their commit → ack latency, nothing to sparse or large transactions; `0s` reads every message as it comes; at most `100ms`",
		field: func(c *config) any { return &c.Replication.ReceiveLinger }},
	{key: "postgres.failover", def: "false", kind: boolean,
		doc:   "make the slot a failover slot (Postgres 17+; refused on older): synced to standbys, so the relay goes on after a promotion. Needs settings on the primary and the standbys, which `check` verifies (see [When the primary fails over](failover.md#when-the-primary-fails-over))",
		field: func(c *config) any { return &c.Failover }},
	{key: "postgres.on_slot_loss", def: relay.OnSlotLossFail, kind: lower,
		doc:   "when the slot does not continue from the checkpoint (dropped, invalidated by `max_slot_wal_keep_size`, missing after a failover): `fail` exits 4 and names the fix; `refill` does what `outbox-relay recover` does (re-delivers the lost range from the outbox table, creates the slot again) and streams on. See [When the slot is lost or replaced](failover.md#when-the-slot-is-lost-or-replaced)",
		field: func(c *config) any { return &c.OnSlotLoss }},
	{key: "postgres.max_retained_wal", def: "1GB", kind: size,
		doc:   "the most WAL the relay makes Postgres keep for its slot while it cannot deliver (Kafka away, a topic refused, the relay behind): past half of it the relay keeps reading, stores what it read in its WAL buffer table in Postgres, confirms the slot past it, and delivers it first, in commit order, when Kafka is back; `off` or `0`: hold the slot instead. With `delivery: exactly-once` the events that go through the buffer are delivered at least once, marked `outbox-relay-delivery: at-least-once`. See [The WAL buffer](wal-buffer.md)",
		field: func(c *config) any { return &c.MaxRetainedWAL }},
	{key: "outbox.table", def: sql.DefaultOutboxTable, kind: text,
		doc:  `table or schema.table, exact (case-sensitive) names; may be partitioned (see [Partitioned outbox tables](outbox-table.md#partitioned-outbox-tables))`,
		flag: "outbox-table", usage: "outbox table, table or schema.table",
		field: func(c *config) any { return &c.Table }},
	{key: "outbox.tables", def: "", kind: tables, shown: "none",
		doc:   "more outbox tables read on the same slot and publication, each `{table: schema.name, layout: …, columns: {…}, topics: {…}, message: {…}}` with the settings of its own; it takes `topics.*` and `message.*` from the top level unless it sets them, its columns and `message.headers` from its own layout. `RELAY_OUTBOX_TABLES` takes the list as YAML or JSON. See [Several outbox tables](outbox-table.md#several-outbox-tables-one-relay)",
		entry: "{table: schema.name, …}",
		field: func(c *config) any { return &c.Tables }},
	{key: "outbox.source", def: relay.SourceTable, kind: lower,
		doc:   "where events come from: `table` (inserts into `outbox.table`), `messages` (transactional `pg_logical_emit_message` messages with a prefix of `outbox.messages.prefixes`, Postgres 14+; `outbox.table` is then the optional archive that `replay` and `recover` read) or `both`. See [A table-less outbox: logical decoding messages](outbox-table.md#a-table-less-outbox-logical-decoding-messages)",
		field: func(c *config) any { return &c.Source }},
	{key: "outbox.messages.prefixes", def: relay.DefaultMessagePrefix, kind: list,
		doc:   "with `outbox.source` `messages` or `both`: the prefixes of the messages that are events (a YAML list, or one comma-separated string); messages of other prefixes are skipped",
		field: func(c *config) any { return &c.Replication.MessagePrefixes }},
	{key: "outbox.messages.non_transactional", def: replication.NonTransactionalStop, kind: lower,
		doc:   "a non-transactional message with one of the prefixes is written whether its transaction commits or not, so it is never sent: `stop` (the relay stops before it, saying so, and confirms nothing past it) or `ignore` (skipped, counted in `ignored_changes_total{kind=\"non_transactional_message\"}`, logged once)",
		field: func(c *config) any { return &c.Replication.NonTransactional }},
	{key: "outbox.other_tables", def: "{}", kind: placements,
		entry: "schema.table: deliver|ignore", example: "public.outbox_2026_01=deliver,public.audit=ignore",
		doc:   "what inserts under another table's name are, when the relay cannot tell by itself: `schema.table: deliver` (outbox events) or `ignore`; `RELAY_OUTBOX_OTHER_TABLES=public.outbox_2026_01=deliver`. See [When an insert arrives under another name](outbox-table.md#when-an-insert-arrives-under-another-name)",
		field: func(c *config) any { return &c.OtherTables }},
	{key: "outbox.layout", def: string(sql.LayoutRelay), kind: text,
		doc:   "column-name preset: `relay` (`id`, `aggregate_type`, `aggregate_id`, `event_type`, `payload`, `headers`) or `debezium` (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`, no headers column)",
		field: func(c *config) any { return &c.Layout }},
	{key: "outbox.columns.id", def: "", kind: text,
		doc:   "the event id column: the Kafka header `id`",
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.ID }},
	{key: "outbox.columns.aggregate_type", def: "", kind: text,
		doc:   `chooses the topic`,
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.AggregateType }},
	{key: "outbox.columns.aggregate_id", def: "", kind: text,
		doc:   `the Kafka key: per-aggregate order`,
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.AggregateID }},
	{key: "outbox.columns.event_type", def: "", kind: text,
		doc:   "the Kafka header `event_type`; needed only when the `event_type` header or an `{event_type}` topic template reads it, as Debezium's router; `\"-\"` for none",
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.EventType }},
	{key: "outbox.columns.payload", def: "", kind: text,
		doc:   `the Kafka value, bytes as stored`,
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.Payload }},
	{key: "outbox.columns.headers", def: "", kind: text,
		doc:   "a JSON object of extra headers (see [Headers](outbox-table.md#headers)); `\"-\"` for a table without one",
		shown: "the layout's",
		field: func(c *config) any { return &c.Router.Columns.Headers }},
	{key: "outbox.columns.timestamp", def: "", kind: text,
		doc:   "a `timestamp` or `timestamptz` column for the message timestamp; none: the send time",
		field: func(c *config) any { return &c.Router.Columns.Timestamp }},
	{key: "outbox.columns.tracing_span_context", def: "", kind: text,
		doc:   "a text column with the row's trace context as Java properties text (`traceparent=…`, `tracestate=…`), Debezium's `tracingspancontext`: sent as the W3C `traceparent` and `tracestate` headers (see [Trace context](outbox-table.md#trace-context))",
		field: func(c *config) any { return &c.Router.Columns.TracingSpanContext }},
	{key: "outbox.retention", def: "", kind: off,
		doc:   "delete delivered rows older than this (`7d`, `12h`), see [Retention](retention-and-replay.md#retention); `\"\"`, `0` or `off` keeps every row",
		shown: "`\"\"` (off)",
		field: func(c *config) any { return &c.Retention.Retention }},
	{key: "outbox.retention_interval", def: durationText(retention.DefaultInterval), kind: duration,
		doc:   `how often a cleanup round starts (counted from the end of the last one)`,
		field: func(c *config) any { return &c.Retention.Interval }},
	{key: "outbox.retention_batch_size", def: strconv.Itoa(retention.DefaultBatchSize), kind: integer,
		doc:   `rows per DELETE (1–100000), each its own transaction`,
		field: func(c *config) any { return &c.Retention.BatchSize }},
	{key: "outbox.retention_pause", def: durationText(retention.DefaultPause), kind: duration,
		doc:   `pause between batches`,
		field: func(c *config) any { return &c.Retention.Pause }},
	{key: "outbox.retention_statement_timeout", def: durationText(retention.DefaultStatementTimeout), kind: duration,
		doc:   "the statement timeout of each batch (set locally in its transaction)",
		field: func(c *config) any { return &c.Retention.StatementTimeout }},
	{key: "outbox.retention_partitions", def: string(retention.PartitionsDelete), kind: lower,
		doc:   "on an outbox partitioned `BY RANGE (created_at)`: `delete` rows, or `drop`/`detach` whole partitions once every row in them is delivered and older than the retention, see [On a partitioned outbox](retention-and-replay.md#on-a-partitioned-outbox)",
		field: func(c *config) any { return &c.Retention.Partitions }},
	{key: "outbox.retention_ignore_slots", def: "", kind: list,
		doc:   "logical slots of the database (or other relays' checkpoint rows) that do not read the outbox table: retention does not wait for them. Retention keeps every row another slot has not passed, see [Other readers of the outbox](retention-and-replay.md#other-readers-of-the-outbox) (a YAML list, or one comma-separated string)",
		field: func(c *config) any { return &c.Retention.IgnoreSlots }},
	{key: "message.headers", def: "", kind: headers,
		doc:   "the relay's own headers, comma-separated; `-` for none",
		shown: "the layout's: `id,event_type,aggregate_type` (relay), `id` (debezium)",
		field: func(c *config) any { return &c.Router.Headers }},
	{key: "message.fields", def: "", kind: fields,
		doc:   "more columns as headers or envelope fields, Debezium's syntax: `type:header:eventType,tenant:envelope`",
		field: func(c *config) any { return &c.Router.Fields }},
	{key: "message.converter", def: string(router.ConverterString), kind: text,
		doc:   "`string` (key and payload as stored, like StringConverter) or `json` (like JsonConverter with `schemas.enable=false`)",
		field: func(c *config) any { return &c.Router.Converter }},
	{key: "message.tombstone_on_empty_payload", def: "false", kind: boolean,
		doc:   `a NULL or blank payload is sent as a Kafka null value`,
		field: func(c *config) any { return &c.Router.TombstoneOnEmptyPayload }},
	{key: "message.format", def: "plain", kind: lower,
		doc:   "`plain` (the payload as the value, the headers above) or `cloudevents` (CloudEvents 1.0 in the Kafka protocol binding, see [CloudEvents](outbox-table.md#cloudevents))",
		field: func(c *config) any { return &c.Format }},
	{key: "message.cloudevents.mode", def: string(router.CloudEventsBinary), kind: lower,
		doc:   "`binary` (attributes as `ce_*` headers, the payload as the value) or `structured` (the whole event as JSON, `application/cloudevents+json`)",
		field: func(c *config) any { return &c.Router.CloudEvents.Mode }},
	{key: "message.cloudevents.source", def: "", kind: text,
		doc:   "the `source` attribute: a URI-reference naming where the events come from, e.g. `/orders-service/outbox`; none: `/outbox-relay/<outbox.table>`",
		field: func(c *config) any { return &c.Router.CloudEvents.Source }},
	{key: "message.cloudevents.content_type", def: "", kind: text,
		doc:   "the `datacontenttype` attribute; by default `application/json` for json and jsonb, `application/octet-stream` for bytea, `text/plain; charset=utf-8` for text",
		shown: "from the payload column's type",
		field: func(c *config) any { return &c.Router.CloudEvents.ContentType }},
	{key: "topics.template", def: router.DefaultTopic, kind: text,
		doc:   "the topic of an event; `{event_type}` may be used too",
		field: func(c *config) any { return &c.Router.Topic }},
	{key: "topics.overrides", def: "{}", kind: mapping,
		entry: "aggregate_type: topic", example: "Order=orders,Payment=payments",
		doc:   "an exact aggregate type → topic, bypassing the template; `RELAY_TOPICS_OVERRIDES=Payment=payments,Order=orders`",
		field: func(c *config) any { return &c.Router.Overrides }},
	{key: "topics.regex", def: "", kind: text,
		doc:   "route as Debezium's `route.topic.regex`/`route.topic.replacement` instead of the template: an aggregate type the regex matches whole goes to `topics.replacement`, others to a topic named as the aggregate type; both or neither",
		field: func(c *config) any { return &c.Router.TopicRegex }},
	{key: "topics.replacement", def: "", kind: text,
		doc:   "the topic for `topics.regex` (`$1`, `${name}`)",
		field: func(c *config) any { return &c.Router.TopicReplacement }},
	{key: "kafka.brokers", def: "", kind: list,
		doc:     "`host:port` list (a YAML list, or one comma-separated string)",
		example: "localhost:9092", flag: "kafka-brokers", usage: "comma-separated host:port list", shown: "(required)",
		field: func(c *config) any { return &c.Sink.Brokers }},
	{key: "kafka.client_id", def: kafkaclient.DefaultClientID, kind: text,
		doc:   `the client id the brokers see`,
		field: func(c *config) any { return &c.Sink.ClientID }},
	{key: "kafka.batch_size", def: strconv.Itoa(kafkaclient.DefaultBatchSize), kind: integer,
		doc:   `most messages per produce round (a record batch per partition, one request per broker); 1–1000000, checked at start-up`,
		field: func(c *config) any { return &c.Sink.BatchSize }},
	{key: "kafka.batch_bytes", def: strconv.Itoa(kafkaclient.DefaultBatchBytes), kind: integer,
		doc:   `most bytes per produce round, and the largest message sent; 65536–2147483647, checked at start-up`,
		field: func(c *config) any { return &c.Sink.BatchBytes }},
	{key: "kafka.batch_timeout", def: "2ms", kind: ignored,
		doc: "accepted for compatibility and ignored, with a warning at start: each produce round is sent at once, nothing lingers"},
	{key: "kafka.write_timeout", def: durationText(kafkaclient.DefaultWriteTimeout), kind: duration,
		doc:   `how long one produce request may take`,
		field: func(c *config) any { return &c.Sink.WriteTimeout }},
	{key: "kafka.topic_wait", def: durationText(kafkaclient.DefaultTopicWait), kind: duration,
		doc:   "how long a produce round waits for a topic Kafka does not know yet but may be creating (auto-creation on, or a topic just created whose leaders do not serve it yet); then its events wait in the retry table, and other topics are not held up longer",
		field: func(c *config) any { return &c.Sink.TopicWait }},
	{key: "kafka.compression", def: kafkaclient.DefaultCompression, kind: lower,
		doc:   "`none`, `gzip`, `snappy`, `lz4`, `zstd`; idempotent either way",
		field: func(c *config) any { return &c.Sink.Compression }},
	{key: "kafka.idempotence", def: "true", kind: negated,
		doc:   "the idempotent producer: a produce whose acknowledgement was lost is sent again with the same producer id and sequence numbers and the broker stores it once (see [Guarantees](guarantees.md)); needs the `IdempotentWrite` cluster permission on Kafka before 3.0 (from 3.0 `WRITE` on a topic implies it). `false`: no producer id, and a lost acknowledgement can store a batch twice, after the events that followed it",
		field: func(c *config) any { return &c.Sink.DisableIdempotence }},
	{key: "kafka.max_in_flight_requests", def: strconv.Itoa(kafkaclient.DefaultMaxInFlight), kind: integer,
		doc:   "chunks the relay hands the producer ahead of their acknowledgement, 1–5 (as the Java producer's `max.in.flight.requests.per.connection`): the route stage goes on while Kafka answers. The producer writes them in order, one produce round at a time, so that an event Kafka refuses is never overtaken by a later event of its aggregate (see [Guarantees](guarantees.md)); within a round the idempotent producer keeps up to five requests in flight per broker, one with `kafka.idempotence: false`. `1` is stop-and-wait",
		field: func(c *config) any { return &c.Sink.MaxInFlight }},
	{key: "kafka.checkpoint_topic", def: relay.DefaultCheckpointTopic, kind: text,
		doc:   "with `delivery: exactly-once`: the compacted topic of the relay's checkpoint records, one per slot (key = slot), written in each Kafka transaction; `setup` creates it (one partition, `cleanup.policy=compact`). The principal needs `READ`, `WRITE` and `DESCRIBE` on it",
		field: func(c *config) any { return &c.CheckpointTopic }},
	{key: "kafka.transaction_timeout", def: durationText(kafkaclient.DefaultTransactionTimeout), kind: duration,
		doc:   "with `delivery: exactly-once`: how long the transaction coordinator lets a transaction stay open before it aborts it (`transaction.timeout.ms`; at most the broker's `transaction.max.timeout.ms`, 15 minutes by default). A Postgres transaction that takes longer to write is aborted by the broker: the relay reports it (not ready, stalled), writes it again once with the timeout raised to the broker's cap, or stops with the fix, exit 6 (see [Exactly once](guarantees.md#exactly-once))",
		field: func(c *config) any { return &c.Sink.TransactionTimeout }},
	{key: "kafka.transaction_max_events", def: strconv.Itoa(relay.DefaultTransactionMaxEvents), kind: integer,
		doc:   "with `delivery: exactly-once`: the most events of one Kafka transaction (it holds whole Postgres transactions: a larger one is alone in its transaction)",
		field: func(c *config) any { return &c.TransactionMaxEvents }},
	{key: "kafka.transaction_max_bytes", def: strconv.Itoa(relay.DefaultTransactionMaxBytes), kind: integer,
		doc:   "with `delivery: exactly-once`: the most payload bytes of one Kafka transaction, as above; at least 65536",
		field: func(c *config) any { return &c.TransactionMaxBytes }},
	{key: "kafka.allow_auto_topic_creation", def: strconv.FormatBool(defaultAllowAutoTopicCreation), kind: boolean,
		doc:   "as with Debezium, works with brokers that auto-create topics; an auto-created topic gets the broker's defaults (often one partition), so in production create your topics and set `false`: an event for a missing topic then waits in the retry table until it exists",
		field: func(c *config) any { return &c.Sink.AllowAutoTopicCreation }},
	{key: "kafka.tls.enabled", def: "false", kind: boolean,
		doc:   `TLS to the brokers (see [Encryption](security.md#encryption))`,
		field: func(c *config) any { return &c.Sink.TLS.Enabled }},
	{key: "kafka.tls.ca_file", def: "", kind: text,
		doc:   `PEM CA certificates; none: the system's roots`,
		field: func(c *config) any { return &c.Sink.TLS.CAFile }},
	{key: "kafka.tls.cert_file", def: "", kind: text,
		doc:   "client certificate for mTLS: set with `kafka.tls.key_file`, or neither",
		field: func(c *config) any { return &c.Sink.TLS.CertFile }},
	{key: "kafka.tls.key_file", def: "", kind: text,
		doc:   `the client certificate's key`,
		field: func(c *config) any { return &c.Sink.TLS.KeyFile }},
	{key: "kafka.tls.insecure_skip_verify", def: "false", kind: boolean,
		doc:   `do not verify the brokers' certificates: anyone on the path could then read and change what is sent`,
		field: func(c *config) any { return &c.Sink.TLS.InsecureSkipVerify }},
	{key: "kafka.tls.server_name", def: "", kind: text,
		doc:   "the name to verify in the brokers' certificates, when not the host of `kafka.brokers`",
		field: func(c *config) any { return &c.Sink.TLS.ServerName }},
	{key: "kafka.sasl.mechanism", def: "", kind: lower,
		doc:   "`plain`, `scram-sha-256` or `scram-sha-512` (with a username and password); `oauthbearer` (with `kafka.sasl.oauth_token_file` or `kafka.sasl.oauth_token_command`); `aws_msk_iam` (Amazon MSK's IAM access control, with AWS credentials from the environment: see [Security](security.md#sasl-mechanisms)); none: no SASL",
		field: func(c *config) any { return &c.Sink.SASL.Mechanism }},
	{key: "kafka.sasl.username", def: "", kind: text,
		doc:   `the SASL user`,
		field: func(c *config) any { return &c.Sink.SASL.Username }},
	{key: "kafka.sasl.password", def: "", kind: secret,
		doc:   "the SASL password; discouraged in the file: use `kafka.sasl.password_file` or the variable; not both",
		field: func(c *config) any { return &c.Sink.SASL.Password }},
	{key: "kafka.sasl.password_file", def: "", kind: text,
		doc:   `a file holding only the SASL password (one trailing newline ignored)`,
		field: func(c *config) any { return &c.SASLPasswordFile }},
	{key: "kafka.sasl.oauth_token_file", def: "", kind: text,
		doc:   "with `oauthbearer`: a file holding the token (a JWT or an opaque token), read again for every connection, so whatever renews it (a Kubernetes projected service-account token, an identity agent) is followed without a restart; it must be readable at start. Not with `kafka.sasl.oauth_token_command`",
		field: func(c *config) any { return &c.Sink.SASL.OAuthTokenFile }},
	{key: "kafka.sasl.oauth_token_command", def: "", kind: text,
		doc:   "with `oauthbearer`: a command (run by `/bin/sh -c`) that prints the token on its standard output; run again a minute before the token's `exp`, within 30s. Not with `kafka.sasl.oauth_token_file`",
		field: func(c *config) any { return &c.Sink.SASL.OAuthTokenCommand }},
	{key: "delivery", def: relay.DeliveryAtLeastOnce, kind: lower,
		doc:   "`at-least-once`, or `exactly-once`: each batch of whole Postgres transactions is written in one Kafka transaction together with the checkpoint (`kafka.checkpoint_topic`), and a consumer with `isolation.level=read_committed` reads every event once, across crashes, outages and takeovers; the retry table, `replay` and a refill stay at least once and say so in a header. Needs `kafka.idempotence: true`, Kafka 2.5 or later, and the `TransactionalId` ACLs of [Least privilege](security.md#least-privilege). What holds in each mode, how it is tested and what it costs: [Guarantees](guarantees.md#exactly-once)",
		field: func(c *config) any { return &c.Delivery }},
	{key: "pipeline.max_in_flight_events", def: strconv.Itoa(relay.DefaultMaxInFlightEvents), kind: integer,
		doc:   `events read but not yet covered by a saved checkpoint: what a crash can resend (plus the transaction being read); 1 to 10,000,000`,
		field: func(c *config) any { return &c.MaxInFlightEvents }},
	{key: "pipeline.max_in_flight_bytes", def: strconv.Itoa(relay.DefaultMaxInFlightBytes), kind: integer,
		doc:   "payload bytes read but not yet acknowledged by Kafka, each event counting 512 bytes more for what the relay holds of it besides: bounds memory; the Go heap gets a soft limit of 32 MiB + 2 × this unless `GOMEMLIMIT` is set; 65536 (64 KiB) to 17179869184 (16 GiB)",
		field: func(c *config) any { return &c.MaxInFlightBytes }},
	{key: "pipeline.max_procs", def: "1", kind: integer,
		doc:   "CPUs that run the relay's Go code at once (Go's `GOMAXPROCS`, which wins when set); `0`: one per CPU, Go's default. One is enough: one slot's walsender delivers less than one core of the relay can handle, and beside Postgres and Kafka a second one made the relay slower and dearer, spinning and waking threads (on the 2-core bench: 16.9 → 11.3 CPU-s per million one-event transactions and 40,426 → 55,925 events/s drained, [Performance](performance.md#where-the-time-goes)); 0 to 1024",
		field: func(c *config) any { return &c.MaxProcs }},
	{key: "pipeline.shutdown_timeout", def: durationText(relay.DefaultShutdownTimeout), kind: duration,
		doc:   `drain budget after SIGTERM`,
		field: func(c *config) any { return &c.ShutdownTimeout }},
	{key: "health.stall_after", def: durationText(relay.DefaultStallAfter), kind: duration,
		doc:   "how long the WAL may be ahead of the confirmed position with no progress before `/readyz`, `outbox_relay_stalled_seconds` and the log call the relay stalled",
		field: func(c *config) any { return &c.StallAfter }},
	{key: "health.stop_linger", def: durationText(5 * time.Minute), kind: duration,
		doc:   "after `run` stops for what only an operator can fix (a slot gap with `postgres.on_slot_loss: fail`, an insert it must stop before, a pgoutput message it cannot decode), how long it stays up not ready (`/readyz` 503 naming the cause, `outbox_relay_ready` 0, `outbox_relay_slot_gap` 1, the slot's gauges such as `outbox_relay_slot_wal_status` sampled on) so that Prometheus and Kubernetes see why, before it exits with its code (4 for a gap); SIGTERM exits at once with the same code; `0s` exits at once; only with `metrics.listen` set. See [When the slot is lost or replaced](failover.md#when-the-slot-is-lost-or-replaced)",
		field: func(c *config) any { return &c.StopLinger }},
	{key: "checkpoint.table", def: sql.DefaultCheckpointTable, kind: text,
		doc:   `the relay's checkpoint table (table or schema.table): one row per slot, so relays of other slots may share it`,
		field: func(c *config) any { return &c.CheckpointTable }},
	{key: "checkpoint.interval", def: durationText(relay.DefaultCheckpointInterval), kind: duration,
		doc:   `longest wait between checkpoint saves while events flow`,
		field: func(c *config) any { return &c.CheckpointInterval }},
	{key: "checkpoint.history_interval", def: durationText(relay.DefaultHistoryInterval), kind: duration,
		doc:   "a checkpoint history row at most this often while checkpoints move (table `<checkpoint.table>_history`: replay maps LSNs to rows with it, retention knows what is delivered)",
		field: func(c *config) any { return &c.HistoryInterval }},
	{key: "checkpoint.history_keep", def: daysText(relay.DefaultHistoryKeep), kind: duration,
		doc:   `how long history rows are kept (the newest always is)`,
		field: func(c *config) any { return &c.HistoryKeep }},
	{key: "retry.table", def: sql.DefaultRetryTable, kind: text,
		doc:   `failed events, see [Failed events: the retry table](operating.md#failed-events-the-retry-table); each row names its slot, so relays of other slots (other services) may share the table: see [Relays sharing a database](operating.md#relays-sharing-a-database)`,
		field: func(c *config) any { return &c.RetryTable }},
	{key: "retry.backoff_min", def: durationText(retry.DefaultBackoffMin), kind: duration,
		doc:   `the first wait after a failed attempt: exponential backoff with jitter between attempts`,
		field: func(c *config) any { return &c.Retry.BackoffMin }},
	{key: "retry.backoff_max", def: durationText(retry.DefaultBackoffMax), kind: duration,
		doc:   `the longest wait between attempts`,
		field: func(c *config) any { return &c.Retry.BackoffMax }},
	{key: "retry.max_age", def: durationText(retry.DefaultMaxAge), kind: duration,
		doc:   `a row still failing this long after its first failure is dead`,
		field: func(c *config) any { return &c.Retry.MaxAge }},
	{key: "retry.max_attempts", def: "0", kind: integer,
		doc:   "attempts before a row is dead; `0`: no limit (`retry.max_age` still applies)",
		field: func(c *config) any { return &c.Retry.MaxAttempts }},
	{key: "retry.poll_interval", def: durationText(retry.DefaultPollInterval), kind: duration,
		doc:   `how often the worker looks for due rows`,
		field: func(c *config) any { return &c.Retry.PollInterval }},
	{key: "metrics.listen", def: "127.0.0.1:9187", kind: text,
		doc:  "`\"\"` disables `/metrics`, `/healthz`, `/readyz` (see [Metrics and health](operating.md#metrics-and-health))",
		flag: "metrics-listen", usage: "metrics address; \"\" disables",
		field: func(c *config) any { return &c.MetricsListen }},
	{key: "tracing.otlp_endpoint", def: "", kind: text,
		doc:   "the OpenTelemetry collector's OTLP/HTTP receiver (`http://host:4318` plaintext, `https://host:4318` TLS; spans are POSTed to `/v1/traces` under it) to export one span per delivered event that carries a trace context (see [Trace context](outbox-table.md#trace-context)); the relay does not speak OTLP/gRPC (port 4317)",
		shown: "`\"\"` (off)",
		field: func(c *config) any { return &c.Tracing.OTLPEndpoint }},
	{key: "tracing.service_name", def: "outbox-relay", kind: text,
		doc:   "the spans' `service.name`",
		field: func(c *config) any { return &c.Tracing.ServiceName }},
	{key: "log.level", def: "info", kind: lower,
		doc:  "`debug`, `info`, `warn` or `error`",
		flag: "log-level", usage: "debug, info, warn or error",
		field: func(c *config) any { return &c.Log.Level }},
	{key: "log.format", def: "text", kind: lower,
		doc:  "`text`, or `json` for machines",
		flag: "log-format", usage: "text or json",
		field: func(c *config) any { return &c.Log.Format }},
}

// defaultAllowAutoTopicCreation is the operator's default for
// kafka.allow_auto_topic_creation: true, as Debezium's producer does, so that
// a relay pointed at a broker with auto.create.topics.enable (the demo, the
// compose file, most development clusters) delivers without anyone creating
// topics first. kafkaclient.Config's zero value is false, and its doc gives the
// reason to choose false in production: a topic auto-created with the
// broker's defaults (often one partition) silently loses the partitioning
// consumers expect. Operators who create their topics set it to false, and
// then a missing topic waits in the retry table instead.
const defaultAllowAutoTopicCreation = true

// settingOf returns the setting of key, or nil.
func settingOf(key string) *setting {
	for i := range settings {
		if settings[i].key == key {
			return &settings[i]
		}
	}
	return nil
}

// envName is the environment variable overriding key.
func envName(key string) string {
	return "RELAY_" + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// isMap reports whether the setting's value is a map (its keys are names
// whose case matters, read apart from viper, which folds them).
func (s *setting) isMap() bool { return s.kind == mapping || s.kind == placements }

// durationText writes d as an operator would in the config file: 10s, 5m,
// 24h, 1h30m (time.Duration's String adds "0s" and "0m").
func durationText(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// daysText writes a whole number of days as parseDuration reads it: 30d.
func daysText(d time.Duration) string {
	if d%day != 0 {
		return durationText(d)
	}
	return strconv.FormatInt(int64(d/day), 10) + "d"
}
