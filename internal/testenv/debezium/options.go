package debezium

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	dbz "github.com/outbox-relay/outbox-relay/internal/debezium"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Options configure one worker and its connector. The zero value of each field is
// its documented default; only DSN is required.
type Options struct {
	// DSN is the test's database, as testenv.Postgres(t).DSN. Its host, port, user,
	// password and database become the connector's database.* properties; it must
	// name a TCP host, not a Unix socket directory. Required.
	DSN string
	// Slot is slot.name. Default: a testenv.UniqueName.
	Slot string
	// Publication is publication.name, created by Debezium for Table alone
	// (publication.autocreate.mode=filtered) unless it exists. Default: a
	// testenv.UniqueName.
	Publication string
	// Table is table.include.list. Default: "public.outbox".
	Table string
	// TopicPrefix is topic.prefix, which Debezium requires; the router's topics
	// (route.topic.replacement, default "outbox.event.${routedByValue}") do not use
	// it. Default: a testenv.UniqueName.
	TopicPrefix string
	// Name is the connector's name. Default: "outbox".
	Name string
	// Converter selects key.converter and value.converter: "string"
	// (StringConverter) or "json" (JsonConverter, schemas.enable=false). The header
	// converter is always Connect's default (SimpleHeaderConverter). Default: "string".
	Converter string
	// OffsetFlushInterval is offset.flush.interval.ms: how often Connect writes the
	// offsets (to the file or topic) and then tells Debezium, which confirms the LSN
	// to Postgres. Default: 1s.
	OffsetFlushInterval time.Duration
	// Distributed runs ConnectDistributed instead of ConnectStandalone: a
	// one-worker cluster whose group.id and config, offsets and status topics are
	// testenv.UniqueNames (replication factor 1, offset.storage.partitions 3), its
	// offsets in OffsetsTopic instead of OffsetFile. Start creates the connector
	// with POST /connectors, with the properties it writes to ConnectorFile.
	// Default: false (standalone).
	Distributed bool
	// Props are added to the connector's properties last, overriding Start's: set
	// transforms.outbox.* here.
	Props map[string]string
	// WorkerProps are added to the worker's properties last, overriding Start's.
	WorkerProps map[string]string
	// JVMFlags replace the JVM's options (the class path, log4j file and main class
	// are always Start's). Default: C1 only, the serial collector and a 512 MiB heap
	// (testJVMFlags): a test's worker lives for seconds on shared cores. A long run
	// measuring throughput (outbox-bench) wants C2 and a pause-time collector.
	JVMFlags []string
}

// testJVMFlags are the JVM options when Options.JVMFlags is nil: C1 only and the
// serial collector, because a worker lives for seconds, so start-up time matters
// more than peak throughput, and two cores are shared.
var testJVMFlags = []string{"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms64m", "-Xmx512m", "-Djava.awt.headless=true"}

