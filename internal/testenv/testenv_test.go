package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"
)

var validName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,62}$`)

func TestUniqueName(t *testing.T) {
	tests := []struct{ name, prefix, wantPrefix string }{
		{"plain", "slot", "slot_"},
		{"upper and symbols", "Outbox.Event-Topic", "outbox_event_topic_"},
		{"digit first", "1st", "t1st_"},
		{"empty", "", "t_"},
		{"long", strings.Repeat("x", 100), strings.Repeat("x", 20) + "_"},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := UniqueName(t, tt.prefix)
			if !validName.MatchString(got) {
				t.Errorf("UniqueName(%q) = %q; want a match of %s", tt.prefix, got, validName)
			}
			if !strings.HasPrefix(got, tt.wantPrefix) {
				t.Errorf("UniqueName(%q) = %q; want prefix %q", tt.prefix, got, tt.wantPrefix)
			}
			if seen[got] {
				t.Errorf("UniqueName(%q) = %q; want a name not returned before", tt.prefix, got)
			}
			seen[got] = true
			if again := UniqueName(t, tt.prefix); again == got {
				t.Errorf("UniqueName(%q) twice = %q; want two names", tt.prefix, got)
			}
		})
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://relay:relay@127.0.0.1:54329/outbox?sslmode=disable", "postgres://relay:relay@127.0.0.1:54329/db_x?sslmode=disable"},
		{"postgresql://u@h/", "postgresql://u@h/db_x"},
		{"host=h user=u dbname=outbox", "host=h user=u dbname=outbox dbname=db_x"},
	}
	for _, tt := range tests {
		if got := withDatabase(tt.dsn, "db_x"); got != tt.want {
			t.Errorf("withDatabase(%q) = %q; want %q", tt.dsn, got, tt.want)
		}
	}
}

// TestFaultLock checks the ordering fault tests rely on, with two lock instances on one
// file standing for two test binaries (flock(2) locks conflict between open files even
// within one process).
func TestFaultLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "fault.lock")
	a, b := newFaultLock(path), newFaultLock(path)

	relA, err := a.shared("TestA")
	if err != nil {
		t.Fatal(err)
	}
	// Reentrant: a test (and its subtests) using both servers must not wait for itself.
	relA2, err := a.shared("TestA/sub")
	if err != nil {
		t.Fatal(err)
	}

	got := make(chan string, 4)
	go func() {
		rel, err := b.exclusive("TestFault")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- "exclusive"
		// The behaviour under test: C, queued behind this fault test, must not get in
		// while it holds the lock. Hold it long enough for a wrong grant to show.
		time.Sleep(100 * time.Millisecond)
		got <- "exclusive released"
		rel()
	}()
	waitFor(t, "the fault test to hold the intent file (waiting for the lock)", func() bool { return intentHeld(t, path) })
	// The behaviour under test: it waits while process a holds the lock shared. Give a
	// wrong grant the time to show.
	select {
	case s := <-got:
		t.Fatalf("exclusive() = %q while another process holds the lock shared; want it to wait", s)
	case <-time.After(100 * time.Millisecond):
	}

	// A new user of process a waits behind the waiting fault test (no starvation).
	go func() {
		rel, err := a.shared("TestC")
		if err != nil {
			got <- "error: " + err.Error()
			return
		}
		got <- "shared C"
		rel()
	}()
	waitFor(t, "TestC to queue behind the fault test", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.readersQueued == 1
	})
	relA2()
	relA()

	want := []string{"exclusive", "exclusive released", "shared C"}
	for i, w := range want {
		select {
		case s := <-got:
			if s != w {
				t.Fatalf("event %d = %q; want %q", i, s, w)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d: nothing after 5s; want %q", i, w)
		}
	}

	// The fault test may use the servers itself; calling Exclusive late is an error.
	rel, err := a.exclusive("TestD")
	if err != nil {
		t.Fatal(err)
	}
	relD, err := a.shared("TestD/sub")
	if err != nil {
		t.Fatalf("shared() inside the exclusive test: %v; want no wait and no error", err)
	}
	relD()
	rel()
	relE, err := a.shared("TestE")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.exclusive("TestE"); err == nil {
		t.Errorf("exclusive() after shared() in the same test = nil error; want an error")
	}
	relE()
}

// waitFor polls cond until it holds, failing the test after 5s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 5s for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// intentHeld reports whether another open file holds the intent lock of the fault lock
// at path exclusively, as a waiting fault test does.
func intentHeld(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.OpenFile(path+".intent", os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
	if err == nil {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return false
	}
	if err != syscall.EWOULDBLOCK && err != syscall.EINTR {
		t.Fatalf("flock %s.intent: %v", path, err)
	}
	return err == syscall.EWOULDBLOCK
}

func TestPostgres(t *testing.T) {
	skipUnlessServers(t, envPostgresDSN) // the subtest's skip would not end this test
	t.Parallel()
	var dbName, slot string
	admin := ""
	t.Run("fresh database", func(t *testing.T) {
		p := Postgres(t)
		admin = p.AdminDSN
		p.Exec(t, `CREATE TABLE outbox (id int primary key, payload jsonb);
			INSERT INTO outbox VALUES (1, '{"a":1}')`)
		p.Exec(t, "INSERT INTO outbox VALUES ($1, $2)", 2, `{"b":2}`)
		pool := p.Pool(t)
		ctx := context.Background()
		if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&dbName); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n); err != nil || n != 2 {
			t.Fatalf("count(*) = %d, %v; want 2", n, err)
		}

		// A logical slot held active by a replication connection: cleanup must end the
		// walsender and drop the slot, or the database cannot be dropped.
		slot = UniqueName(t, "slot")
		p.Exec(t, "CREATE PUBLICATION "+slot+" FOR TABLE outbox")
		rc, err := pgconn.Connect(ctx, p.DSN+"&replication=database")
		if err != nil {
			t.Fatalf("replication connect: %v", err)
		}
		t.Cleanup(func() { rc.Close(context.Background()) })
		if _, err := pglogrepl.CreateReplicationSlot(ctx, rc, slot, "pgoutput",
			pglogrepl.CreateReplicationSlotOptions{}); err != nil {
			t.Fatalf("create slot: %v", err)
		}
		if err := pglogrepl.StartReplication(ctx, rc, slot, 0, pglogrepl.StartReplicationOptions{
			PluginArgs: []string{"proto_version '1'", "publication_names '" + slot + "'"},
		}); err != nil {
			t.Fatalf("start replication: %v", err)
		}
		var active bool
		if err := pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active); err != nil || !active {
			t.Fatalf("slot %s active = %v, %v; want true", slot, active, err)
		}
	})
	if t.Failed() {
		return
	}
	// The subtest's cleanup has run: its database and slot must be gone.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dbs, slots int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", dbName).Scan(&dbs); err != nil {
		t.Fatal(err)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if dbs != 0 || slots != 0 {
		t.Errorf("after cleanup: databases named %s = %d, slots named %s = %d; want 0 and 0", dbName, dbs, slot, slots)
	}
}

func produce(t *testing.T, brokers []string, topic string, n, from int) {
	t.Helper()
	// A client of its own, so metadata of the topic created just before is fresh.
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, n)
	for i := range recs {
		recs[i] = &kgo.Record{
			Topic:   topic,
			Key:     []byte(fmt.Sprintf("key-%d", (from+i)%5)),
			Value:   []byte(fmt.Sprintf("value-%d", from+i)),
			Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(fmt.Sprint(from + i))}},
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// checkAll asserts that ReadAll returns exactly values value-0 … value-(n-1), each once,
// with its header, and each key on one partition.
func checkAll(t *testing.T, msgs []Message, topic string, n int) {
	t.Helper()
	if len(msgs) != n {
		t.Fatalf("ReadAll(%q) returned %d messages; want %d", topic, len(msgs), n)
	}
	seen := map[string]bool{}
	keyPart := map[string]int{}
	for _, m := range msgs {
		v := string(m.Value)
		if seen[v] {
			t.Errorf("ReadAll(%q): %q twice", topic, v)
		}
		seen[v] = true
		if m.Topic != topic || len(m.Headers) != 1 || m.Headers[0].Key != "id" {
			t.Errorf("ReadAll(%q): message %q topic %q headers %v; want topic %q and header id", topic, v, m.Topic, m.Headers, topic)
		}
		if p, ok := keyPart[string(m.Key)]; ok && p != m.Partition {
			t.Errorf("ReadAll(%q): key %q on partitions %d and %d; want one", topic, m.Key, p, m.Partition)
		}
		keyPart[string(m.Key)] = m.Partition
	}
	for i := 0; i < n; i++ {
		if v := fmt.Sprintf("value-%d", i); !seen[v] {
			t.Errorf("ReadAll(%q): %q missing", topic, v)
		}
	}
}

func TestKafka(t *testing.T) {
	t.Parallel()
	k := Kafka(t)
	topic := UniqueName(t, "topic")
	k.CreateTopic(t, topic, 3)
	produce(t, k.Brokers, topic, 50, 0)
	msgs := k.ReadAll(t, topic)
	checkAll(t, msgs, topic, 50)
	parts := map[int]bool{}
	for i, m := range msgs {
		parts[m.Partition] = true
		if i > 0 && m.Partition == msgs[i-1].Partition && m.Offset <= msgs[i-1].Offset {
			t.Errorf("ReadAll(%q): offset %d after %d on partition %d; want increasing", topic, m.Offset, msgs[i-1].Offset, m.Partition)
		}
	}
	if len(parts) < 2 {
		t.Errorf("ReadAll(%q): messages on %d partitions; want the 5 keys spread over several of 3", topic, len(parts))
	}
	// An empty topic reads as nothing, not as a hang.
	empty := UniqueName(t, "empty")
	k.CreateTopic(t, empty, 2)
	if got := k.ReadAll(t, empty); len(got) != 0 {
		t.Errorf("ReadAll(%q) = %d messages; want 0", empty, len(got))
	}
}

// ReadAll reads read_uncommitted and keeps the transaction markers: a test sees the
// records of aborted and open transactions, and one marker per ended transaction.
func TestKafkaReadAllTransactions(t *testing.T) {
	t.Parallel()
	k := Kafka(t)
	topic := UniqueName(t, "txn")
	k.CreateTopic(t, topic, 1)
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...), kgo.TransactionalID(UniqueName(t, "txid")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	txn := func(end kgo.TransactionEndTry, values ...string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range values {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatalf("produce %s: %v", v, err)
			}
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatalf("end transaction: %v", err)
		}
	}
	txn(kgo.TryCommit, "c1", "c2")
	txn(kgo.TryAbort, "x1")
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("open")}).FirstErr(); err != nil {
		t.Fatal(err)
	}

	var values []string
	markers := 0
	for i, m := range k.ReadAll(t, topic) {
		if m.Offset != int64(i) {
			t.Errorf("message %d at offset %d; want every offset", i, m.Offset)
		}
		switch v := string(m.Value); v {
		case "c1", "c2", "x1", "open":
			values = append(values, v)
		default:
			markers++
		}
	}
	if want := []string{"c1", "c2", "x1", "open"}; !slices.Equal(values, want) || markers != 2 {
		t.Errorf("ReadAll(%q) = %q and %d markers; want %q and 2 markers", topic, values, markers, want)
	}
}

func TestKafkaKillAndStart(t *testing.T) {
	Exclusive(t)
	k := Kafka(t)
	topic := UniqueName(t, "restart")
	k.CreateTopic(t, topic, 2)
	produce(t, k.Brokers, topic, 20, 0)

	StopKafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	err := kafkaAnswers(ctx, k.Brokers)
	cancel()
	if err == nil {
		t.Fatalf("after StopKafka the broker still answers metadata; want it down")
	}

	StartKafka(t)
	produce(t, k.Brokers, topic, 10, 20)
	checkAll(t, k.ReadAll(t, topic), topic, 30)
}

func TestPostgresStopAndStart(t *testing.T) {
	Exclusive(t)
	p := Postgres(t)
	p.Exec(t, "CREATE TABLE t (v int); INSERT INTO t VALUES (42)")

	StopPostgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	conn, err := pgx.Connect(ctx, p.DSN)
	cancel()
	if err == nil {
		conn.Close(context.Background())
		t.Fatalf("after StopPostgres a connection succeeded; want the server down")
	}

	StartPostgres(t)
	var v int
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err = pgx.Connect(ctx, p.DSN)
	if err != nil {
		t.Fatalf("connect after StartPostgres: %v", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT v FROM t").Scan(&v); err != nil || v != 42 {
		t.Errorf("SELECT v after restart = %d, %v; want 42 (committed before the crash)", v, err)
	}
}

func TestSkipUnlessServers(t *testing.T) {
	defer func(f func() bool) { short = f }(short)
	tests := []struct {
		name     string
		short    bool
		dsn      string
		wantSkip bool
	}{
		{"not short, no server: no skip (the caller fails)", false, "", false},
		{"short, no server", true, "", true},
		{"short, server set", true, "postgres://127.0.0.1:1/x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			short = func() bool { return tt.short }
			t.Setenv(envPostgresDSN, tt.dsn)
			r := &skipRecorder{TB: t}
			func() {
				defer func() { _ = recover() }()
				skipUnlessServers(r, envPostgresDSN)
			}()
			if r.skipped != tt.wantSkip {
				t.Fatalf("skipUnlessServers(short=%v, %s=%q) skipped = %v; want %v", tt.short, envPostgresDSN, tt.dsn, r.skipped, tt.wantSkip)
			}
			if r.skipped && (!strings.Contains(r.msg, "make dev-up") || !strings.Contains(r.msg, envPostgresDSN)) {
				t.Errorf("skip message %q; want it to name %s and `make dev-up`", r.msg, envPostgresDSN)
			}
		})
	}
}

// skipRecorder records Skipf instead of ending the test.
type skipRecorder struct {
	testing.TB
	skipped bool
	msg     string
}

func (s *skipRecorder) Skipf(format string, args ...any) {
	s.skipped = true
	s.msg = fmt.Sprintf(format, args...)
	panic(errFatal)
}

func (s *skipRecorder) Helper() {}

func TestFaultHelpersNeedExclusive(t *testing.T) {
	// requireExclusive is what keeps a careless test from stopping servers under others.
	ft := &fatalRecorder{TB: t}
	func() {
		defer func() { _ = recover() }()
		requireExclusive(ft, "StopKafka")
	}()
	if !ft.failed || !strings.Contains(ft.msg, "Exclusive") {
		t.Errorf("requireExclusive without Exclusive: failed=%v msg=%q; want a failure naming Exclusive", ft.failed, ft.msg)
	}
}

// fatalRecorder records Fatalf instead of ending the test.
type fatalRecorder struct {
	testing.TB
	failed bool
	msg    string
}

var errFatal = errors.New("fatal")

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.failed = true
	f.msg = fmt.Sprintf(format, args...)
	panic(errFatal)
}

func (f *fatalRecorder) Helper() {}

// TestRootFromNestedModule: a test of the nested bench module (bench/go.mod) runs in
// bench/cmd/outbox-bench; the root it finds must be the repository's, where .dev (the
// fault lock shared with every other test binary, the Postgres socket) and scripts/dev.sh
// are, not bench/.
func TestRootFromNestedModule(t *testing.T) {
	repo := t.TempDir()
	write := func(rel, text string) {
		t.Helper()
		path := filepath.Join(repo, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module github.com/outbox-relay/outbox-relay\n\ngo 1.26\n")
	write("bench/go.mod", "module github.com/outbox-relay/outbox-relay/bench\n\ngo 1.26\n\n"+
		"replace github.com/outbox-relay/outbox-relay => ../\n")
	write("bench/cmd/outbox-bench/main.go", "package main\n")
	write("internal/relay/relay.go", "package relay\n")

	for _, dir := range []string{
		repo,
		filepath.Join(repo, "internal", "relay"),
		filepath.Join(repo, "bench"),
		filepath.Join(repo, "bench", "cmd", "outbox-bench"),
	} {
		if got := rootFrom(dir); got != repo {
			t.Errorf("rootFrom(%s) = %q; want the repository root %q", dir, got, repo)
		}
	}
	if got := rootFrom(t.TempDir()); got != "" {
		t.Errorf("rootFrom(a directory outside any module) = %q; want \"\"", got)
	}
}
