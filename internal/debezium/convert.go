package debezium

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
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

// debeziumColumns are the EventRouter's default columns: the Debezium
// layout's, which outbox.layout debezium sets.
var debeziumColumns, _ = sql.LayoutDebezium.Columns()

// The EventRouter's column options, their Debezium defaults and the relay
// key each maps to.
var routerColumns = []struct{ option, def, relayKey string }{
	{"table.field.event.id", debeziumColumns.ID, "outbox.columns.id"},
	{"route.by.field", debeziumColumns.AggregateType, "outbox.columns.aggregate_type"},
	{"table.field.event.key", debeziumColumns.AggregateID, "outbox.columns.aggregate_id"},
	{"table.field.event.type", debeziumColumns.EventType, "outbox.columns.event_type"},
	{"table.field.event.payload", debeziumColumns.Payload, "outbox.columns.payload"},
	{"table.field.event.timestamp", debeziumColumns.Timestamp, "outbox.columns.timestamp"},
}

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

// postgres maps the connection, the slot and the publication.
func (c *converter) postgres() {
	host, hasHost := c.get("database.hostname")
	port, hasPort := c.get("database.port")
	user, hasUser := c.get("database.user")
	db, hasDB := c.get("database.dbname")
	if !hasPort || port == "" {
		port = defaultPort
	}
	ok := true
	for _, m := range []struct {
		key, value string
		has        bool
	}{{"database.hostname", host, hasHost}, {"database.user", user, hasUser}, {"database.dbname", db, hasDB}} {
		if !m.has || m.value == "" {
			c.gap(m.key, "", "not set, so postgres.dsn cannot be built: set postgres.dsn (or RELAY_POSTGRES_DSN) to postgres://user@host:port/database")
			ok = false
		} else if !c.literal(m.key, m.value, "postgres.dsn") {
			ok = false
		}
	}
	if ok && !c.literal("database.port", port, "postgres.dsn") {
		ok = false
	}
	from := []string{"database.hostname"}
	if hasPort {
		from = append(from, "database.port")
	}
	from = append(from, "database.user", "database.dbname")
	q := url.Values{}
	if mode, has := c.get("database.sslmode"); has && mode != "" {
		from = append(from, "database.sslmode")
		switch m := strings.ToLower(mode); m {
		case "disable", "allow", "prefer", "require", "verify-ca", "verify-full":
			q.Set("sslmode", m)
		case "disabled", "required":
			// Spellings of older Debezium versions.
			q.Set("sslmode", strings.TrimSuffix(m, "d"))
		default:
			c.gap("database.sslmode", mode, "not a Postgres sslmode: set sslmode in postgres.dsn to disable, allow, prefer, require, verify-ca or verify-full")
		}
	}
	for _, f := range []struct{ key, param, why string }{
		{"database.sslrootcert", "sslrootcert", "the relay must be able to read this file (PEM)"},
		{"database.sslcert", "sslcert", "the relay must be able to read this file (PEM)"},
		{"database.sslkey", "sslkey", "pgjdbc reads a DER (PKCS-8, .pk8) key; the relay needs a PEM key: convert it (openssl pkcs8 -inform DER -in key.pk8 -out key.pem) and change sslkey in postgres.dsn"},
	} {
		if v, has := c.get(f.key); has && v != "" && c.literal(f.key, v, "postgres.dsn") {
			q.Set(f.param, v)
			from = append(from, f.key)
			c.note(f.key, v, "copied into postgres.dsn as %s: %s", f.param, f.why)
		}
	}
	if _, has := c.get("database.password"); has {
		c.note("database.password", redacted, "passwords are never copied into the relay's configuration: put it in a file named by postgres.password_file (RELAY_POSTGRES_PASSWORD_FILE), or in RELAY_POSTGRES_PASSWORD, or a .pgpass file")
	}
	if _, has := c.get("database.sslpassword"); has {
		c.note("database.sslpassword", redacted, "the key's password is never copied: add sslpassword=... to the DSN in RELAY_POSTGRES_DSN")
	}
	if v, has := c.get("database.sslfactory"); has {
		c.gap("database.sslfactory", v, "a pgjdbc SSL socket factory has no equivalent: configure TLS with sslmode, sslrootcert, sslcert and sslkey in postgres.dsn")
	}
	if ok {
		u := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort(host, port), Path: "/" + db, RawQuery: q.Encode()}
		c.set("postgres.dsn", u.String(), strings.Join(from, ", "))
	}

	slot, has := c.get("slot.name")
	if !has || slot == "" {
		slot = defaultSlot
	}
	if c.literal("slot.name", slot, "postgres.slot") {
		c.set("postgres.slot", slot, "slot.name")
	}
	pub, has := c.get("publication.name")
	if !has || pub == "" {
		pub = defaultPublication
	}
	if c.literal("publication.name", pub, "postgres.publication") {
		c.set("postgres.publication", pub, "publication.name")
	}
	if ms, has := c.get("status.update.interval.ms"); has && ms != "" {
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 && time.Duration(n)*time.Millisecond != 10*time.Second {
			c.set("postgres.status_interval", (time.Duration(n) * time.Millisecond).String(), "status.update.interval.ms")
		}
	}

	plugin, has := c.get("plugin.name")
	switch p := strings.ToLower(plugin); {
	case p == "pgoutput":
	case !has || p == "":
		c.gap("plugin.name", "", "not set, so Debezium used decoderbufs, its default, and its slot %q decodes with decoderbufs; the relay reads pgoutput only: create a new pgoutput slot (outbox-relay setup) while Debezium still runs, start the relay on it, then stop Debezium; the overlap is sent twice, nothing is lost. Debezium's offsets do not apply to the new slot", slot)
	default:
		c.gap("plugin.name", plugin, "the slot %q decodes with %s; the relay reads pgoutput only: create a new pgoutput slot (outbox-relay setup) while Debezium still runs, start the relay on it, then stop Debezium; the overlap is sent twice, nothing is lost. Debezium's offsets do not apply to the new slot", slot, plugin)
	}
	mode, has := c.get("publication.autocreate.mode")
	if !has || mode == "" {
		mode = "all_tables"
	}
	switch strings.ToLower(mode) {
	case "all_tables":
		c.note("publication.autocreate.mode", mode, "Debezium creates publication %q FOR ALL TABLES (its default): the relay works with it, ignoring other tables' rows, but Postgres then decodes and sends every table's changes; a publication of the outbox table alone, inserts only (as outbox-relay setup creates), is lighter", pub)
	case "filtered":
		c.note("publication.autocreate.mode", mode, "Debezium creates publication %q for the included tables and every operation: the relay works with it and ignores updates and deletes; one publishing inserts only (as outbox-relay setup creates) is lighter", pub)
	default:
		c.note("publication.autocreate.mode", mode, "the publication %q is managed outside Debezium; the relay uses it as it is", pub)
	}
}

