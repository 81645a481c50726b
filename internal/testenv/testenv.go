// Package testenv is the one harness every integration test uses for real Postgres and
// real Kafka.
//
// Where the servers come from, decided once per test binary:
//
//  1. RELAY_TEST_POSTGRES_DSN / RELAY_TEST_KAFKA_BROKERS, as printed by
//     `make -s dev-env` for the servers of `make dev-up` (scripts/dev.sh). The fault
//     helpers (StopKafka, StartKafka, StopPostgres, StartPostgres) then run
//     scripts/dev.sh, found by walking up to the directory holding go.mod, for the dev
//     servers at RELAY_DEV_PG_PORT / RELAY_DEV_KAFKA_PORT; they refuse to act when the
//     DSN or brokers point at another port, so a foreign server is never stopped.
//  2. Otherwise testcontainers-go, when a Docker engine answers: one Postgres 15
//     (wal_level=logical) and one Kafka container per test binary, started on first
//     use on fixed loopback ports (so addresses survive a container restart) and
//     removed by the testcontainers reaper when the binary exits. The fault helpers
//     stop and start those containers.
//  3. Otherwise the test fails, naming `make dev-up` and `eval "$(make -s dev-env)"`.
//     Without -short integration tests never skip: a missing server is a failure.
//
// Under `go test -short` (`make test-short`) step 2 is left out: when the variable a
// test needs is unset, Postgres, Kafka and Exclusive skip the test at once, naming
// `make dev-up`, so a unit run needs no servers and no Docker. `make test` and CI do
// not pass -short and never skip.
//
// Isolation: Postgres gives each test its own database (dropped at cleanup together
// with its replication slots) and UniqueName gives unique topic, slot and publication
// names, so tests may run in parallel and packages may share the servers.
//
// Fault tests: a test that stops a server must call Exclusive(t) before anything else.
// Exclusive waits until no other test uses the servers, in this binary or in any other
// binary of `go test ./...` (packages run in parallel), and holds them until the test
// ends; Postgres and Kafka wait while a fault test runs or waits. Across processes this
// is an flock(2) on .dev/fault.lock at the repository root (shared by Postgres/Kafka,
// exclusive by Exclusive, with .dev/fault.lock.intent so that waiting fault tests are
// not starved); scripts/dev.sh takes the same lock exclusively when a person runs a
// fault helper by hand. A test must not call Exclusive after Postgres or Kafka: it
// would wait for itself, so that is reported as a failure instead.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"github.com/testcontainers/testcontainers-go"
)

const (
	envPostgresDSN  = "RELAY_TEST_POSTGRES_DSN"
	envKafkaBrokers = "RELAY_TEST_KAFKA_BROKERS"

	defaultDevPGPort    = "54329"
	defaultDevKafkaPort = "19092"

	howToStart = "start the dev servers with `make dev-up` and export them with " +
		"`eval \"$(make -s dev-env)\"` (or run `make test`), or make a Docker engine available"
	howToRun = "to run it, start the dev servers with `make dev-up` and export them with " +
		"`eval \"$(make -s dev-env)\"`, or run `make test`"
)

// PG is a database of its own for one test.
type PG struct {
	DSN      string // the test's fresh database
	AdminDSN string // the server's default database, as the role that created DSN's
}

// KafkaCluster is the broker set shared by all tests; create topics with UniqueName
// names. (It cannot be called Kafka: that is the function returning it.)
type KafkaCluster struct {
	Brokers []string
}

var (
	repoRootOnce sync.Once
	repoRootDir  string

	lockOnce sync.Once
	lock     *faultLock
)

// repoRoot is the directory holding go.mod, found by walking up from the test's
// working directory (its package directory), or "" when there is none.
func repoRoot() string {
	repoRootOnce.Do(func() {
		dir, err := os.Getwd()
		if err != nil {
			return
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				repoRootDir = dir
				return
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				return
			}
			dir = parent
		}
	})
	return repoRootDir
}

func faultLocker() *faultLock {
	lockOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), "outbox-relay-testenv")
		if root := repoRoot(); root != "" {
			dir = filepath.Join(root, ".dev")
		}
		lock = newFaultLock(filepath.Join(dir, "fault.lock"))
	})
	return lock
}

// useServers takes the shared fault lock for the test's lifetime.
func useServers(t testing.TB) {
	t.Helper()
	release, err := faultLocker().shared(t.Name())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(release)
}

