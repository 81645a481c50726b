// Package debezium runs the real Debezium against the test servers: the Postgres
// connector (3.1.3.Final, pgoutput) with its outbox EventRouter, in a Kafka Connect
// 3.9.1 worker, standalone or distributed (Options.Distributed), as a child JVM of
// the test.
//
// The relay claims to be a drop-in for Debezium's outbox router. Tests prove that by
// running both on the same rows and comparing what lands in Kafka byte for byte (keys,
// values, headers under each converter), and test migrations by handing Debezium's
// replication slot and offsets (a standalone worker's offset file or a distributed
// cluster's offsets topic) over to the relay. Neither can be checked against a
// description of Debezium, only against Debezium itself.
//
// Start launches one worker and returns once it streams; Stop and Kill end it. Each
// worker lives in t.TempDir(): worker.properties, connector.properties, the file
// offset store of a standalone worker (OffsetFile) and one log file (LogFile) with
// everything the JVM prints, whose tail is logged when the test fails. A distributed
// worker is a cluster of its own: its group and its config, offsets (OffsetsTopic)
// and status topics are unique to the test, and it gets the connector through its
// REST API.
//
// The jars come from `scripts/dev.sh debezium-libs` (run by `make test`), cached in
// ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/debezium-3.1.3/libs; without them
// Start fails the test naming that command. Under `go test -short` with no
// RELAY_TEST_* servers it skips, as testenv does; without -short it never skips.
//
// Start takes about 5 s on two cores (JVM start-up, then Debezium creating its
// publication and slot), two workers at once included, and a distributed worker a
// few seconds more (creating its topics, joining its group): start as few as a test
// needs.
// Everything here fails the test (t.Fatalf) on error, except Launch and Close, the
// same runner for a command: outbox-bench runs Debezium as a peer through them, its
// throughput tuning passed as Options (JVMFlags, Props, WorkerProps).
package debezium

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	dbz "github.com/outbox-relay/outbox-relay/internal/debezium"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Version is the Debezium release Start runs; scripts/debezium/pom.xml pins it.
const Version = "3.1.3.Final"

const (
	// libsDir is below os.UserCacheDir(); scripts/dev.sh writes it (DEBEZIUM_LIBS).
	libsDir          = "outbox-relay/debezium-3.1.3/libs"
	howToFetch       = "fetch them with `scripts/dev.sh debezium-libs` (or run `make test`)"
	standaloneClass  = "org.apache.kafka.connect.cli.ConnectStandalone"
	distributedClass = "org.apache.kafka.connect.cli.ConnectDistributed"
	connectorCl      = "io.debezium.connector.postgresql.PostgresConnector"
	routerCl         = "io.debezium.transforms.outbox.EventRouter"

	// offsetsPartitions is a distributed worker's offset.storage.partitions (Kafka
	// Connect's default is 25): more than one, so that a reader of the offsets topic
	// must look in every partition for the connector's key.
	offsetsPartitions = 3

	// startTimeout is generous: two JVMs (broker and worker) share two cores, and a
	// parallel test run adds more.
	startTimeout = 120 * time.Second
	// stopTimeout bounds a graceful stop; Connect's own task shutdown timeout
	// (task.shutdown.graceful.timeout.ms, set below) is well inside it.
	stopTimeout = 60 * time.Second
	tailLines   = 60
)

// Connect is a running (or ended) Kafka Connect worker with one Debezium connector.
// Its methods are safe for concurrent use.
type Connect struct {
	name        string
	slot        string
	publication string
	url         string // REST base, http://127.0.0.1:port
	logFile     string
	offsetFile  string // standalone only
	// offsetsTopic is a distributed worker's offset.storage.topic.
	offsetsTopic string
	// The properties files the worker runs with: what an operator would
	// hand to `outbox-relay migrate debezium`.
	workerFile, connectorFile string

	cmd     *exec.Cmd
	done    chan struct{} // closed when the JVM has exited
	waitErr error         // set before done is closed

	mu         sync.Mutex
	tailLogged bool
}