// tableName matches an include-list entry that names one table: table or
// schema.table, dots possibly escaped as in a regex.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]*(\\?\.[A-Za-z_][A-Za-z0-9_$]*)?$`)

func (c *converter) table() {
	key := "table.include.list"
	list, has := c.get(key)
	if old, hasOld := c.get("table.whitelist"); !has && hasOld {
		key, list, has = "table.whitelist", old, true
	}
	var entries []string
	for e := range strings.SplitSeq(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			entries = append(entries, e)
		}
	}
	switch {
	case !has || len(entries) == 0:
		c.gap("table.include.list", "", "not set, so Debezium captured every table of the publication; the relay reads one outbox table: set outbox.table to it (schema.table)")
	case len(entries) > 1:
		c.gap(key, list, "lists %d tables; the relay reads one outbox table: set outbox.table to it, and run one relay per outbox table", len(entries))
	case !tableName.MatchString(entries[0]):
		c.gap(key, list, "is a regular expression, not one table's name; the relay reads one table named exactly: set outbox.table to it (schema.table)")
	default:
		name := strings.ReplaceAll(entries[0], `\.`, ".")
		c.set("outbox.table", name, key)
		if strings.ToLower(name) != name {
			c.note(key, list, "Debezium matches table names ignoring case, outbox.table is exact: check that %q is the table's name as Postgres stores it", name)
		}
	}
}

