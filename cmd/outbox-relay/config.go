package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// defaults lists every scalar config key with its default ("" for none). It
// is the one list of keys: env binding, unknown-key detection, the flags'
// help and the test of config.example.yaml all read it. topics.overrides, a
// map, is handled apart.
//
// A default owned by a package is taken from that package's exported
// constant; the CLI's own (metrics, log, the auto-creation choice) are
// defined here.
var defaults = map[string]string{
	"postgres.dsn": "",
	// Secrets are read from files (Kubernetes secret volumes) or the
	// environment; postgres.password is deliberately not a key, so that no
	// config file ever needs to hold one (see secrets.go).
	"postgres.password_file":   "",
	"postgres.slot":            sql.DefaultSlot,
	"postgres.publication":     sql.DefaultPublication,
	"postgres.status_interval": durationText(replication.DefaultStatusInterval),
	"postgres.failover":        "false", // failover slots (Postgres 17+): need settings on the primary and the standbys
	// How long the server waits for a silent relay (frozen, cut off) before
	// it frees the slot for a standby: sent per connection.
	"postgres.wal_sender_timeout": durationText(replication.DefaultWalSenderTimeout),
	// What run does when the slot does not continue from the checkpoint
	// (dropped, invalidated, lost in a failover): fail (exit 4) or refill.
	"postgres.on_slot_loss": relay.OnSlotLossFail,
	"outbox.table":          sql.DefaultOutboxTable,
	"outbox.layout":         string(sql.LayoutRelay),
	// Retention is off by default: deleting rows is the operator's choice.
	"outbox.retention":                   "",
	"outbox.retention_interval":          durationText(retention.DefaultInterval),
	"outbox.retention_batch_size":        strconv.Itoa(retention.DefaultBatchSize),
	"outbox.retention_pause":             durationText(retention.DefaultPause),
	"outbox.retention_statement_timeout": durationText(retention.DefaultStatementTimeout),
	"outbox.retention_partitions":        string(retention.PartitionsDelete),
	// The columns' defaults are the layout's (sql.Layout.Columns): empty
	// here, filled in validate.
	"outbox.columns.id":                   "",
	"outbox.columns.aggregate_type":       "",
	"outbox.columns.aggregate_id":         "",
	"outbox.columns.event_type":           "",
	"outbox.columns.payload":              "",
	"outbox.columns.headers":              "",
	"outbox.columns.timestamp":            "",
	"outbox.columns.tracing_span_context": "",
	"message.headers":                     "", // the layout's: layoutHeaders
	"message.fields":                      "",
	"message.converter":                   string(router.ConverterString),
	"message.tombstone_on_empty_payload":  "false",
	"message.format":                      "plain",
	"message.cloudevents.mode":            string(router.CloudEventsBinary),
	"message.cloudevents.source":          "", // /outbox-relay/<outbox.table>
	"message.cloudevents.content_type":    "",
	"topics.template":                     router.DefaultTopic,
	"topics.regex":                        "",
	"topics.replacement":                  "",
	"kafka.brokers":                       "",
	"kafka.client_id":                     sink.DefaultClientID,
	"kafka.batch_size":                    strconv.Itoa(sink.DefaultBatchSize),
	"kafka.batch_bytes":                   strconv.Itoa(sink.DefaultBatchBytes),
	"kafka.batch_timeout":                 durationText(sink.DefaultBatchTimeout),
	"kafka.write_timeout":                 durationText(sink.DefaultWriteTimeout),
	"kafka.compression":                   sink.DefaultCompression,
	"kafka.allow_auto_topic_creation":     strconv.FormatBool(defaultAllowAutoTopicCreation),
	"kafka.idempotence":                   "true",
	"kafka.checkpoint_topic":              relay.DefaultCheckpointTopic,
	"kafka.transaction_timeout":           durationText(sink.DefaultTransactionTimeout),
	"kafka.transaction_max_events":        strconv.Itoa(relay.DefaultTransactionMaxEvents),
	"kafka.transaction_max_bytes":         strconv.Itoa(relay.DefaultTransactionMaxBytes),
	"delivery":                            relay.DeliveryAtLeastOnce,
	"kafka.tls.enabled":                   "false",
	"kafka.tls.ca_file":                   "",
	"kafka.tls.cert_file":                 "",
	"kafka.tls.key_file":                  "",
	"kafka.tls.insecure_skip_verify":      "false",
	"kafka.tls.server_name":               "",
	"kafka.sasl.mechanism":                "",
	"kafka.sasl.username":                 "",
	"kafka.sasl.password":                 "", // RELAY_KAFKA_SASL_PASSWORD; prefer kafka.sasl.password_file
	"kafka.sasl.password_file":            "",
	"pipeline.max_in_flight_events":       strconv.Itoa(relay.DefaultMaxInFlightEvents),
	"pipeline.max_in_flight_bytes":        strconv.Itoa(relay.DefaultMaxInFlightBytes),
	"pipeline.shutdown_timeout":           durationText(relay.DefaultShutdownTimeout),
	"health.stall_after":                  durationText(relay.DefaultStallAfter),
	"checkpoint.table":                    sql.DefaultCheckpointTable,
	"checkpoint.interval":                 durationText(relay.DefaultCheckpointInterval),
	"checkpoint.history_interval":         durationText(relay.DefaultHistoryInterval),
	"checkpoint.history_keep":             daysText(relay.DefaultHistoryKeep),
	"retry.table":                         sql.DefaultRetryTable,
	"retry.backoff_min":                   durationText(retry.DefaultBackoffMin),
	"retry.backoff_max":                   durationText(retry.DefaultBackoffMax),
	"retry.max_age":                       durationText(retry.DefaultMaxAge),
	"retry.max_attempts":                  "0", // no limit: retry.WorkerConfig's zero value
	"retry.poll_interval":                 durationText(retry.DefaultPollInterval),
	"metrics.listen":                      "127.0.0.1:9187",
	"tracing.otlp_endpoint":               "",
	"tracing.service_name":                "outbox-relay",
	"log.level":                           "info",
	"log.format":                          "text",
}

