package debezium

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A Plan is what Convert makes of a Debezium connector's configuration: the
// relay settings that reproduce it, what has no equivalent (Gaps), and what
// was read but does not change the events (Notes). Each list is in a fixed
// order: Settings as a relay config file lists its keys, Gaps and Notes by
// Debezium key.
type Plan struct {
	Settings []Setting
	Gaps     []Gap
	Notes    []Note
}

// A Setting is one relay configuration key (dotted as in the YAML file, e.g.
// postgres.dsn) and its value. FromDebeziumKey names the Debezium key it
// comes from; for a setting the relay needs to behave as Debezium's
// EventRouter always does (outbox.layout, message.headers) it is the
// router's transforms.<name>.type.
type Setting struct {
	Key, Value      string
	FromDebeziumKey string
}

// A Gap is a Debezium key whose behaviour the relay does not reproduce, or
// does not take from the configuration: Why says what differs and what to
// do. Value is the configured value, or redacted for a secret.
type Gap struct {
	DebeziumKey, Value, Why string
}

// A Note is a Debezium key that does not change the outbox events, or that
// the relay handles in its own way; Why says how.
type Note struct {
	DebeziumKey, Value, Why string
}

// ErrNotOutbox is returned by Convert for a connector without the outbox
// EventRouter transform.
var ErrNotOutbox = errors.New("not an outbox connector")

// Debezium's and Kafka's names and defaults that Convert compares with.
const (
	postgresConnector = "io.debezium.connector.postgresql.PostgresConnector"
	eventRouter       = "io.debezium.transforms.outbox.EventRouter"

	defaultSlot        = "debezium"        // slot.name
	defaultPublication = "dbz_publication" // publication.name
	defaultPort        = "5432"
	defaultRegex       = "(?<routedByValue>.*)"
	defaultReplacement = "outbox.event.${routedByValue}"

	redacted = "(secret, not shown)"
)

// Convert maps a Debezium PostgreSQL connector's configuration (connector)
// and its Kafka Connect worker's (worker, may be nil when not at hand) to
// relay settings. It returns an error wrapping ErrNotOutbox when no transform
// in the connector's chain is the outbox EventRouter, and an error for a
// connector.class other than Debezium's PostgreSQL connector. Passwords are
// never copied: the Plan says where to supply them instead.
func Convert(connector, worker map[string]string) (*Plan, error) {
	c := &converter{conn: connector, worker: worker, used: make(map[string]bool)}
	if class, ok := c.get("connector.class"); ok && class != postgresConnector {
		return nil, fmt.Errorf("connector.class is %q, not Debezium's PostgreSQL connector (%s): only that connector can be converted", class, postgresConnector)
	}
	if err := c.findRouter(); err != nil {
		return nil, err
	}
	c.postgres()
	c.table()
	c.outbox()
	c.converters()
	c.kafka()
	c.rest()
	p := &c.plan
	slices.SortStableFunc(p.Gaps, func(a, b Gap) int { return strings.Compare(a.DebeziumKey, b.DebeziumKey) })
	slices.SortStableFunc(p.Notes, func(a, b Note) int { return strings.Compare(a.DebeziumKey, b.DebeziumKey) })
	return p, nil
}

type converter struct {
	conn, worker map[string]string
	used         map[string]bool // connector keys dealt with
	router       string          // the EventRouter's transform name
	plan         Plan
}

// get returns a connector key's value (trimmed, as Kafka's ConfigDef reads
// values) and marks the key as dealt with.
func (c *converter) get(key string) (string, bool) {
	c.used[key] = true
	v, ok := c.conn[key]
	return strings.TrimSpace(v), ok
}

// opt returns an option of the outbox router.
func (c *converter) opt(option string) (string, bool) {
	return c.get(c.routerKey(option))
}

func (c *converter) routerKey(option string) string {
	return "transforms." + c.router + "." + option
}