// Start launches a worker running Debezium's Postgres connector with the outbox
// EventRouter (transforms=outbox), creating the connector through the REST API when
// Options.Distributed, and returns once the connector and its task are
// RUNNING and Debezium's replication slot is active, so rows committed after Start
// returns are captured (snapshot.mode=no_data: rows committed before it are not).
// It fails the test when that takes longer than two minutes, with the log's tail.
// The worker is killed at cleanup if it still runs.
func Start(t testing.TB, opts Options) *Connect {
	t.Helper()
	skipUnlessServers(t)
	libs := requireLibs(t)
	kafka := testenv.Kafka(t)
	o := opts.validate(t)
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c, err := launch(ctx, o, libs, kafka.Brokers, t.TempDir(), testenv.UniqueName(t, "dbz_connect"))
	if c != nil {
		t.Cleanup(func() {
			c.kill()
			if t.Failed() {
				c.logTail(t)
			}
		})
	}
	if err != nil {
		if c != nil {
			c.mu.Lock()
			c.tailLogged = true
			c.mu.Unlock()
		}
		t.Fatalf("debezium: %v", err)
	}
	t.Logf("debezium: connector %s streaming from slot %s after %s (REST %s, log %s)",
		c.name, c.slot, time.Since(began).Round(time.Millisecond), c.url, c.logFile)
	return c
}

// Launch is Start for a command (outbox-bench), not a test: it writes the worker's
// files into dir (which must exist; the properties hold the database password),
// streams to brokers and returns once Debezium streams, or an error with the log's
// tail, the JVM killed. It waits at most two minutes, less if ctx ends first.
// Slot, Publication and TopicPrefix have no default here: pass them. The caller
// must end the worker with Close (Pdeathsig kills it should the caller die first).
func Launch(ctx context.Context, opts Options, brokers []string, dir string) (*Connect, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	if o.Slot == "" || o.Publication == "" || o.TopicPrefix == "" {
		return nil, errors.New("debezium: Launch needs Options.Slot, Publication and TopicPrefix")
	}
	if o.Distributed {
		return nil, errors.New("debezium: Launch runs standalone workers only: leave Options.Distributed false")
	}
	libs, err := libsDirectory()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	c, err := launch(ctx, o, libs, brokers, dir, "")
	if err != nil {
		if c != nil {
			c.kill()
		}
		return nil, fmt.Errorf("debezium: %w", err)
	}
	return c, nil
}