// defaultAllowAutoTopicCreation is the operator's default for
// kafka.allow_auto_topic_creation: true, as Debezium's producer does, so that
// a relay pointed at a broker with auto.create.topics.enable (the demo, the
// compose file, most development clusters) delivers without anyone creating
// topics first. sink.Config's zero value is false, and its doc gives the
// reason to choose false in production: a topic auto-created with the
// broker's defaults (often one partition) silently loses the partitioning
// consumers expect. Operators who create their topics set it to false, and
// then a missing topic waits in the retry table instead.
const defaultAllowAutoTopicCreation = true

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

// The keys whose values are maps, handled apart from defaults: their keys
// are names (aggregate types, tables) whose case matters.
const (
	overridesKey   = "topics.overrides"
	otherTablesKey = "outbox.other_tables"
)

// mapKeys describes each map key: what its entries are, for messages.
var mapKeys = map[string]struct{ entry, example string }{
	overridesKey:   {"aggregate_type: topic", "Order=orders,Payment=payments"},
	otherTablesKey: {"schema.table: deliver|ignore", "public.outbox_2026_01=deliver,public.audit=ignore"},
}

// envName is the environment variable overriding key.
func envName(key string) string {
	return "RELAY_" + strings.ToUpper(strings.NewReplacer(".", "_").Replace(key))
}

// config is the operator's configuration, as typed values.
type config struct {
	kafkaOptional bool // the command never talks to Kafka
	Postgres      struct {
		// DSN is the connection string every command connects with. When
		// the password comes from postgres.password_file or
		// RELAY_POSTGRES_PASSWORD, validate adds it to DSN as a parameter
		// (withPassword), so DSN must never be printed: redactDSN renders it.
		DSN, Slot, Publication string
		PasswordFile           string
		StatusInterval         time.Duration
		WalSenderTimeout       time.Duration
		// Failover: the slot is a failover slot (Postgres 17+), synced
		// to the standbys, so that it survives a promotion.
		Failover   bool
		OnSlotLoss string // relay.OnSlotLossFail or relay.OnSlotLossRefill
	}
	Outbox struct {
		Table string
		// OtherTables: the operator's word on tables whose inserts the
		// relay cannot place by itself (package placement).
		OtherTables map[string]placement.Action
		Layout      sql.Layout
		Columns     router.Columns // validate fills the empty ones from Layout
		// Retention 0 is off.
		Retention, RetentionInterval              time.Duration
		RetentionBatchSize                        int
		RetentionPause, RetentionStatementTimeout time.Duration
		RetentionPartitions                       retention.PartitionMode
	}
	Message struct {
		Headers   []string // nil: the layout's (layoutHeaders)
		Fields    []router.Field
		Converter router.Converter
		Tombstone bool
		Format    string // plain or cloudevents
		// CloudEvents' Mode is the mode to use when Format is cloudevents.
		CloudEvents router.CloudEvents
	}
	Topics struct {
		Template, Regex, Replacement string
		Overrides                    map[string]string
	}
	Kafka struct {
		Brokers                    []string
		ClientID                   string
		BatchSize                  int
		BatchBytes                 int64
		BatchTimeout, WriteTimeout time.Duration
		Compression                string
		AllowAutoTopicCreation     bool
		Idempotence                bool
		CheckpointTopic            string
		TransactionTimeout         time.Duration
		TransactionMaxEvents       int
		TransactionMaxBytes        int
		TLS                        sink.TLSConfig
		SASL                       sink.SASLConfig
		SASLPasswordFile           string
	}
	Delivery string
	Pipeline struct {
		MaxInFlightEvents, MaxInFlightBytes int
		ShutdownTimeout                     time.Duration
	}
	Checkpoint struct {
		Table                                  string
		Interval, HistoryInterval, HistoryKeep time.Duration
	}
	Retry struct {
		Table                                     string
		BackoffMin, BackoffMax, MaxAge, PollEvery time.Duration
		MaxAttempts                               int
	}
	Health  struct{ StallAfter time.Duration }
	Metrics struct{ Listen string }
	Tracing struct{ OTLPEndpoint, ServiceName string }
	Log     struct{ Level, Format string }
}

// loadConfig reads the config file (if any), the RELAY_* environment and the
// flags bound to keys in flags, in increasing precedence, and validates the
// result. Nothing here connects anywhere.
func loadConfig(file string, flags *pflag.FlagSet) (*config, error) {
	return loadConfigFor(file, flags, true)
}