// outbox maps the EventRouter's options.
func (c *converter) outbox() {
	typeKey := c.routerKey("type")
	c.set("outbox.layout", string(sql.LayoutDebezium), typeKey)
	for _, col := range routerColumns {
		v, has := c.opt(col.option)
		if has && v != "" && v != col.def {
			c.set(col.relayKey, v, c.routerKey(col.option))
		}
	}
	regex, hasRegex := c.opt("route.topic.regex")
	repl, hasRepl := c.opt("route.topic.replacement")
	if !hasRegex || regex == "" {
		regex = defaultRegex
	}
	if !hasRepl || repl == "" {
		repl = defaultReplacement
	}
	// The defaults route as the relay's default template does,
	// outbox.event.{aggregate_type}; the relay needs both keys or neither.
	if regex != defaultRegex || repl != defaultReplacement {
		// The relay's own check: Java's regex syntax is wider than Go's
		// (lookaround, backreferences, possessive quantifiers), and a
		// setting the relay refuses at load is a gap, not a setting.
		if _, err := router.New(router.Config{TopicRegex: regex, TopicReplacement: repl}); err != nil {
			c.gap(c.routerKey("route.topic.regex"), regex, "the relay cannot route with it: %v; rewrite the expression without Java-only syntax, or route these aggregate types with topics.overrides", err)
		} else {
			c.set("topics.regex", regex, c.routerKey("route.topic.regex"))
			c.set("topics.replacement", repl, c.routerKey("route.topic.replacement"))
		}
	}
	c.set("message.headers", strings.Join(sql.LayoutDebezium.Headers(), ","), typeKey)
	if v, has := c.opt("table.fields.additional.placement"); has && v != "" {
		c.fields(v)
	}
	if v, has := c.opt("route.tombstone.on.empty.payload"); has {
		switch strings.ToLower(v) {
		case "true":
			c.set("message.tombstone_on_empty_payload", "true", c.routerKey("route.tombstone.on.empty.payload"))
		case "false", "":
		default:
			c.gap(c.routerKey("route.tombstone.on.empty.payload"), v, "not a boolean: set message.tombstone_on_empty_payload to true or false")
		}
	}
	c.routerOptions()
}

// fields copies table.fields.additional.placement, leaving out what the relay
// cannot do.
func (c *converter) fields(v string) {
	key := c.routerKey("table.fields.additional.placement")
	var keep []string
	dropped := false
	for entry := range strings.SplitSeq(v, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		// The relay's own parser, entry by entry: what it refuses is a gap,
		// the rest is kept.
		fs, err := router.ParseFields(entry)
		switch {
		case err != nil:
			c.gap(key, entry, "%v; the entry is left out of message.fields", err)
		case fs[0].Placement == router.PlaceHeader && fs[0].Alias == router.HeaderID:
			c.gap(key, entry, "Debezium sends this header next to its own id header, two headers named id; the relay sends one (message.headers: id): the entry is left out of message.fields, give it another alias to keep it")
		default:
			keep = append(keep, entry)
			continue
		}
		dropped = true
	}
	if len(keep) == 0 {
		return
	}
	if !dropped {
		keep = []string{v} // verbatim
	}
	c.set("message.fields", strings.Join(keep, ","), key)
}