// launch starts the JVM with its files in dir and waits until it streams. On an
// error after the JVM started it returns the worker too, already killed, so the
// caller can read its log. group names a distributed worker's group and topics.
func launch(ctx context.Context, o Options, libs string, brokers []string, dir, group string) (*Connect, error) {
	db, err := pgx.ParseConfig(o.DSN)
	if err != nil {
		return nil, fmt.Errorf("parse Options.DSN: %w", err)
	}
	if strings.HasPrefix(db.Host, "/") {
		return nil, fmt.Errorf("Options.DSN names the Unix socket directory %s: Debezium (JDBC) needs a TCP host such as 127.0.0.1", db.Host)
	}
	port, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("find a free port for the REST listener: %w", err)
	}
	c := &Connect{
		name:          o.Name,
		slot:          o.Slot,
		publication:   o.Publication,
		url:           "http://127.0.0.1:" + strconv.Itoa(port),
		logFile:       filepath.Join(dir, "connect.log"),
		workerFile:    filepath.Join(dir, "worker.properties"),
		connectorFile: filepath.Join(dir, "connector.properties"),
		done:          make(chan struct{}),
	}
	workerFile, connectorFile := c.workerFile, c.connectorFile
	log4jFile := filepath.Join(dir, "log4j.properties")
	var worker map[string]string
	mainClass, args := standaloneClass, []string{workerFile, connectorFile}
	if o.Distributed {
		worker = o.distributedProps(brokers, group, port)
		c.offsetsTopic = worker["offset.storage.topic"]
		mainClass, args = distributedClass, []string{workerFile}
	} else {
		c.offsetFile = filepath.Join(dir, "offsets.dat")
		worker = o.standaloneProps(brokers, c.offsetFile, port)
	}
	connector := o.connectorProps(db)
	for path, props := range map[string]map[string]string{workerFile: worker, connectorFile: connector, log4jFile: log4jProps} {
		if err := writeProps(path, props); err != nil {
			return nil, err
		}
	}

	logf, err := os.Create(c.logFile)
	if err != nil {
		return nil, fmt.Errorf("create log: %w", err)
	}
	defer logf.Close() // the child has its own descriptor
	jvm := o.JVMFlags
	if jvm == nil {
		jvm = testJVMFlags
	}
	c.cmd = exec.Command("java", append(append(slices.Clone(jvm),
		"-Dlog4j.configuration=file:"+log4jFile,
		"-cp", filepath.Join(libs, "*"),
		mainClass), args...)...)
	c.cmd.Dir = dir
	// log4j writes to stdout, so one file holds the log and whatever the JVM prints
	// before logging starts or when it dies.
	c.cmd.Stdout = logf
	c.cmd.Stderr = logf
	// Pdeathsig: a test binary that dies (a panic, a timeout) must not leave a JVM
	// streaming from a slot. Setpgid: a ^C to `go test` reaches the worker only
	// through the cleanup, which kills it, not by a half-handled SIGINT.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	began := time.Now()
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start java (Java 17 is needed; `scripts/dev.sh deps` installs it): %w", err)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.done)
	}()
	if err := c.start(ctx, o, connector); err != nil {
		c.kill()
		return c, fmt.Errorf("connector %s not streaming %s after %s: %w\nlast lines of %s:\n%s",
			c.name, o.Table, time.Since(began).Round(time.Millisecond), err, c.logFile, tail(c.logFile, tailLines))
	}
	return c, nil
}

// start creates the connector of a distributed worker and waits until it streams.
func (c *Connect) start(ctx context.Context, o Options, connector map[string]string) error {
	if o.Distributed {
		if err := c.createConnector(ctx, connector); err != nil {
			return err
		}
	}
	return c.waitStreaming(ctx, o.DSN)
}

// Stop sends SIGTERM and waits until the JVM has exited. Connect stops the task
// first, which writes its last source offsets to OffsetFile (to OffsetsTopic,
// waiting for the broker's acknowledgement, when distributed), so after Stop they
// hold what Debezium last handed to Connect. A worker that ignores SIGTERM for a
// minute is killed and the test fails. Stop after Stop or Kill does nothing.
func (c *Connect) Stop(t testing.TB) {
	t.Helper()
	if c.exited() {
		return
	}
	began := time.Now()
	if err := c.terminate(); err != nil {
		t.Errorf("debezium: %v (log %s)", err, c.logFile)
		return
	}
	t.Logf("debezium: worker stopped after %s (%v)", time.Since(began).Round(time.Millisecond), c.waitErr)
}

// Close is Stop for a command: SIGTERM, then SIGKILL after a minute, which it
// reports as an error. Close after Stop, Kill or Close does nothing.
func (c *Connect) Close() error {
	if c.exited() {
		return nil
	}
	return c.terminate()
}

// terminate sends SIGTERM and waits; a worker that ignores it for stopTimeout is
// killed and reported.
func (c *Connect) terminate() error {
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop worker: %w", err)
	}
	select {
	case <-c.done:
		return nil
	case <-time.After(stopTimeout):
		c.kill()
		return fmt.Errorf("worker ignored SIGTERM for %s: killed it", stopTimeout)
	}
}

// Kill sends SIGKILL and waits until the JVM has exited: offsets written since the
// last flush (Options.OffsetFlushInterval) are lost, as in a crash. Kill after Stop
// or Kill does nothing.
func (c *Connect) Kill(t testing.TB) {
	t.Helper()
	c.kill()
}