// loadConfigFor is loadConfig for a command that may not talk to Kafka at all
// (lag, status, retries list): then kafka.brokers may be left empty.
func loadConfigFor(file string, flags *pflag.FlagSet, needKafka bool) (*config, error) {
	v := viper.New()
	v.SetEnvPrefix("RELAY")
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	// An empty RELAY_METRICS_LISTEN must be able to disable metrics.
	v.AllowEmptyEnv(true)
	for key, def := range defaults {
		v.SetDefault(key, def)
		if err := v.BindEnv(key); err != nil {
			return nil, err
		}
	}
	for key, name := range flagKeys {
		if f := flags.Lookup(name); f != nil {
			if err := v.BindPFlag(key, f); err != nil {
				return nil, err
			}
		}
	}

	maps := map[string]map[string]string{}
	if file != "" {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("config file: %w", err)
		}
		// viper folds keys to lower case, which would corrupt the
		// aggregate types in topics.overrides and hide typos of upper-case
		// keys: the file is walked here for both.
		if maps, err = checkKeys(raw); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		v.SetConfigFile(file)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	for key := range mapKeys {
		if env, ok := os.LookupEnv(envName(key)); ok {
			m, err := parseMapEnv(key, env)
			if err != nil {
				return nil, err
			}
			maps[key] = m
		}
	}

	l := loader{v: v}
	c := &config{}
	c.Postgres.DSN = l.str("postgres.dsn")
	c.Postgres.PasswordFile = l.str("postgres.password_file")
	c.Postgres.Slot = l.str("postgres.slot")
	c.Postgres.Publication = l.str("postgres.publication")
	c.Postgres.StatusInterval = l.duration("postgres.status_interval")
	c.Postgres.WalSenderTimeout = l.duration("postgres.wal_sender_timeout")
	c.Postgres.Failover = l.bool("postgres.failover")
	c.Postgres.OnSlotLoss = strings.ToLower(l.str("postgres.on_slot_loss"))
	c.Outbox.Table = l.str("outbox.table")
	for table, action := range maps[otherTablesKey] {
		a, err := placement.ParseAction(action)
		if err != nil {
			l.errs = append(l.errs, fmt.Errorf("%s.%s: %w", otherTablesKey, table, err))
			continue
		}
		if c.Outbox.OtherTables == nil {
			c.Outbox.OtherTables = map[string]placement.Action{}
		}
		c.Outbox.OtherTables[table] = a
	}
	c.Outbox.Columns = router.Columns{
		ID:            l.str("outbox.columns.id"),
		AggregateType: l.str("outbox.columns.aggregate_type"),
		AggregateID:   l.str("outbox.columns.aggregate_id"),
		EventType:     l.str("outbox.columns.event_type"),
		Payload:       l.str("outbox.columns.payload"),
		Headers:       l.str("outbox.columns.headers"),
		Timestamp:     l.str("outbox.columns.timestamp"),

		TracingSpanContext: l.str("outbox.columns.tracing_span_context"),
	}
	c.Outbox.Layout = sql.Layout(l.str("outbox.layout"))
	if !strings.EqualFold(l.str("outbox.retention"), "off") {
		c.Outbox.Retention = l.duration("outbox.retention")
	}
	c.Outbox.RetentionInterval = l.duration("outbox.retention_interval")
	c.Outbox.RetentionBatchSize = l.int("outbox.retention_batch_size")
	c.Outbox.RetentionPause = l.duration("outbox.retention_pause")
	c.Outbox.RetentionStatementTimeout = l.duration("outbox.retention_statement_timeout")
	c.Outbox.RetentionPartitions = retention.PartitionMode(strings.ToLower(l.str("outbox.retention_partitions")))
	if h := l.str("message.headers"); h == "-" {
		c.Message.Headers = []string{}
	} else if h != "" {
		c.Message.Headers = l.list("message.headers")
	}
	if f := l.str("message.fields"); f != "" {
		fs, err := router.ParseFields(f)
		if err != nil {
			l.errs = append(l.errs, err)
		}
		c.Message.Fields = fs
	}
	c.Message.Converter = router.Converter(l.str("message.converter"))
	c.Message.Tombstone = l.bool("message.tombstone_on_empty_payload")
	c.Message.Format = strings.ToLower(l.str("message.format"))
	c.Message.CloudEvents = router.CloudEvents{
		Mode:        router.CloudEventsMode(strings.ToLower(l.str("message.cloudevents.mode"))),
		Source:      l.str("message.cloudevents.source"),
		ContentType: l.str("message.cloudevents.content_type"),
	}
	c.Topics.Template = l.str("topics.template")
	c.Topics.Regex = l.str("topics.regex")
	c.Topics.Replacement = l.str("topics.replacement")
	c.Topics.Overrides = maps[overridesKey]
	c.Kafka.Brokers = l.list("kafka.brokers")
	c.Kafka.ClientID = l.str("kafka.client_id")
	c.Kafka.BatchSize = l.int("kafka.batch_size")
	c.Kafka.BatchBytes = int64(l.int("kafka.batch_bytes"))
	c.Kafka.BatchTimeout = l.duration("kafka.batch_timeout")
	c.Kafka.WriteTimeout = l.duration("kafka.write_timeout")
	c.Kafka.Compression = l.str("kafka.compression")
	c.Kafka.AllowAutoTopicCreation = l.bool("kafka.allow_auto_topic_creation")
	c.Kafka.Idempotence = l.bool("kafka.idempotence")
	c.Kafka.CheckpointTopic = l.str("kafka.checkpoint_topic")
	c.Kafka.TransactionTimeout = l.duration("kafka.transaction_timeout")
	c.Kafka.TransactionMaxEvents = l.int("kafka.transaction_max_events")
	c.Kafka.TransactionMaxBytes = l.int("kafka.transaction_max_bytes")
	c.Delivery = l.str("delivery")
	c.Kafka.TLS = sink.TLSConfig{
		Enabled:            l.bool("kafka.tls.enabled"),
		CAFile:             l.str("kafka.tls.ca_file"),
		CertFile:           l.str("kafka.tls.cert_file"),
		KeyFile:            l.str("kafka.tls.key_file"),
		InsecureSkipVerify: l.bool("kafka.tls.insecure_skip_verify"),
		ServerName:         l.str("kafka.tls.server_name"),
	}
	c.Kafka.SASL = sink.SASLConfig{
		Mechanism: l.str("kafka.sasl.mechanism"),
		Username:  l.str("kafka.sasl.username"),
		// Not trimmed: a password may begin or end with a space.
		Password: l.v.GetString("kafka.sasl.password"),
	}
	c.Kafka.SASLPasswordFile = l.str("kafka.sasl.password_file")
	c.Pipeline.MaxInFlightEvents = l.int("pipeline.max_in_flight_events")
	c.Pipeline.MaxInFlightBytes = l.int("pipeline.max_in_flight_bytes")
	c.Pipeline.ShutdownTimeout = l.duration("pipeline.shutdown_timeout")
	c.Health.StallAfter = l.duration("health.stall_after")
	c.Checkpoint.Table = l.str("checkpoint.table")
	c.Checkpoint.Interval = l.duration("checkpoint.interval")
	c.Checkpoint.HistoryInterval = l.duration("checkpoint.history_interval")
	c.Checkpoint.HistoryKeep = l.duration("checkpoint.history_keep")
	c.Retry.Table = l.str("retry.table")
	c.Retry.BackoffMin = l.duration("retry.backoff_min")
	c.Retry.BackoffMax = l.duration("retry.backoff_max")
	c.Retry.MaxAge = l.duration("retry.max_age")
	c.Retry.MaxAttempts = l.int("retry.max_attempts")
	c.Retry.PollEvery = l.duration("retry.poll_interval")
	c.Metrics.Listen = l.str("metrics.listen")
	c.Tracing.OTLPEndpoint = l.str("tracing.otlp_endpoint")
	c.Tracing.ServiceName = l.str("tracing.service_name")
	c.Log.Level = l.str("log.level")
	c.Log.Format = l.str("log.format")
	if err := errors.Join(l.errs...); err != nil {
		return c, err
	}
	c.kafkaOptional = !needKafka
	return c, c.validate()
}