// routerOptions handles the EventRouter options that are not mapped, and
// unknown ones.
func (c *converter) routerOptions() {
	expand := false
	if v, has := c.opt("table.expand.json.payload"); has && strings.EqualFold(v, "true") {
		expand = true
		c.gap(c.routerKey("table.expand.json.payload"), v, "the relay sends the payload's bytes as stored; Debezium parsed a JSON string payload into a structure, so with JsonConverter consumers got a JSON object where the relay sends a JSON string: store the payload as json or jsonb with message.converter string, or change consumers")
	}
	for _, o := range []string{"table.json.payload.null.behavior", "table.json.payload.empty.array.behavior"} {
		if v, has := c.opt(o); has && !expand {
			c.note(c.routerKey(o), v, "has no effect without table.expand.json.payload")
		} else if has {
			c.gap(c.routerKey(o), v, "part of table.expand.json.payload, which the relay does not do")
		}
	}
	if v, has := c.opt("table.op.invalid.behavior"); has {
		switch strings.ToLower(v) {
		case "warn", "":
		case "error":
			c.note(c.routerKey("table.op.invalid.behavior"), v, "Debezium logged an error for each update or delete of the outbox table; the relay ignores them too, counting them and logging once per kind")
		default:
			c.gap(c.routerKey("table.op.invalid.behavior"), v, "Debezium stopped on an update or delete of the outbox table; the relay ignores them, counting them and logging once per kind: alert on the relay's log or metrics if they must not happen")
		}
	}
	if v, has := c.opt("table.field.additional.missing"); has && !strings.EqualFold(v, "error") {
		c.gap(c.routerKey("table.field.additional.missing"), v, "Debezium skipped a message.fields column missing from the table; the relay stops at it: remove such columns from message.fields")
	}
	if v, has := c.opt("table.field.event.schema.version"); has {
		c.gap(c.routerKey("table.field.event.schema.version"), v, "the relay sets no schema version; Debezium put it in the value's Connect schema, which only a schema-carrying converter (Avro, JsonConverter with schemas) writes: drop the option if consumers do not read it")
	}
	if v, has := c.opt("tracing.span.context.field"); has && v != "" {
		// The relay sends the column's trace context as traceparent and
		// tracestate, without a span of its own (Debezium's db-log-write).
		c.set("outbox.columns.tracing_span_context", v, c.routerKey("tracing.span.context.field"))
	}
	for _, o := range []string{"predicate", "negate"} {
		if v, has := c.opt(o); has {
			c.gap(c.routerKey(o), v, "the relay routes every insert of the outbox table; a predicate limiting the router has no equivalent")
		}
	}
	prefix := c.routerKey("")
	for _, k := range sortedKeys(c.conn) {
		if !strings.HasPrefix(k, prefix) || c.used[k] {
			continue
		}
		c.used[k] = true
		v := c.conn[k]
		option := strings.TrimPrefix(k, prefix)
		if strings.HasPrefix(option, "tracing.") {
			c.gap(k, v, "the relay propagates the row's trace context (outbox.columns.tracing_span_context) as the traceparent and tracestate headers, but creates no span of its own (Debezium's db-log-write span, ActivateTracingSpan)")
			continue
		}
		c.gap(k, v, "not an EventRouter option the relay knows: check what it does; the relay has no equivalent")
	}
}

// converterKind classifies a Kafka Connect converter class.
func converterKind(class string) string {
	switch class {
	case "org.apache.kafka.connect.storage.StringConverter":
		return "string"
	case "org.apache.kafka.connect.json.JsonConverter":
		return "json"
	case "org.apache.kafka.connect.converters.ByteArrayConverter",
		"io.debezium.converters.ByteArrayConverter",
		"io.debezium.converters.BinaryDataConverter":
		return "bytes"
	}
	return ""
}

// effective returns the converter the connector's records went through for
// key.converter or value.converter: the connector's own, else the worker's,
// with the same configuration's schemas.enable.
func (c *converter) effective(which string) (key, class, schemas string, ok bool) {
	if v, has := c.get(which); has && v != "" {
		s, _ := c.get(which + ".schemas.enable")
		return which, v, s, true
	}
	if v := strings.TrimSpace(c.worker[which]); v != "" {
		return which, v, strings.TrimSpace(c.worker[which+".schemas.enable"]), true
	}
	return which, "", "", false
}