func (c *Connect) kill() {
	if c.exited() {
		return
	}
	// An error means the process has just exited by itself: Wait reaps it either way.
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

func (c *Connect) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// WorkerFile is the worker's properties file.
func (c *Connect) WorkerFile() string { return c.workerFile }

// ConnectorFile is the connector's properties file.
func (c *Connect) ConnectorFile() string { return c.connectorFile }

// OffsetFile is a standalone worker's offset store (offset.storage.file.filename):
// a Java serialized HashMap of Connect's key/value byte arrays, which Connect
// rewrites whole on every flush. It is "" for a distributed worker.
func (c *Connect) OffsetFile() string { return c.offsetFile }

// OffsetsTopic is a distributed worker's offsets topic (offset.storage.topic): a
// compacted topic of Connect's JSON keys and values, to which Connect appends on
// every flush. It is "" for a standalone worker.
func (c *Connect) OffsetsTopic() string { return c.offsetsTopic }

// LogFile is everything the JVM printed: Connect's and Debezium's log (log4j,
// INFO) and any JVM error.
func (c *Connect) LogFile() string { return c.logFile }

// Slot is the replication slot Debezium streams from (Options.Slot or its default).
func (c *Connect) Slot() string { return c.slot }

// Publication is the publication Debezium streams (Options.Publication or its default).
func (c *Connect) Publication() string { return c.publication }

// Pid is the JVM's process id, for reading its CPU time and memory in /proc.
func (c *Connect) Pid() int { return c.cmd.Process.Pid }

// ProcessState is the ended JVM's exit status and resource usage; nil while it runs.
func (c *Connect) ProcessState() *os.ProcessState {
	if !c.exited() {
		return nil
	}
	return c.cmd.ProcessState
}

// Exited is closed when the JVM has exited.
func (c *Connect) Exited() <-chan struct{} { return c.done }

// Failed returns the trace of a FAILED connector or task, nil while both run or the
// REST server does not answer. Debezium's task stops for good on some errors (a
// record over the producer's max.request.size), which otherwise looks like a stall.
func (c *Connect) Failed(ctx context.Context) error {
	st, err := dbz.GetConnectorStatus(ctx, &http.Client{Timeout: 2 * time.Second}, c.url, c.name)
	if err != nil {
		return nil
	}
	return st.Failed(false)
}

// logTail logs the end of the log once per worker.
func (c *Connect) logTail(t testing.TB) {
	c.mu.Lock()
	done := c.tailLogged
	c.tailLogged = true
	c.mu.Unlock()
	if !done {
		t.Logf("debezium: last lines of %s:\n%s", c.logFile, tail(c.logFile, tailLines))
	}
}

// createConnector hands the connector's properties to a distributed worker (POST
// /connectors). It retries while the REST server is not up or the worker has not
// yet joined its group and read its config topic (409, 5xx), and fails at once on a
// 400: Connect rejected the config, which no retry mends.
func (c *Connect) createConnector(ctx context.Context, config map[string]string) error {
	body, err := json.Marshal(struct {
		Name   string            `json:"name"`
		Config map[string]string `json:"config"`
	}{c.name, config})
	if err != nil {
		return err
	}
	// The request validates the config, and Debezium's validation connects to
	// Postgres: allow it more than a status poll.
	client := &http.Client{Timeout: 30 * time.Second}
	last := errors.New("no answer yet")
	for {
		if err := c.tick(ctx, last); err != nil {
			return fmt.Errorf("create connector: %w", err)
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url+"/connectors", bytes.NewReader(body))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			last = fmt.Errorf("post connector: %w", err)
			continue
		}
		msg, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			last = fmt.Errorf("post connector: %w", err)
			continue
		}
		switch {
		case resp.StatusCode == http.StatusCreated:
			return nil
		case resp.StatusCode == http.StatusConflict && strings.Contains(string(msg), "already exists"):
			// An earlier attempt created it but its answer was lost (the
			// client's timeout).
			return nil
		case resp.StatusCode == http.StatusBadRequest:
			return fmt.Errorf("post connector: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
		default:
			last = fmt.Errorf("post connector: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
		}
	}
}

// tick waits for the next poll of the REST API, 250 ms; it returns an error
// instead when the JVM exits or ctx is done, naming last, the last poll's
// failure.
func (c *Connect) tick(ctx context.Context, last error) error {
	select {
	case <-c.done:
		return fmt.Errorf("java exited: %v", c.waitErr)
	case <-ctx.Done():
		return fmt.Errorf("%w; last: %v", ctx.Err(), last)
	case <-time.After(250 * time.Millisecond):
		return nil
	}
}

// waitStreaming polls the REST status and the slot until both say Debezium streams,
// and fails early when the JVM exits or the connector or task has FAILED.
func (c *Connect) waitStreaming(ctx context.Context, dsn string) error {
	client := &http.Client{Timeout: 2 * time.Second}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	last := errors.New("no answer yet")
	for {
		if err := c.tick(ctx, last); err != nil {
			return err
		}
		st, err := dbz.GetConnectorStatus(ctx, client, c.url, c.name)
		if err != nil {
			last = err // the REST server is not up yet
			continue
		}
		if err := st.Failed(true); err != nil {
			return err
		}
		if !st.Running() {
			last = fmt.Errorf("status: %s", st)
			continue
		}
		if conn == nil {
			if conn, err = pgx.Connect(ctx, dsn); err != nil {
				return fmt.Errorf("connect to the test database: %w", err)
			}
		}
		// The task is RUNNING once its start() returned, which is before Debezium's
		// streaming thread issues START_REPLICATION: only an active slot shows that
		// rows committed from now on will be read.
		var active bool
		err = conn.QueryRow(ctx, `SELECT active FROM pg_replication_slots
			WHERE slot_name = $1 AND database = current_database()`, c.slot).Scan(&active)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			last = fmt.Errorf("status: %s; slot %s not created yet", st, c.slot)
		case err != nil:
			return fmt.Errorf("read slot %s: %w", c.slot, err)
		case !active:
			last = fmt.Errorf("status: %s; slot %s not active yet", st, c.slot)
		default:
			return nil
		}
	}
}