// loader converts viper's values, collecting an error per bad key (viper's
// own getters turn "ten seconds" into 0 silently).
type loader struct {
	v    *viper.Viper
	errs []error
}

func (l *loader) str(key string) string { return strings.TrimSpace(l.v.GetString(key)) }

func (l *loader) duration(key string) time.Duration {
	s := l.str(key)
	if s == "" {
		return 0
	}
	d, err := parseDuration(s)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%s: %w", key, err))
	}
	return d
}

func (l *loader) int(key string) int {
	s := l.str(key)
	if s == "" {
		return 0
	}
	n, err := strconv.Atoi(s)
	switch {
	case errors.Is(err, strconv.ErrRange):
		l.errs = append(l.errs, fmt.Errorf("%s: %s is out of range for a whole number; use a smaller value such as %s", key, s, defaults[key]))
	case err != nil:
		l.errs = append(l.errs, fmt.Errorf("%s: %q is not a whole number", key, s))
	}
	return n
}

func (l *loader) bool(key string) bool {
	s := l.str(key)
	if s == "" {
		return false
	}
	b, err := strconv.ParseBool(s)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%s: %q is not true or false", key, s))
	}
	return b
}

// list accepts a YAML list or a comma-separated string (env and flags).
func (l *loader) list(key string) []string {
	var items []string
	switch v := l.v.Get(key).(type) {
	case []any:
		for _, x := range v {
			items = append(items, fmt.Sprint(x))
		}
	case []string:
		items = v
	default:
		items = strings.Split(l.str(key), ",")
	}
	var out []string
	for _, s := range items {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// parseMapEnv parses a map key's environment variable, as
// RELAY_TOPICS_OVERRIDES="Order=orders,Payment=payments".
func parseMapEnv(key, s string) (map[string]string, error) {
	m := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		if !ok || strings.TrimSpace(k) == "" {
			return nil, fmt.Errorf("%s: %q is not %s; write it like %s",
				envName(key), pair, strings.Replace(mapKeys[key].entry, ": ", "=", 1), mapKeys[key].example)
		}
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m, nil
}

// checkKeys rejects keys of the YAML document that are not config keys (typos
// would otherwise be ignored silently) and returns the map keys' values
// (mapKeys) with their keys' case intact.
func checkKeys(raw []byte) (map[string]map[string]string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	maps := map[string]map[string]string{}
	var walk func(prefix string, m map[string]any) error
	walk = func(prefix string, m map[string]any) error {
		for k, val := range m {
			key := prefix + k
			if mk, ok := mapKeys[key]; ok {
				if val == nil {
					continue
				}
				om, ok := val.(map[string]any)
				if !ok {
					return fmt.Errorf("%s: want a map of %s", key, mk.entry)
				}
				entries := make(map[string]string, len(om))
				for name, v := range om {
					s, ok := v.(string)
					if !ok {
						return fmt.Errorf("%s.%s: want a string (%s), got %v", key, name, mk.entry, v)
					}
					entries[name] = s
				}
				maps[key] = entries
				continue
			}
			if _, ok := defaults[key]; ok {
				if _, isMap := val.(map[string]any); isMap {
					return fmt.Errorf("%s: want a value, got a map", key)
				}
				continue
			}
			if sub, ok := val.(map[string]any); ok && isSection(key) {
				if err := walk(key+".", sub); err != nil {
					return err
				}
				continue
			}
			if key == "postgres.password" {
				return errors.New(postgresPasswordKeyMsg)
			}
			msg := fmt.Sprintf("unknown key %q", key)
			if near := nearestKey(key); near != "" {
				msg += fmt.Sprintf("; did you mean %q?", near)
			}
			return errors.New(msg)
		}
		return nil
	}
	return maps, walk("", doc)
}

func isSection(prefix string) bool {
	for key := range mapKeys {
		if strings.HasPrefix(key, prefix+".") {
			return true
		}
	}
	for key := range defaults {
		if strings.HasPrefix(key, prefix+".") {
			return true
		}
	}
	return false
}

// nearestKey suggests the known key closest to a mistyped one.
func nearestKey(key string) string {
	keys := append(slices.Sorted(func(yield func(string) bool) {
		for k := range defaults {
			if !yield(k) {
				return
			}
		}
	}), overridesKey, otherTablesKey)
	best, bestDist := "", 4 // farther than 3 edits is no suggestion
	for _, k := range keys {
		if d := editDistance(strings.ToLower(key), k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// Bounds of the in-flight window (pipeline.max_in_flight_*): the relay's.
const (
	maxInFlightEvents = relay.MaxInFlightEventsLimit
	minInFlightBytes  = relay.MinInFlightBytes
	maxInFlightBytes  = relay.MaxInFlightBytesLimit
)

var compressions = []string{"none", "gzip", "snappy", "lz4", "zstd"}
var saslMechanisms = []string{"plain", "scram-sha-256", "scram-sha-512"}

// validate fills defaults for empty values and rejects bad ones, naming the
// key and the fix. It returns every problem at once, so that one edit round
// fixes them all. It does not connect anywhere.
func (c *config) validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{key}, args...)...))
	}
	def := func(s *string, key string) {
		if *s == "" {
			*s = defaults[key]
		}
	}
	positive := func(d *time.Duration, key string) {
		if *d == 0 {
			*d, _ = parseDuration(defaults[key])
		} else if *d < 0 {
			bad(key, "%s is negative; use a positive duration such as %s", *d, defaults[key])
		}
	}
	positiveInt := func(n *int, key string) {
		if *n == 0 {
			*n, _ = strconv.Atoi(defaults[key])
		} else if *n < 0 {
			bad(key, "%d is negative; use a positive number such as %s", *n, defaults[key])
		}
	}

	// postgres
	if c.Postgres.DSN == "" {
		bad("postgres.dsn", "empty; set it in the config file or %s=postgres://user@host:5432/db", envName("postgres.dsn"))
	} else if err := checkDSN(c.Postgres.DSN); err != nil {
		// checkDSN's errors show the DSN only up to its user name.
		errs = append(errs, err)
	} else if err := checkMultiHost(c.Postgres.DSN); err != nil {
		errs = append(errs, err)
	} else if err := c.applyPostgresPassword(); err != nil {
		errs = append(errs, err)
	}
	def(&c.Postgres.Slot, "postgres.slot")
	if err := sql.ValidSlotName(c.Postgres.Slot); err != nil {
		bad("postgres.slot", "%v", err)
	}
	def(&c.Postgres.Publication, "postgres.publication")
	positive(&c.Postgres.StatusInterval, "postgres.status_interval")
	positive(&c.Postgres.WalSenderTimeout, "postgres.wal_sender_timeout")
	if c.Postgres.WalSenderTimeout > 0 && c.Postgres.WalSenderTimeout < 3*time.Second {
		// Above twice the 1s leader lease (see internal/relay/lease.go).
		bad("postgres.wal_sender_timeout", "%s is too short: a frozen leader must lose the slot only after its 1s write lease ran out; use 3s or more (default %s)", c.Postgres.WalSenderTimeout, defaults["postgres.wal_sender_timeout"])
	}

	def(&c.Postgres.OnSlotLoss, "postgres.on_slot_loss")
	if v := c.Postgres.OnSlotLoss; v != relay.OnSlotLossFail && v != relay.OnSlotLossRefill {
		bad("postgres.on_slot_loss", "%q is not one of fail (stop with exit code 4 and name the fix, the default) or refill (re-deliver the lost range from the outbox table, then stream on)", v)
	}

	// outbox and topics
	def(&c.Outbox.Table, "outbox.table")
	if _, err := sql.ParseTable(c.Outbox.Table); err != nil {
		bad("outbox.table", "%v", err)
	}
	def((*string)(&c.Outbox.Layout), "outbox.layout")
	if cols, err := c.Outbox.Layout.Columns(); err != nil {
		errs = append(errs, err)
	} else {
		c.Outbox.Columns = c.Outbox.Columns.Fill(cols)
	}
	if c.Message.Headers == nil {
		c.Message.Headers = layoutHeaders(c.Outbox.Layout)
	}
	def((*string)(&c.Message.Converter), "message.converter")
	def(&c.Message.Format, "message.format")
	switch c.Message.Format {
	case "plain":
	case "cloudevents":
		def((*string)(&c.Message.CloudEvents.Mode), "message.cloudevents.mode")
		if c.Message.CloudEvents.Source == "" {
			// The outbox table names where the events come from until the
			// operator names the service.
			c.Message.CloudEvents.Source = "/outbox-relay/" + c.Outbox.Table
		}
	default:
		bad("message.format", "%q: use plain (the payload as the value, the relay's headers) or cloudevents (CloudEvents 1.0 in the Kafka protocol binding; message.cloudevents.mode says binary or structured)", c.Message.Format)
	}
	def(&c.Topics.Template, "topics.template")
	if _, err := router.New(c.routerConfig()); err != nil {
		// The router names its settings outbox.topic and
		// outbox.topic_overrides; the operator's keys are these.
		msg := strings.NewReplacer("outbox.topic_overrides", overridesKey, "outbox.topic", "topics.template").Replace(err.Error())
		errs = append(errs, errors.New(msg))
	}

	// kafka
	if len(c.Kafka.Brokers) == 0 && !c.kafkaOptional {
		bad("kafka.brokers", "empty; set it in the config file or %s=host:9092", envName("kafka.brokers"))
	}
	for _, b := range c.Kafka.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("kafka.brokers", "%q is not host:port; write it like kafka-1:9092", b)
		}
	}
	def(&c.Kafka.ClientID, "kafka.client_id")
	positiveInt(&c.Kafka.BatchSize, "kafka.batch_size")
	if c.Kafka.BatchBytes == 0 {
		c.Kafka.BatchBytes, _ = strconv.ParseInt(defaults["kafka.batch_bytes"], 10, 64)
	} else if c.Kafka.BatchBytes < 0 {
		bad("kafka.batch_bytes", "%d is negative; use a positive number such as %s", c.Kafka.BatchBytes, defaults["kafka.batch_bytes"])
	}
	positive(&c.Kafka.BatchTimeout, "kafka.batch_timeout")
	positive(&c.Kafka.WriteTimeout, "kafka.write_timeout")
	def(&c.Kafka.Compression, "kafka.compression")
	if c.Kafka.Compression = strings.ToLower(c.Kafka.Compression); !slices.Contains(compressions, c.Kafka.Compression) {
		bad("kafka.compression", "%q is not one of %s", c.Kafka.Compression, strings.Join(compressions, ", "))
	}
	tls := c.Kafka.TLS
	for _, f := range []struct{ key, path string }{
		{"kafka.tls.ca_file", tls.CAFile}, {"kafka.tls.cert_file", tls.CertFile}, {"kafka.tls.key_file", tls.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if !tls.Enabled {
			bad(f.key, "set, but kafka.tls.enabled is false; set kafka.tls.enabled: true or remove %s", f.key)
		} else if _, err := os.ReadFile(f.path); err != nil {
			bad(f.key, "cannot read it: %v", err)
		}
	}
	if (tls.CertFile == "") != (tls.KeyFile == "") {
		bad("kafka.tls.cert_file", "kafka.tls.cert_file and kafka.tls.key_file go together; set both for a client certificate, or neither")
	}
	if err := c.applySASLPassword(); err != nil {
		errs = append(errs, err)
	}
	sasl := &c.Kafka.SASL
	sasl.Mechanism = strings.ToLower(sasl.Mechanism)
	switch {
	case sasl.Mechanism == "":
		if sasl.Username != "" || sasl.Password != "" {
			bad("kafka.sasl.mechanism", "empty, but a SASL username or password is set; set it to one of %s", strings.Join(saslMechanisms, ", "))
		}
	case !slices.Contains(saslMechanisms, sasl.Mechanism):
		bad("kafka.sasl.mechanism", "%q is not one of %s", sasl.Mechanism, strings.Join(saslMechanisms, ", "))
	case sasl.Username == "":
		bad("kafka.sasl.username", "empty; SASL %s needs a username", sasl.Mechanism)
	}

	// pipeline, checkpoint, metrics, log
	positiveInt(&c.Pipeline.MaxInFlightEvents, "pipeline.max_in_flight_events")
	positiveInt(&c.Pipeline.MaxInFlightBytes, "pipeline.max_in_flight_bytes")
	// Upper bounds keep the soft memory limit (32 MiB + 2 x bytes) and the
	// crash-resend bound meaningful; near 2^63 the limit's arithmetic
	// overflowed.
	if n := c.Pipeline.MaxInFlightEvents; n > maxInFlightEvents {
		bad("pipeline.max_in_flight_events", "%d is out of range; allowed 1 to %d (default %s)", n, maxInFlightEvents, defaults["pipeline.max_in_flight_events"])
	}
	if n := c.Pipeline.MaxInFlightBytes; n > 0 && (n < minInFlightBytes || n > maxInFlightBytes) {
		bad("pipeline.max_in_flight_bytes", "%d is out of range; allowed %d (64 KiB) to %d (16 GiB) (default %s)", n, minInFlightBytes, maxInFlightBytes, defaults["pipeline.max_in_flight_bytes"])
	}
	switch c.Delivery {
	case relay.DeliveryAtLeastOnce, relay.DeliveryExactlyOnce:
		if c.Delivery == relay.DeliveryExactlyOnce && !c.Kafka.Idempotence {
			bad("delivery", "exactly-once needs the idempotent producer: set kafka.idempotence: true, or delivery: %s", relay.DeliveryAtLeastOnce)
		}
	default:
		bad("delivery", "%q is not one of %s (the default) or %s", c.Delivery, relay.DeliveryAtLeastOnce, relay.DeliveryExactlyOnce)
	}
	def(&c.Kafka.CheckpointTopic, "kafka.checkpoint_topic")
	positive(&c.Kafka.TransactionTimeout, "kafka.transaction_timeout")
	if n := c.Kafka.TransactionMaxEvents; n < 1 {
		bad("kafka.transaction_max_events", "%d is out of range; use a number of events of at least 1 (default %s)", n, defaults["kafka.transaction_max_events"])
	}
	if n := c.Kafka.TransactionMaxBytes; n < minInFlightBytes {
		bad("kafka.transaction_max_bytes", "%d is out of range; use at least %d (64 KiB) (default %s)", n, minInFlightBytes, defaults["kafka.transaction_max_bytes"])
	}
	positive(&c.Pipeline.ShutdownTimeout, "pipeline.shutdown_timeout")
	positive(&c.Health.StallAfter, "health.stall_after")
	def(&c.Checkpoint.Table, "checkpoint.table")
	if _, err := sql.ParseTable(c.Checkpoint.Table); err != nil {
		bad("checkpoint.table", "%v", err)
	}
	positive(&c.Checkpoint.Interval, "checkpoint.interval")
	positive(&c.Checkpoint.HistoryInterval, "checkpoint.history_interval")
	positive(&c.Checkpoint.HistoryKeep, "checkpoint.history_keep")
	if c.Checkpoint.HistoryKeep > 0 && c.Checkpoint.HistoryKeep < c.Checkpoint.HistoryInterval {
		bad("checkpoint.history_keep", "%s is shorter than checkpoint.history_interval (%s); keep at least one interval (the default keeps %s)",
			c.Checkpoint.HistoryKeep, c.Checkpoint.HistoryInterval, defaults["checkpoint.history_keep"])
	}
	// Retention: 0 (or "", "off") is off; the other keys are checked
	// either way, so that turning it on later does not reveal a typo.
	if c.Outbox.Retention < 0 {
		bad("outbox.retention", "%s is negative; use a period such as 7d or 12h, or \"\" for off", c.Outbox.Retention)
	}
	positive(&c.Outbox.RetentionInterval, "outbox.retention_interval")
	positiveInt(&c.Outbox.RetentionBatchSize, "outbox.retention_batch_size")
	if n := c.Outbox.RetentionBatchSize; n > retention.MaxBatchSize {
		bad("outbox.retention_batch_size", "%d is out of range; allowed 1 to %d (default %s): each batch is one transaction, keep it short", n, retention.MaxBatchSize, defaults["outbox.retention_batch_size"])
	}
	positive(&c.Outbox.RetentionPause, "outbox.retention_pause")
	positive(&c.Outbox.RetentionStatementTimeout, "outbox.retention_statement_timeout")
	def((*string)(&c.Outbox.RetentionPartitions), "outbox.retention_partitions")
	switch c.Outbox.RetentionPartitions {
	case retention.PartitionsDelete, retention.PartitionsDrop, retention.PartitionsDetach:
	default:
		bad("outbox.retention_partitions", "%q is not one of delete (rows, the default), drop or detach (whole partitions of an outbox partitioned by range on created_at)", c.Outbox.RetentionPartitions)
	}
	def(&c.Retry.Table, "retry.table")
	if _, err := sql.ParseTable(c.Retry.Table); err != nil {
		bad("retry.table", "%v", err)
	}
	positive(&c.Retry.BackoffMin, "retry.backoff_min")
	positive(&c.Retry.BackoffMax, "retry.backoff_max")
	positive(&c.Retry.MaxAge, "retry.max_age")
	positive(&c.Retry.PollEvery, "retry.poll_interval")
	if c.Retry.BackoffMax < c.Retry.BackoffMin {
		bad("retry.backoff_max", "%s is less than retry.backoff_min %s; raise it", c.Retry.BackoffMax, c.Retry.BackoffMin)
	}
	if c.Retry.MaxAttempts < 0 {
		bad("retry.max_attempts", "%d is negative; use 0 for no limit (retry.max_age still applies)", c.Retry.MaxAttempts)
	}
	if c.Metrics.Listen != "" { // "" disables the metrics endpoint
		if _, port, err := net.SplitHostPort(c.Metrics.Listen); err != nil || port == "" {
			bad("metrics.listen", "%q is not host:port; write it like 127.0.0.1:9187, or \"\" to disable metrics", c.Metrics.Listen)
		}
	}
	if e := c.Tracing.OTLPEndpoint; e != "" {
		if u, err := url.Parse(e); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("tracing.otlp_endpoint", "%q: want the OTLP/gRPC collector as http://host:port (plaintext) or https://host:port (TLS), e.g. http://127.0.0.1:4317; \"\" exports no spans", e)
		}
	}
	def(&c.Tracing.ServiceName, "tracing.service_name")
	def(&c.Log.Level, "log.level")
	if _, err := parseLevel(c.Log.Level); err != nil {
		bad("log.level", "%v", err)
	}
	def(&c.Log.Format, "log.format")
	if c.Log.Format != "text" && c.Log.Format != "json" {
		bad("log.format", "%q is not text or json", c.Log.Format)
	}

	// Only once the fields the sink reads are known good: its own checks then
	// report what is left rather than repeat ours.
	if len(errs) == 0 && len(c.Kafka.Brokers) > 0 {
		if err := validateSink(c.sinkConfig(nil)); err != nil {
			bad("kafka", "%v", err)
		}
	}
	return errors.Join(errs...)
}