// validate fills the defaults of a copy of o, names included, and fails the test on
// a bad value.
func (o Options) validate(t testing.TB) Options {
	t.Helper()
	if o.DSN == "" {
		t.Fatalf("debezium: Options.DSN is empty: pass the test database, testenv.Postgres(t).DSN")
	}
	if o.Slot == "" {
		o.Slot = testenv.UniqueName(t, "dbz_slot")
	}
	if o.Publication == "" {
		o.Publication = testenv.UniqueName(t, "dbz_pub")
	}
	if o.TopicPrefix == "" {
		o.TopicPrefix = testenv.UniqueName(t, "dbz")
	}
	o, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// withDefaults fills the defaults that need no test (all but the names) of a copy
// of o and rejects a bad value.
func (o Options) withDefaults() (Options, error) {
	if o.DSN == "" {
		return o, errors.New("debezium: Options.DSN is empty")
	}
	if o.Table == "" {
		o.Table = "public.outbox"
	}
	if o.Name == "" {
		o.Name = "outbox"
	}
	if o.Converter == "" {
		o.Converter = "string"
	}
	if o.Converter != "string" && o.Converter != "json" {
		return o, fmt.Errorf("debezium: Options.Converter = %q: use \"string\" or \"json\"", o.Converter)
	}
	if o.OffsetFlushInterval == 0 {
		o.OffsetFlushInterval = time.Second
	}
	if o.OffsetFlushInterval < 0 {
		return o, fmt.Errorf("debezium: Options.OffsetFlushInterval = %s: use a positive duration or 0 for 1s", o.OffsetFlushInterval)
	}
	return o, nil
}

// standaloneProps are a standalone worker's properties, its offsets in offsetFile.
func (o Options) standaloneProps(brokers []string, offsetFile string, port int) map[string]string {
	return o.workerProps(brokers, port, map[string]string{
		"offset.storage.file.filename": offsetFile,
	})
}

// distributedProps are the properties of a distributed worker alone in group,
// whose config, offsets and status topics are named after group. Connect creates
// the topics (compacted) when it starts.
func (o Options) distributedProps(brokers []string, group string, port int) map[string]string {
	return o.workerProps(brokers, port, map[string]string{
		"group.id":                          group,
		"config.storage.topic":              group + ".config",
		"offset.storage.topic":              group + ".offsets",
		"status.storage.topic":              group + ".status",
		"config.storage.replication.factor": "1",
		"offset.storage.replication.factor": "1",
		"status.storage.replication.factor": "1",
		"offset.storage.partitions":         strconv.Itoa(offsetsPartitions),
		"status.storage.partitions":         "1",
	})
}

// workerProps are the properties both kinds of worker share, then mode's, then
// Options.WorkerProps.
func (o Options) workerProps(brokers []string, port int, mode map[string]string) map[string]string {
	p := map[string]string{
		"bootstrap.servers":                 strings.Join(brokers, ","),
		"offset.flush.interval.ms":          strconv.FormatInt(o.OffsetFlushInterval.Milliseconds(), 10),
		"listeners":                         "http://127.0.0.1:" + strconv.Itoa(port),
		"rest.advertised.host.name":         "127.0.0.1",
		"rest.advertised.port":              strconv.Itoa(port),
		"task.shutdown.graceful.timeout.ms": "20000",
		// The jars carry ServiceLoader manifests: reading them is seconds faster than
		// scanning every class on the classpath (the default, hybrid_warn).
		"plugin.discovery": "service_load",
		// Kafka 3.9's default, stated so a test of latency does not depend on it.
		"producer.linger.ms": "0",
	}
	switch o.Converter {
	case "string":
		p["key.converter"] = "org.apache.kafka.connect.storage.StringConverter"
		p["value.converter"] = "org.apache.kafka.connect.storage.StringConverter"
	case "json":
		p["key.converter"] = "org.apache.kafka.connect.json.JsonConverter"
		p["value.converter"] = "org.apache.kafka.connect.json.JsonConverter"
		p["key.converter.schemas.enable"] = "false"
		p["value.converter.schemas.enable"] = "false"
	}
	maps.Copy(p, mode)
	maps.Copy(p, o.WorkerProps)
	return p
}

func (o Options) connectorProps(db *pgx.ConnConfig) map[string]string {
	sslmode := "disable"
	if db.TLSConfig != nil {
		sslmode = "prefer"
	}
	p := map[string]string{
		"name":                        o.Name,
		"connector.class":             connectorCl,
		"tasks.max":                   "1",
		"plugin.name":                 "pgoutput",
		"database.hostname":           db.Host,
		"database.port":               strconv.Itoa(int(db.Port)),
		"database.user":               db.User,
		"database.password":           db.Password,
		"database.dbname":             db.Database,
		"database.sslmode":            sslmode,
		"topic.prefix":                o.TopicPrefix,
		"slot.name":                   o.Slot,
		"publication.name":            o.Publication,
		"publication.autocreate.mode": "filtered",
		"table.include.list":          o.Table,
		"snapshot.mode":               "no_data",
		"transforms":                  "outbox",
		"transforms.outbox.type":      routerCl,
		// Latency only, not bytes: hand events to Connect every 50 ms (default 500)
		// and send the slot's flush position every second (default 10 s), so a test
		// sees confirmed_flush_lsn move soon after an offset flush.
		"poll.interval.ms":          "50",
		"status.update.interval.ms": "1000",
	}
	maps.Copy(p, o.Props)
	return p
}

// log4jProps keep Connect's and Debezium's INFO lines (lifecycle, offsets, LSNs) and
// quiet the clients' and REST server's dumps of every config value.
var log4jProps = map[string]string{
	"log4j.rootLogger":                                   "INFO, stdout",
	"log4j.appender.stdout":                              "org.apache.log4j.ConsoleAppender",
	"log4j.appender.stdout.layout":                       "org.apache.log4j.PatternLayout",
	"log4j.appender.stdout.layout.ConversionPattern":     "[%d] %p %m (%c)%n",
	"log4j.logger.org.apache.kafka.clients":              "WARN",
	"log4j.logger.org.apache.kafka.common.config":        "WARN",
	"log4j.logger.org.apache.kafka.common.utils":         "WARN",
	"log4j.logger.org.apache.kafka.connect.runtime.rest": "WARN",
	"log4j.logger.org.eclipse.jetty":                     "WARN",
	"log4j.logger.org.reflections":                       "ERROR",
}

// writeProps writes a Java properties file, sorted so the file reads the same on every
// run (debezium.FormatProperties).
func writeProps(path string, props map[string]string) error {
	if err := os.WriteFile(path, []byte(dbz.FormatProperties(props)), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