func (c *converter) set(key, value, from string) {
	c.plan.Settings = append(c.plan.Settings, Setting{Key: key, Value: value, FromDebeziumKey: from})
}

func (c *converter) gap(key, value, why string, args ...any) {
	c.plan.Gaps = append(c.plan.Gaps, Gap{DebeziumKey: key, Value: value, Why: fmt.Sprintf(why, args...)})
}

func (c *converter) note(key, value, why string, args ...any) {
	c.plan.Notes = append(c.plan.Notes, Note{DebeziumKey: key, Value: value, Why: fmt.Sprintf(why, args...)})
}

// providerRef matches a Kafka Connect config provider reference such as
// ${file:/etc/secrets.properties:user} or ${env:DB_HOST}.
var providerRef = regexp.MustCompile(`\$\{[^}:]*:[^}]*\}`)

// literal reports whether a value can be copied: a config provider reference
// is resolved by Kafka Connect at runtime, and the relay cannot.
func (c *converter) literal(key, value, relayKey string) bool {
	if providerRef.MatchString(value) {
		c.gap(key, value, "the value comes from a Kafka Connect config provider, which only Kafka Connect resolves: set %s to the resolved value yourself", relayKey)
		return false
	}
	return true
}

// findRouter finds the outbox EventRouter in the transform chain; every other
// transform is a gap.
func (c *converter) findRouter() error {
	list, _ := c.get("transforms")
	var names []string
	for n := range strings.SplitSeq(list, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	var routers []string
	for _, n := range names {
		if t, _ := c.get("transforms." + n + ".type"); t == eventRouter {
			routers = append(routers, n)
		}
	}
	switch len(routers) {
	case 0:
		return fmt.Errorf("%w: no transform in transforms (%q) has type %s; the relay replaces only Debezium's outbox event router", ErrNotOutbox, list, eventRouter)
	case 1:
	default:
		return fmt.Errorf("transforms %s are all outbox EventRouters: the relay reads one outbox table with one routing; convert a connector with one", strings.Join(routers, ", "))
	}
	c.router = routers[0]
	before := true
	for _, n := range names {
		if n == c.router {
			before = false
			continue
		}
		typ, _ := c.get("transforms." + n + ".type")
		for k := range c.conn {
			if strings.HasPrefix(k, "transforms."+n+".") {
				c.used[k] = true
			}
		}
		where := "after"
		if before {
			where = "before"
		}
		c.gap("transforms."+n+".type", typ, "transform %q runs %s the outbox router, and the relay has no transforms: reproduce what it does in the producers or consumers of the outbox, or drop it", n, where)
	}
	return nil
}

// rest classifies the connector keys not dealt with yet.
func (c *converter) rest() {
	for _, k := range sortedKeys(c.conn) {
		if c.used[k] {
			continue
		}
		v := c.conn[k]
		if secretKey(k) {
			v = redacted
		}
		rule, ok := matchRule(k)
		switch {
		case !ok:
			c.note(k, v, "not an option this converter knows: if it changes the events, check that the relay does the same")
		case !rule.gap:
			c.note(k, v, "%s", rule.why)
		case rule.def != "" && strings.EqualFold(strings.TrimSpace(v), rule.def):
			if rule.noteIf != "" {
				c.note(k, v, "%s", rule.noteIf)
			}
		default:
			c.gap(k, v, "%s", rule.why)
		}
	}
	if w, ok := c.worker["offset.storage.file.filename"]; ok {
		c.note("offset.storage.file.filename", w, "Debezium's position is in this file (standalone worker): read it to find where the relay starts on Debezium's slot")
	}
	if w, ok := c.worker["offset.storage.topic"]; ok {
		c.note("offset.storage.topic", w, "Debezium's position is in this topic (distributed worker): read it to find where the relay starts on Debezium's slot")
	}
}

// A keyRule says what a connector key not mapped above means for the relay:
// a note, or a gap unless its value is def.
type keyRule struct {
	key    string // exact key, or a prefix ending in "."
	gap    bool
	def    string // for a gap: the value that is not one (Debezium's default)
	why    string
	noteIf string // for a gap with def: the note when the value is def
}

var keyRules = []keyRule{
	{key: "name", why: "the connector's name; the relay has none"},
	{key: "tasks.max", why: "Debezium's Postgres connector runs one task; so does the relay"},
	{key: "topic.prefix", why: "names Debezium's own topics (heartbeats, transactions, schema changes); the outbox topics come from the router"},
	{key: "database.server.name", why: "topic.prefix of Debezium before 2.0; the outbox topics come from the router"},
	{key: "snapshot.mode", why: "the relay does not snapshot: rows already in the outbox table when it starts are not sent (Debezium sent them only on its first start)"},
	{key: "snapshot.", why: "the relay does not snapshot"},
	{key: "incremental.snapshot.", why: "the relay does not snapshot"},
	{key: "signal.", why: "the relay takes no signals (ad-hoc snapshots)"},
	{key: "read.only", why: "the relay takes no signals and never writes to the source tables"},
	{key: "heartbeat.", why: "the relay needs no heartbeats to advance its slot: it confirms the server's WAL position while idle; it sends no heartbeat messages"},
	{key: "topic.heartbeat.prefix", why: "the relay sends no heartbeat messages"},
	{key: "poll.interval.ms", why: "the relay streams without polling"},
	{key: "max.batch.size", why: "see kafka.batch_size and pipeline.max_in_flight_events"},
	{key: "max.queue.size", why: "see pipeline.max_in_flight_events and pipeline.max_in_flight_bytes"},
	{key: "max.queue.size.in.bytes", why: "see pipeline.max_in_flight_bytes"},
	{key: "errors.", why: "Kafka Connect's error handling; the relay keeps events it cannot send in its retry table (retry.*) instead of dropping or failing"},
	{key: "slot.", why: "the relay never drops or recreates its slot and retries connecting with backoff"},
	{key: "lsn.flush.", why: "the relay confirms a transaction's end LSN once Kafka acknowledged it and everything before it"},
	{key: "flush.lsn.source", why: "the relay always confirms its position to the slot; with false, Debezium left that to someone else, so the slot's confirmed_flush_lsn may be far behind: the relay starts from the offset's position anyway"},
	{key: "offset.", why: "how Debezium reconciles its offset and the slot; the relay keeps its own checkpoint"},
	{key: "internal.", why: "an internal Debezium option"},
	{key: "xmin.fetch.interval.ms", why: "not needed by the relay"},
	{key: "schema.refresh.mode", why: "the relay reads each relation from pgoutput's Relation messages"},
	{key: "include.unknown.datatypes", why: "the relay reads every column as pgoutput's text"},
	{key: "tombstones.on.delete", why: "the router ignores deletes of the outbox table; so does the relay"},
	{key: "skipped.operations", why: "the relay relays inserts only"},
	{key: "message.key.columns", why: "the router takes the key from the aggregate id column"},
	{key: "table.exclude.list", why: "the relay reads only outbox.table"},
	{key: "schema.include.list", why: "the relay reads only outbox.table"},
	{key: "schema.exclude.list", why: "the relay reads only outbox.table"},
	{key: "schema.whitelist", why: "the relay reads only outbox.table"},
	{key: "schema.blacklist", why: "the relay reads only outbox.table"},
	{key: "table.blacklist", why: "the relay reads only outbox.table"},
	{key: "database.include.list", why: "the database is the DSN's"},
	{key: "database.tcpKeepAlive", why: "the relay's connections keep alive by default"},
	{key: "database.query.timeout.ms", why: "the relay runs no queries on the source tables"},
	{key: "connect.", why: "connection retries: the relay reconnects with backoff"},
	{key: "retriable.restart.connector.wait.ms", why: "the relay reconnects with backoff"},
	{key: "event.processing.failure.handling.mode", why: "the relay stops on a message it cannot decode"},
	{key: "unavailable.value.placeholder", why: "inserts carry every column"},
	{key: "replica.identity.autoset.values", why: "the relay reads inserts only, which need no replica identity"},
	{key: "topic.naming.strategy", why: "names Debezium's own topics; the outbox topics come from the router"},
	{key: "topic.delimiter", why: "names Debezium's own topics; the outbox topics come from the router"},
	{key: "topic.transaction", why: "the relay sends no transaction metadata"},
	{key: "topic.cache.size", why: "names Debezium's own topics"},
	{key: "custom.metric.tags", why: "see the relay's Prometheus metrics (metrics.listen)"},
	{key: "notification.", why: "the relay's notifications are its log and metrics"},
	{key: "predicates", why: "predicates of other transforms"},
	{key: "predicates.", why: "predicates of other transforms"},
	{key: "producer.override.", why: "a producer option of Kafka Connect's; the relay's producer has its own kafka.* settings"},
	{key: "consumer.override.", why: "the relay consumes nothing"},
	{key: "admin.override.", why: "the relay does not administer Kafka"},
	{key: "money.fraction.digits", why: "applies to money columns in message.fields only"},
	{key: "provide.transaction.metadata", gap: true, def: "false", why: "Debezium sent transaction BEGIN/END events to a transaction topic; the relay sends none: consumers of that topic must change"},
	{key: "topic.creation.", gap: true, why: "Kafka Connect created the outbox topics with these settings; the relay does not (kafka.allow_auto_topic_creation leaves it to the broker's defaults): create the topics with the partitions and settings you need"},
	{key: "column.", gap: true, why: "column filtering and masking are not reproduced: the relay sends the configured columns as they are"},
	{key: "datatype.propagate.source.type", gap: true, why: "the relay sends no Connect schema, so there is no source type to propagate"},
	{key: "converters", gap: true, why: "Debezium custom converters are not reproduced: the relay renders column values as Debezium's defaults do"},
	{key: "converters.", gap: true, why: "Debezium custom converters are not reproduced"},
	{key: "database.initial.statements", gap: true, why: "the relay runs no statements on connecting: set what you need as parameters in postgres.dsn (options=-c ...) or on the role"},
	{key: "decimal.handling.mode", gap: true, def: "precise", why: "the relay renders numeric columns in message.fields as Debezium's default does (precise)", noteIf: "Debezium's default; the relay renders numeric columns in message.fields the same way"},
	{key: "time.precision.mode", gap: true, def: "adaptive", why: "the relay renders time columns (message.fields, the timestamp column) as Debezium's default does (adaptive)", noteIf: "Debezium's default, which the relay follows"},
	{key: "binary.handling.mode", gap: true, def: "bytes", why: "the relay sends a bytea payload as its bytes and bytea fields as Debezium's default does (bytes)", noteIf: "Debezium's default, which the relay follows"},
	{key: "interval.handling.mode", gap: true, def: "numeric", why: "the relay renders interval columns in message.fields as Debezium's default does (numeric)", noteIf: "Debezium's default, which the relay follows"},
	{key: "hstore.handling.mode", gap: true, def: "json", why: "the relay renders hstore columns in message.fields as Debezium's default does (json)", noteIf: "Debezium's default, which the relay follows"},
}

// matchRule finds the rule for key: an exact rule first, then the longest
// prefix.
func matchRule(key string) (keyRule, bool) {
	var best keyRule
	found := false
	for _, r := range keyRules {
		switch {
		case r.key == key:
			return r, true
		case strings.HasSuffix(r.key, ".") && strings.HasPrefix(key, r.key) && (!found || len(r.key) > len(best.key)):
			best, found = r, true
		}
	}
	return best, found
}

// secretKey reports whether a key's value must not be shown.
func secretKey(k string) bool {
	k = strings.ToLower(k)
	return strings.Contains(k, "password") || strings.Contains(k, "secret") || strings.Contains(k, "jaas") || strings.HasSuffix(k, ".token")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare)
	return keys
}