// Exclusive makes t the only test using the servers, in this and every other test
// binary, until t ends. Call it first in any test that calls StopKafka, StartKafka,
// StopPostgres or StartPostgres. It blocks until running tests have finished with the
// servers.
func Exclusive(t testing.TB) {
	t.Helper()
	// Under -short with no servers at all, skip before waiting for the lock; with one
	// of them, Postgres or Kafka skips when the test asks for the other.
	if os.Getenv(envPostgresDSN) == "" && os.Getenv(envKafkaBrokers) == "" {
		skipUnlessServers(t, envPostgresDSN)
	}
	release, err := faultLocker().exclusive(t.Name())
	if err != nil {
		t.Fatalf("testenv: Exclusive: %v", err)
	}
	t.Cleanup(release)
}

func requireExclusive(t testing.TB, fn string) {
	t.Helper()
	if !faultLocker().holdsExclusive(t.Name()) {
		t.Fatalf("testenv: %s stops servers other tests use: call testenv.Exclusive(t) first", fn)
	}
}

// UniqueName returns a name unique to this call, made of prefix, the test's name and a
// random suffix: lower-case [a-z0-9_], starting with a letter, at most 63 bytes, so it
// is valid unquoted as a Postgres identifier (database, slot, publication, table) and
// as a Kafka topic.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: UniqueName: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	p := sanitize(prefix, 20)
	if p == "" || p[0] < 'a' || p[0] > 'z' {
		p = "t" + p
	}
	// 63 = prefix + "_" + test + "_" + suffix
	room := 63 - len(p) - len(suffix) - 2
	if n := sanitize(t.Name(), room); n != "" {
		return p + "_" + n + "_" + suffix
	}
	return p + "_" + suffix
}

// sanitize lower-cases s, turns runs of other characters than [a-z0-9] into one '_',
// trims '_' at both ends and cuts the result to at most max bytes.
func sanitize(s string, max int) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.Trim(b.String(), "_")
	if max < 0 {
		max = 0
	}
	if len(out) > max {
		out = strings.TrimRight(out[:max], "_")
	}
	return out
}

// ---------------------------------------------------------------- Postgres

