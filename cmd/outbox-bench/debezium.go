package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/debezium"
)

// The Debezium peer runs the same Kafka Connect 3.9.1 + Debezium 3.1.3.Final jars
// as internal/testenv/debezium (fetched by `scripts/dev.sh debezium-libs`), but
// not through that package: it is built on testing.TB and links the testing
// package and testcontainers-go, which have no place in a command. The few
// pieces the bench needs (the jar directory, a properties writer, the REST
// status) are repeated here; the tuning is the bench's own.

const (
	dbzLibsDir     = "outbox-relay/debezium-3.1.3/libs" // below os.UserCacheDir(), as scripts/dev.sh writes it
	dbzVersion     = "3.1.3.Final"
	dbzStartLimit  = 3 * time.Minute
	dbzConnector   = "outbox"
	dbzTopicPrefix = "outbox.dbz." // route.topic.replacement: Debezium's topics never mix with the relay's
	// dbzWarmUp is how long Debezium runs at the sustained rate before its
	// latency is measured, so that the JIT has compiled its hot paths (the
	// relay is compiled ahead of time and gets none).
	dbzWarmUp = 15 * time.Second
)

// dbzJVMFlags are the JVM options of the worker: Kafka's own launch script's
// performance options (kafka-run-class.sh: G1, 20 ms pause goal), a 1 GiB heap
// limit (connect-standalone.sh allows 2 GiB; a 65,536-record queue of ~0.5 KiB
// events needs a few tens of MiB, so 1 GiB never limits throughput) and a small
// initial heap, so that peak RSS is what Debezium uses rather than a heap it was
// handed and never touched. Full tiered compilation (C2): the drain is long
// enough for it to pay off.
var dbzJVMFlags = []string{
	"-Xms64m", "-Xmx1g",
	"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
	"-Djava.awt.headless=true",
}

// dbzWorkerProps are the tuned worker properties (the rest are per run: see
// dbzConfig). The producer settings are what a throughput-minded operator sets:
// batches of up to 1 MiB that wait at most 5 ms to fill, acks=all as the relay.
var dbzWorkerProps = map[string]string{
	"key.converter":                     "org.apache.kafka.connect.storage.StringConverter",
	"value.converter":                   "org.apache.kafka.connect.storage.StringConverter",
	"offset.flush.interval.ms":          "1000", // Debezium confirms the slot only after a flush: keep it close to the relay's 200 ms checkpoint
	"offset.flush.timeout.ms":           "10000",
	"plugin.discovery":                  "service_load",
	"task.shutdown.graceful.timeout.ms": "10000",
	"producer.acks":                     "all",
	"producer.linger.ms":                "5",
	"producer.batch.size":               "1048576",
	"producer.buffer.memory":            "67108864",
	"producer.max.request.size":         "1048576",
	"producer.compression.type":         "none",
}

// dbzConnectorProps are the tuned connector properties; dbzConfig adds the
// database, slot, publication and topic names.
var dbzConnectorProps = map[string]string{
	"connector.class":             "io.debezium.connector.postgresql.PostgresConnector",
	"tasks.max":                   "1",
	"plugin.name":                 "pgoutput",
	"publication.autocreate.mode": "disabled",
	"table.include.list":          "public.outbox",
	"snapshot.mode":               "no_data",
	"max.batch.size":              "8192",
	"max.queue.size":              "65536",
	"poll.interval.ms":            "10",
	"status.update.interval.ms":   "1000",
	"key.converter":               "org.apache.kafka.connect.storage.StringConverter",
	"value.converter":             "org.apache.kafka.connect.storage.StringConverter",
	// The outbox EventRouter on the relay's table layout, with the relay's
	// headers (id is the router's own), so both write the same messages.
	"transforms":                                          "outbox",
	"transforms.outbox.type":                              "io.debezium.transforms.outbox.EventRouter",
	"transforms.outbox.table.field.event.id":              "id",
	"transforms.outbox.table.field.event.key":             "aggregate_id",
	"transforms.outbox.table.field.event.payload":         "payload",
	"transforms.outbox.route.by.field":                    "aggregate_type",
	"transforms.outbox.route.topic.replacement":           dbzTopicPrefix + "${routedByValue}",
	"transforms.outbox.table.fields.additional.placement": "event_type:header:event_type,aggregate_type:header:aggregate_type",
}