func (c *config) routerConfig() router.Config {
	return router.Config{
		Columns: c.Outbox.Columns, Topic: c.Topics.Template, Overrides: c.Topics.Overrides,
		TopicRegex: c.Topics.Regex, TopicReplacement: c.Topics.Replacement,
		Headers: c.Message.Headers, Fields: c.Message.Fields, Converter: c.Message.Converter,
		TombstoneOnEmptyPayload: c.Message.Tombstone,
		CloudEvents:             c.cloudEvents(),
		Spans:                   c.Tracing.OTLPEndpoint != "",
	}
}

// cloudEvents is the router's CloudEvents setting: off (no mode) unless
// message.format is cloudevents; the source and content type always, so that
// the router refuses them without the format.
func (c *config) cloudEvents() router.CloudEvents {
	ce := c.Message.CloudEvents
	if c.Message.Format != "cloudevents" {
		ce.Mode = ""
	}
	return ce
}

// layoutHeaders is message.headers' default: the relay's three headers for
// its own layout, only id for Debezium's, as Debezium's router sends.
func layoutHeaders(l sql.Layout) []string {
	if l == sql.LayoutDebezium {
		return []string{router.HeaderID}
	}
	return slices.Clone(router.DefaultHeaders)
}

func (c *config) sinkConfig(log *slog.Logger) sink.Config {
	return sink.Config{
		Brokers:                c.Kafka.Brokers,
		ClientID:               c.Kafka.ClientID,
		BatchSize:              c.Kafka.BatchSize,
		BatchBytes:             c.Kafka.BatchBytes,
		BatchTimeout:           c.Kafka.BatchTimeout,
		WriteTimeout:           c.Kafka.WriteTimeout,
		Compression:            c.Kafka.Compression,
		TLS:                    c.Kafka.TLS,
		SASL:                   c.Kafka.SASL,
		AllowAutoTopicCreation: c.Kafka.AllowAutoTopicCreation,
		DisableIdempotence:     !c.Kafka.Idempotence,
		TransactionTimeout:     c.Kafka.TransactionTimeout,
		Logger:                 log,
	}
}