// skipUnlessServers skips under -short when a server is not configured, as testenv
// does, before the jar check: `make test-short` needs neither servers nor jars.
func skipUnlessServers(t testing.TB) {
	t.Helper()
	if !testing.Short() {
		return
	}
	for _, env := range []string{"RELAY_TEST_POSTGRES_DSN", "RELAY_TEST_KAFKA_BROKERS"} {
		if os.Getenv(env) == "" {
			t.Skipf("debezium: integration test skipped under -short: %s is not set; "+
				"start the dev servers with `make dev-up` and `eval \"$(make -s dev-env)\"`, or run `make test`", env)
		}
	}
}

// requireLibs returns the jar directory or fails the test naming how to fill it.
func requireLibs(t testing.TB) string {
	t.Helper()
	dir, err := libsDirectory()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// libsDirectory returns the jar directory, or an error naming how to fill it.
func libsDirectory() (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("debezium: no cache directory for the Kafka Connect + Debezium jars: %w", err)
	}
	dir := filepath.Join(cache, libsDir)
	// scripts/dev.sh writes .complete last: without it the download was cut short.
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		return "", fmt.Errorf("debezium: the Kafka Connect + Debezium %s jars are missing from %s: %s", Version, dir, howToFetch)
	}
	return dir, nil
}

// freePort returns a loopback port that was free a moment ago; a worker that loses
// the race to another process fails to bind and Start reports its log.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last n lines of the file at path, read from its last 64 KiB.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	const max = 64 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		if _, err := f.Seek(-max, io.SeekEnd); err != nil {
			return fmt.Sprintf("(cannot read log: %v)", err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