func (c *converter) converters() {
	kinds := make(map[string]string)
	classes := make(map[string]string)
	ok := true
	for _, which := range []string{"key.converter", "value.converter"} {
		key, class, schemas, found := c.effective(which)
		for k := range c.conn {
			if strings.HasPrefix(k, which+".") {
				c.used[k] = true
			}
		}
		if !found {
			c.gap(which, "", "not set in the connector's configuration or the worker's: set message.converter to string (StringConverter) or json (JsonConverter without schemas) as consumers expect")
			ok = false
			continue
		}
		kind := converterKind(class)
		switch {
		case kind == "":
			c.gap(key, class, "the relay writes keys and values as StringConverter (message.converter string) or schemaless JsonConverter (json) do; this converter's format is not reproduced: consumers must change to one of those")
			ok = false
		case kind == "json" && !strings.EqualFold(schemas, "false"):
			c.gap(key+".schemas.enable", schemas, "JsonConverter with schemas enabled (Kafka's default) wraps each %s in a {\"schema\", \"payload\"} envelope; the relay writes the schemaless form (message.converter json): consumers reading the envelope must change", strings.TrimSuffix(which, ".converter"))
		case kind == "bytes" && which == "key.converter":
			c.gap(key, class, "a byte-array key converter cannot write Debezium's string key, so this connector did not work as configured: choose StringConverter or JsonConverter")
			ok = false
		}
		kinds[which], classes[which] = kind, class
	}
	if ok {
		switch k, v := kinds["key.converter"], kinds["value.converter"]; {
		case k == v:
			c.set("message.converter", k, "key.converter, value.converter")
		case k == "string" && v == "bytes":
			c.set("message.converter", "string", "key.converter, value.converter")
			c.note("value.converter", classes["value.converter"], "a byte-array value converter writes a bytea payload's bytes as they are, as message.converter string does")
		default:
			c.gap("value.converter", classes["value.converter"], "key.converter is %s and value.converter is %s; the relay uses one converter for both (message.converter): set string or json, whichever consumers of the values need, and check the keys", classes["key.converter"], classes["value.converter"])
		}
	}
	hc := strings.TrimSpace(c.conn["header.converter"])
	if hc == "" {
		hc = strings.TrimSpace(c.worker["header.converter"])
	}
	c.used["header.converter"] = true
	switch hc {
	case "", "org.apache.kafka.connect.storage.SimpleHeaderConverter", "org.apache.kafka.connect.storage.StringConverter":
	default:
		c.gap("header.converter", hc, "the relay writes header values as Kafka Connect's SimpleHeaderConverter does (the default); this converter's format is not reproduced")
	}
	for k := range c.conn {
		if strings.HasPrefix(k, "header.converter.") {
			c.used[k] = true
		}
	}
}

// producerValue returns a producer setting as Kafka Connect applies it to the
// connector's producer: the connector's producer.override.<name>, else the
// worker's producer.<name>, else the worker's <name> (which configures the
// worker's own clients; used as a hint when the producer's is not set).
func (c *converter) producerValue(name string) (key, value string, ok bool) {
	if v, has := c.get("producer.override." + name); has {
		return "producer.override." + name, v, true
	}
	for _, k := range []string{"producer." + name, name} {
		if v, has := c.worker[k]; has {
			return k, strings.TrimSpace(v), true
		}
	}
	return "", "", false
}

// jaasUsername reads username="..." from a sasl.jaas.config value.
var jaasUsername = regexp.MustCompile(`username\s*=\s*"([^"]*)"`)