// dbzLog4j keeps Connect's and Debezium's lifecycle lines and quiets config dumps.
var dbzLog4j = map[string]string{
	"log4j.rootLogger":                                   "INFO, stdout",
	"log4j.appender.stdout":                              "org.apache.log4j.ConsoleAppender",
	"log4j.appender.stdout.layout":                       "org.apache.log4j.PatternLayout",
	"log4j.appender.stdout.layout.ConversionPattern":     "[%d] %p %m (%c)%n",
	"log4j.logger.org.apache.kafka.clients":              "WARN",
	"log4j.logger.org.apache.kafka.common.config":        "WARN",
	"log4j.logger.org.apache.kafka.connect.runtime.rest": "WARN",
	"log4j.logger.org.eclipse.jetty":                     "WARN",
	"log4j.logger.org.reflections":                       "ERROR",
}

// dbzTopicsFor returns the topics the router sends the prefixed aggregate types to.
func dbzTopicsFor(typePrefix string) []string {
	ts := make([]string, len(aggregateTypes))
	for i, t := range aggregateTypes {
		ts[i] = dbzTopicPrefix + typePrefix + t
	}
	return ts
}

// dbzLibs returns the jar directory, or an error naming how to fill it.
func dbzLibs() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("debezium: no cache directory for the jars: %w", err)
	}
	dir := filepath.Join(cache, dbzLibsDir)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		return "", fmt.Errorf("debezium: the Kafka Connect + Debezium %s jars are missing from %s: fetch them with `make debezium-libs`", dbzVersion, dir)
	}
	return dir, nil
}

// dbzConfig returns the worker's and the connector's properties for one
// worker streaming slot and publication of db.
func dbzConfig(db *benchDB, brokers []string, slot, publication, offsetFile string, port int) (worker, connector map[string]string, err error) {
	cfg, err := pgx.ParseConfig(db.DSN)
	if err != nil {
		return nil, nil, fmt.Errorf("parse dsn: %w", err)
	}
	worker = maps.Clone(dbzWorkerProps)
	maps.Copy(worker, map[string]string{
		"bootstrap.servers":            strings.Join(brokers, ","),
		"offset.storage.file.filename": offsetFile,
		"listeners":                    "http://127.0.0.1:" + strconv.Itoa(port),
		"rest.advertised.host.name":    "127.0.0.1",
		"rest.advertised.port":         strconv.Itoa(port),
	})
	connector = maps.Clone(dbzConnectorProps)
	maps.Copy(connector, map[string]string{
		"name":              dbzConnector,
		"database.hostname": cfg.Host,
		"database.port":     strconv.Itoa(int(cfg.Port)),
		"database.user":     cfg.User,
		"database.password": cfg.Password,
		"database.dbname":   cfg.Database,
		"database.sslmode":  "disable",
		"topic.prefix":      db.Name,
		"slot.name":         slot,
		"publication.name":  publication,
	})
	return worker, connector, nil
}

// dbzConfigText renders the tuned configuration for the report: the JVM flags
// and every property that is the same in every run (names, ports and the
// password are left out).
func dbzConfigText() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# JVM (Java 17): %s\n", strings.Join(dbzJVMFlags, " "))
	b.WriteString("# worker.properties (plus bootstrap.servers, listeners, offset.storage.file.filename)\n")
	b.WriteString(debezium.FormatProperties(dbzWorkerProps))
	b.WriteString("# connector.properties (plus name, database.*, topic.prefix, slot.name, publication.name)\n")
	b.WriteString(debezium.FormatProperties(dbzConnectorProps))
	return b.String()
}