// Postgres returns a fresh database for this test, created with CREATE DATABASE under
// a unique name and dropped at cleanup after its backends are terminated and its
// replication slots dropped. It holds the servers shared (see Exclusive) until t ends.
func Postgres(t testing.TB) *PG {
	t.Helper()
	admin := postgresAdminDSN(t)
	useServers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: Postgres at %s: %v; %s", redact(admin), err, howToStart)
	}
	defer conn.Close(context.Background())
	name := UniqueName(t, "db")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	p := &PG{DSN: withDatabase(admin, name), AdminDSN: admin}
	t.Cleanup(func() {
		if err := dropDatabase(admin, name); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return p
}

// connectRetry connects, retrying briefly: a server just restarted by a fault test may
// still be in recovery.
func connectRetry(ctx context.Context, dsn string) (*pgx.Conn, error) {
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil || !retryableConnect(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func retryableConnect(err error) bool {
	s := err.Error()
	return strings.Contains(s, "the database system is starting up") ||
		strings.Contains(s, "the database system is in recovery mode") ||
		strings.Contains(s, "the database system is shutting down")
}

func dropDatabase(admin, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer conn.Close(context.Background())
	// Walsenders of a test's replication connections hold its slots active, and a
	// database with slots cannot be dropped: end them, then drop the slots, retrying
	// while a terminated walsender is still exiting.
	for {
		_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name)
				FROM pg_replication_slots WHERE database = $1`, name)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: %w", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// withDatabase returns dsn with its database replaced by db.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	// keyword=value form: a later keyword overrides an earlier one.
	return dsn + " dbname=" + db
}

// redact hides a URL DSN's password in messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxx")
			return u.String()
		}
	}
	return dsn
}

// Exec runs sql (several statements are allowed when there are no args) in the test's
// database and fails the test on error.
func (p *PG) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: Exec(%q): connect: %v", sql, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testenv: Exec(%q): %v", sql, err)
	}
}

// Pool returns a pool on the test's database, closed at cleanup.
func (p *PG) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), p.DSN)
	if err != nil {
		t.Fatalf("testenv: Pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// ---------------------------------------------------------------- Kafka

// Kafka returns the brokers after checking that they answer. It holds the servers
// shared (see Exclusive) until t ends.
func Kafka(t testing.TB) *KafkaCluster {
	t.Helper()
	brokers := kafkaBrokers(t)
	useServers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kafkaAnswers(ctx, brokers); err != nil {
		t.Fatalf("testenv: Kafka at %s: %v; %s", strings.Join(brokers, ","), err, howToStart)
	}
	return &KafkaCluster{Brokers: append([]string(nil), brokers...)}
}

// kafkaAnswers succeeds once a broker returns metadata, retrying until ctx ends.
func kafkaAnswers(ctx context.Context, brokers []string) error {
	var err error
	for {
		for _, b := range brokers {
			var conn *kafka.Conn
			if conn, err = kafka.DialContext(ctx, "tcp", b); err == nil {
				_, err = conn.Brokers()
				conn.Close()
				if err == nil {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no broker answers metadata: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// CreateTopic creates topic with the given partitions (replication factor 1) and waits
// until every partition has a leader.
func (k *KafkaCluster) CreateTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := createTopic(ctx, k.Brokers, topic, partitions); err != nil {
		t.Fatalf("testenv: CreateTopic(%q, %d): %v", topic, partitions, err)
	}
}

func createTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	// A broker that has just restarted (a fault test's) may not know its
	// controller yet and names none (port 0): ask again until it does.
	var cconn *kafka.Conn
	for {
		ctrl, err := conn.Controller()
		if err == nil && ctrl.Port != 0 {
			if cconn, err = kafka.DialContext(ctx, "tcp", net.JoinHostPort(ctrl.Host, strconv.Itoa(ctrl.Port))); err == nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("find and dial the controller: %v: %w", err, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	defer cconn.Close()
	err = cconn.CreateTopics(kafka.TopicConfig{Topic: topic, NumPartitions: partitions, ReplicationFactor: 1})
	if err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("create: %w", err)
	}
	// CreateTopics returns before the partitions have leaders, and metadata may name a
	// leader before it serves the partition: producing before then fails with
	// LeaderNotAvailable or UnknownTopicOrPartition. Wait until every leader answers.
	for {
		parts, err := conn.ReadPartitions(topic)
		if err == nil && len(parts) == partitions && allLed(parts) {
			if err = partitionsServed(ctx, brokers[0], topic, partitions); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d partitions with leaders (have %d, %v): %w", partitions, len(parts), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func partitionsServed(ctx context.Context, broker, topic string, partitions int) error {
	for p := 0; p < partitions; p++ {
		conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, p)
		if err != nil {
			return err
		}
		_, _, err = conn.ReadOffsets()
		conn.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func allLed(parts []kafka.Partition) bool {
	for _, p := range parts {
		if p.Leader.Host == "" {
			return false
		}
	}
	return true
}

// ReadAll returns every message of topic, partition by partition from the first
// offset to the end offset as of the call, in partition then offset order. It uses no
// consumer group and commits nothing.
func (k *KafkaCluster) ReadAll(t testing.TB, topic string) []kafka.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		msgs, err := readAll(ctx, k.Brokers[0], topic)
		if err == nil {
			return msgs
		}
		// Leadership moves for a moment after a broker restart or resume
		// (metadata without a leader, a leader not yet listening): read
		// again, within ReadAll's deadline, rather than fail a test for it.
		if ctx.Err() != nil {
			t.Fatalf("testenv: ReadAll(%q): %v", topic, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readAll(ctx context.Context, broker, topic string) ([]kafka.Message, error) {
	// Right after a broker restart or resume, partitions are listed before
	// their leaders are known: wait for the leaders rather than fail.
	var parts []kafka.Partition
	for {
		conn, err := kafka.DialContext(ctx, "tcp", broker)
		if err != nil {
			return nil, fmt.Errorf("dial: %w", err)
		}
		parts, err = conn.ReadPartitions(topic)
		conn.Close()
		if err != nil {
			return nil, fmt.Errorf("read partitions: %w", err)
		}
		if allLed(parts) {
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("partitions of %q have no leader: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	ids := make([]int, 0, len(parts))
	for _, p := range parts {
		if p.Topic == topic {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("topic %q has no partitions", topic)
	}
	slices.Sort(ids)
	var out []kafka.Message
	for _, id := range ids {
		msgs, err := readPartition(ctx, broker, topic, id)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", id, err)
		}
		out = append(out, msgs...)
	}
	return out, nil
}

func readPartition(ctx context.Context, broker, topic string, partition int) ([]kafka.Message, error) {
	conn, err := kafka.DialLeader(ctx, "tcp", broker, topic, partition)
	if err != nil {
		return nil, fmt.Errorf("dial leader: %w", err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	first, end, err := conn.ReadOffsets()
	if err != nil {
		return nil, fmt.Errorf("read offsets: %w", err)
	}
	var out []kafka.Message
	next := first
	for next < end {
		if _, err := conn.Seek(next, kafka.SeekAbsolute); err != nil {
			return nil, fmt.Errorf("seek %d: %w", next, err)
		}
		batch := conn.ReadBatch(1, 16<<20)
		for next < end {
			m, err := batch.ReadMessage()
			if err != nil {
				break
			}
			if m.Offset >= end {
				next = end
				break
			}
			out = append(out, m)
			next = m.Offset + 1
		}
		if err := batch.Close(); err != nil {
			return nil, fmt.Errorf("read from offset %d: %w", next, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read from offset %d to %d: %w", next, end, err)
		}
	}
	return out, nil
}

// ---------------------------------------------------------------- faults

// StopKafka kills the broker (kill -9, or an immediate container stop) and returns once
// it is gone. The caller must hold Exclusive.
func StopKafka(t testing.TB) {
	t.Helper()
	kafkaFault(t, "StopKafka", "kafka-kill", stopContainer, false)
}

// StartKafka starts the broker again and returns once it answers metadata requests.
// The caller must hold Exclusive.
func StartKafka(t testing.TB) {
	t.Helper()
	kafkaFault(t, "StartKafka", "kafka-start", startContainer, true)
}

// kafkaFault is the shape of every Kafka fault helper: check Exclusive, act on the
// container or run the dev script (after checking it is the dev broker), and, with
// wait, return only once the broker answers metadata requests.
func kafkaFault(t testing.TB, name, devCmd string, container func(testing.TB, testcontainers.Container), wait bool) {
	t.Helper()
	requireExclusive(t, name)
	brokers := kafkaBrokers(t)
	if c := containers.kafka; c != nil {
		container(t, c)
	} else {
		checkDevPort(t, "RELAY_DEV_KAFKA_PORT", defaultDevKafkaPort, brokerPort(brokers[0]))
		runDev(t, devCmd)
	}
	if !wait {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkaAnswers(ctx, brokers); err != nil {
		t.Fatalf("testenv: %s: %v", name, err)
	}
}

// StopPostgres shuts Postgres down immediately (pg_ctl stop -m immediate: a crash, with
// recovery at the next start, or an immediate container stop) and returns once it is
// down. The caller must hold Exclusive.
func StopPostgres(t testing.TB) {
	t.Helper()
	requireExclusive(t, "StopPostgres")
	admin := postgresAdminDSN(t)
	if c := containers.postgres; c != nil {
		stopContainer(t, c)
	} else {
		checkDevPort(t, "RELAY_DEV_PG_PORT", defaultDevPGPort, dsnPort(t, admin))
		runDev(t, "pg-stop-immediate")
	}
}

// StartPostgres starts Postgres again and returns once it accepts connections. The
// caller must hold Exclusive.
func StartPostgres(t testing.TB) {
	t.Helper()
	requireExclusive(t, "StartPostgres")
	admin := postgresAdminDSN(t)
	if c := containers.postgres; c != nil {
		startContainer(t, c)
	} else {
		checkDevPort(t, "RELAY_DEV_PG_PORT", defaultDevPGPort, dsnPort(t, admin))
		runDev(t, "pg-start")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		conn, err := connectRetry(ctx, admin)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
			if err == nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: StartPostgres: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func brokerPort(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return port
}

func dsnPort(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", envPostgresDSN, err)
	}
	return strconv.Itoa(int(cfg.Port))
}

// checkDevPort refuses to stop or start the dev server unless the tests' server is it.
func checkDevPort(t testing.TB, env, def, got string) {
	t.Helper()
	want := os.Getenv(env)
	if want == "" {
		want = def
	}
	if got != want {
		t.Fatalf("testenv: the test server's port %s is not the dev server's port %s (%s): "+
			"fault helpers only stop and start the servers of `make dev-up`", got, want, env)
	}
}

// runDev runs scripts/dev.sh cmd; the caller holds the fault lock, which the script
// would otherwise take itself.
func runDev(t testing.TB, cmd string) {
	t.Helper()
	root := repoRoot()
	if root == "" {
		t.Fatalf("testenv: %s: no go.mod above the working directory, cannot find scripts/dev.sh", cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "dev.sh"), cmd)
	c.Dir = root
	c.Env = append(os.Environ(), "RELAY_FAULT_LOCK_HELD=1")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: scripts/dev.sh %s: %v\n%s", cmd, err, out)
	}
}