func (c *converter) kafka() {
	if key, v, ok := c.producerValue("bootstrap.servers"); ok && v != "" {
		if c.literal(key, v, "kafka.brokers") {
			var bs []string
			for b := range strings.SplitSeq(v, ",") {
				if b = strings.TrimSpace(b); b != "" {
					bs = append(bs, b)
				}
			}
			c.set("kafka.brokers", strings.Join(bs, ","), key)
		}
	} else if c.worker == nil {
		c.gap("bootstrap.servers", "", "the brokers are in the worker's configuration, which was not given: set kafka.brokers")
	} else {
		c.gap("bootstrap.servers", "", "not set in the worker's configuration: set kafka.brokers")
	}
	if key, v, ok := c.producerValue("compression.type"); ok {
		switch strings.ToLower(v) {
		case "none", "":
		case "gzip", "snappy", "lz4", "zstd":
			c.set("kafka.compression", strings.ToLower(v), key)
		default:
			c.gap(key, v, "not a compression the relay knows: set kafka.compression to none, gzip, snappy, lz4 or zstd")
		}
	}
	protoKey, proto, _ := c.producerValue("security.protocol")
	proto = strings.ToUpper(proto)
	switch proto {
	case "", "PLAINTEXT":
		return
	case "SSL", "SASL_SSL":
		c.set("kafka.tls.enabled", "true", protoKey)
		c.tls()
	case "SASL_PLAINTEXT":
	default:
		c.gap(protoKey, proto, "not a Kafka security protocol the relay knows: configure kafka.tls.* and kafka.sasl.*")
		return
	}
	if proto == "SASL_SSL" || proto == "SASL_PLAINTEXT" {
		c.sasl()
	}
}

func (c *converter) tls() {
	if key, v, ok := c.producerValue("ssl.truststore.location"); ok && v != "" {
		c.gap(key, v, "a Java trust store; the relay reads PEM: export the CA certificate (keytool -exportcert -rfc -keystore %s -alias <ca>) and set kafka.tls.ca_file", v)
	} else {
		c.note("ssl.truststore.location", "", "not set: Java trusted its default CAs; the relay trusts the system's roots unless kafka.tls.ca_file is set")
	}
	if key, v, ok := c.producerValue("ssl.keystore.location"); ok && v != "" {
		c.gap(key, v, "a Java key store with the client certificate; the relay reads PEM: export certificate and key (e.g. openssl pkcs12 -in store.p12 -nokeys / -nocerts -nodes) and set kafka.tls.cert_file and kafka.tls.key_file")
	}
	if key, v, ok := c.producerValue("ssl.endpoint.identification.algorithm"); ok && v == "" {
		c.gap(key, v, "Java skipped host name verification; the relay verifies the broker's name: set kafka.tls.server_name to the name in its certificate, or (insecure) kafka.tls.insecure_skip_verify")
	}
}

func (c *converter) sasl() {
	key, mech, ok := c.producerValue("sasl.mechanism")
	if !ok || mech == "" {
		key, mech = "sasl.mechanism", "GSSAPI" // Kafka's default
	}
	switch strings.ToUpper(mech) {
	case "PLAIN":
		c.set("kafka.sasl.mechanism", "plain", key)
	case "SCRAM-SHA-256":
		c.set("kafka.sasl.mechanism", "scram-sha-256", key)
	case "SCRAM-SHA-512":
		c.set("kafka.sasl.mechanism", "scram-sha-512", key)
	default:
		c.gap(key, mech, "the relay authenticates with SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 only: give it such a user (kafka.sasl.*)")
		return
	}
	jaasKey, jaas, ok := c.producerValue("sasl.jaas.config")
	if !ok {
		c.gap("sasl.jaas.config", "", "not set: set kafka.sasl.username, and the password in RELAY_KAFKA_SASL_PASSWORD")
		return
	}
	if m := jaasUsername.FindStringSubmatch(jaas); m != nil && c.literal(jaasKey, m[1], "kafka.sasl.username") {
		c.set("kafka.sasl.username", m[1], jaasKey)
	} else if m == nil {
		c.gap(jaasKey, redacted, "no username=\"...\" in it: set kafka.sasl.username")
	}
	c.note(jaasKey, redacted, "passwords are never copied: set the password in the environment, RELAY_KAFKA_SASL_PASSWORD")
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