// dbzWorker is one Kafka Connect standalone JVM running the connector.
type dbzWorker struct {
	*proc
	url  string
	slot string
}

// startDebezium writes the properties into a temporary directory (they hold
// the database password: they must not land among the reports) and launches
// the JVM, logging to dir/<label>.log. It returns at once; waitStreaming says
// when Debezium reads its slot.
func startDebezium(db *benchDB, brokers []string, slot, publication, dir, label string) (*dbzWorker, error) {
	libs, err := dbzLibs()
	if err != nil {
		return nil, err
	}
	wdir, err := os.MkdirTemp("", "outbox-bench-"+label+"-")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("debezium: free port for the REST listener: %w", err)
	}
	worker, connector, err := dbzConfig(db, brokers, slot, publication, filepath.Join(wdir, "offsets.dat"), port)
	if err != nil {
		return nil, err
	}
	workerFile, connectorFile, log4jFile := filepath.Join(wdir, "worker.properties"), filepath.Join(wdir, "connector.properties"), filepath.Join(wdir, "log4j.properties")
	for path, props := range map[string]map[string]string{workerFile: worker, connectorFile: connector, log4jFile: dbzLog4j} {
		if err := writeProps(path, props); err != nil {
			_ = os.RemoveAll(wdir)
			return nil, err
		}
	}
	args := append(slices.Clone(dbzJVMFlags), "-Dlog4j.configuration=file:"+log4jFile, "-cp", filepath.Join(libs, "*"),
		"org.apache.kafka.connect.cli.ConnectStandalone", workerFile, connectorFile)
	p, err := startProc("java", args, os.Environ(), filepath.Join(dir, label+".log"))
	if err != nil {
		_ = os.RemoveAll(wdir)
		return nil, fmt.Errorf("debezium: %w (Java 17 is needed: `scripts/dev.sh deps` installs it)", err)
	}
	p.afterStop = func() { _ = os.RemoveAll(wdir) }
	return &dbzWorker{proc: p, url: "http://127.0.0.1:" + strconv.Itoa(port), slot: slot}, nil
}

// waitStreaming polls the REST status and the slot until the task is RUNNING
// and the slot active (START_REPLICATION issued): from then on Debezium reads
// WAL. It returns that moment.
func (w *dbzWorker) waitStreaming(ctx context.Context, conn *pgx.Conn) (time.Time, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(dbzStartLimit)
	last := errors.New("no answer yet")
	for {
		if w.exited() {
			return time.Time{}, fmt.Errorf("debezium: java exited: %s: %s", w.usage().ExitError, w.logTail(10))
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("debezium: not streaming after %s: %v: %s", dbzStartLimit, last, w.logTail(10))
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		st, err := debezium.GetConnectorStatus(ctx, client, w.url, dbzConnector)
		if err != nil {
			last = err
			continue
		}
		if err := st.Failed(false); err != nil {
			return time.Time{}, fmt.Errorf("debezium: %w", err)
		}
		var active bool
		if err := conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", w.slot).Scan(&active); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return time.Time{}, fmt.Errorf("debezium: read slot %s: %w", w.slot, err)
		}
		if active {
			return time.Now(), nil
		}
		last = fmt.Errorf("connector %s, slot %s not active yet", st.Connector.State, w.slot)
	}
}

// failedTask returns the trace of a FAILED connector or task: Debezium's task
// stops for good on some errors (a record over max.request.size), which would
// otherwise look like a slow drain.
func (w *dbzWorker) failedTask(ctx context.Context) error {
	st, err := debezium.GetConnectorStatus(ctx, &http.Client{Timeout: 2 * time.Second}, w.url, dbzConnector)
	if err != nil {
		return nil // the REST server busy is not a failure
	}
	return st.Failed(false)
}

// writeProps writes a Java properties file, sorted (debezium.FormatProperties).
func writeProps(path string, props map[string]string) error {
	if err := os.WriteFile(path, []byte(debezium.FormatProperties(props)), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