func (c *config) relayConfig(log *slog.Logger) relay.Config {
	return relay.Config{
		Replication: replication.Config{
			DSN:              c.Postgres.DSN,
			Slot:             c.Postgres.Slot,
			Publication:      c.Postgres.Publication,
			StatusInterval:   c.Postgres.StatusInterval,
			WalSenderTimeout: c.Postgres.WalSenderTimeout,
			// `outbox-relay status` reads the version of the relay holding
			// the slot from pg_stat_replication.application_name.
			ApplicationName: "outbox-relay/" + version,
			Logger:          log.With("component", "replication"),
		},
		OnSlotLoss:         c.Postgres.OnSlotLoss,
		Table:              c.Outbox.Table,
		Failover:           c.Postgres.Failover,
		OtherTables:        c.Outbox.OtherTables,
		OtherTablesKey:     otherTablesKey,
		Router:             c.routerConfig(),
		Sink:               c.sinkConfig(log.With("component", "sink")),
		Delivery:           c.Delivery,
		CheckpointTopic:    c.Kafka.CheckpointTopic,
		CheckpointTable:    c.Checkpoint.Table,
		CheckpointInterval: c.Checkpoint.Interval,
		HistoryInterval:    c.Checkpoint.HistoryInterval,
		HistoryKeep:        c.Checkpoint.HistoryKeep,
		Retention:          c.retentionConfig(),
		MaxInFlightEvents:  c.Pipeline.MaxInFlightEvents,
		MaxInFlightBytes:   c.Pipeline.MaxInFlightBytes,
		ShutdownTimeout:    c.Pipeline.ShutdownTimeout,
		StallAfter:         c.Health.StallAfter,
		MetricsListen:      c.Metrics.Listen,
		RetryTable:         c.Retry.Table,
		Retry: retry.WorkerConfig{
			BackoffMin:   c.Retry.BackoffMin,
			BackoffMax:   c.Retry.BackoffMax,
			MaxAge:       c.Retry.MaxAge,
			MaxAttempts:  c.Retry.MaxAttempts,
			PollInterval: c.Retry.PollEvery,
		},
		TransactionMaxEvents: c.Kafka.TransactionMaxEvents,
		TransactionMaxBytes:  c.Kafka.TransactionMaxBytes,
		Logger:               log,
	}
}

// retentionConfig is the retention the relay runs and prune runs once; its
// Retention is 0 when off.
func (c *config) retentionConfig() retention.Config {
	return retention.Config{
		Table:            c.Outbox.Table,
		CheckpointTable:  c.Checkpoint.Table,
		Slot:             c.Postgres.Slot,
		Retention:        c.Outbox.Retention,
		Interval:         c.Outbox.RetentionInterval,
		BatchSize:        c.Outbox.RetentionBatchSize,
		Pause:            c.Outbox.RetentionPause,
		StatementTimeout: c.Outbox.RetentionStatementTimeout,
		Partitions:       c.Outbox.RetentionPartitions,
	}
}
