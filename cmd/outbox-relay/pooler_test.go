package main

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// pgbouncerBinary is Debian's pgbouncer (scripts/dev.sh deps installs it, as
// .ci/run does); without it the test skips, naming the fix, except in CI.
func pgbouncerBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer" // not in a non-root PATH
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("no pgbouncer binary: .ci/run installs Debian's pgbouncer package")
	}
	t.Skip("no pgbouncer binary: install it with scripts/dev.sh deps (Debian's pgbouncer package)")
	return ""
}

// startPgBouncer starts a PgBouncer of the test's own in pool mode mode on a
// free loopback port, in front of the server of dsn (a URL DSN with a
// password), and returns dsn with the host and port replaced by PgBouncer's.
// It is stopped when the test ends. It forwards no startup parameter but its
// defaults (ignore_startup_parameters is left empty), as a stock PgBouncer.
func startPgBouncer(t *testing.T, bin, dsn, mode string) string {
	t.Helper()
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Readable by the servers' user: PgBouncer refuses to run as root and
	// is started as postgres then (-u).
	dir, err := os.MkdirTemp("", "pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	users := filepath.Join(dir, "users.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	write := func(path, content string) {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(users, fmt.Sprintf("%q %q\n", pc.User, pc.Password))
	write(ini, fmt.Sprintf(`[databases]
* = host=%s port=%d
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = scram-sha-256
auth_file = %s
pool_mode = %s
default_pool_size = 10
`, pc.Host, pc.Port, port, users, mode))
	args := []string{ini}
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres"}, args...)
	}
	cmd := exec.Command(bin, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("pgbouncer exited at start:\n%s", out.String())
		default:
		}
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgbouncer does not listen on %s after 15s:\n%s", addr, out.String())
		}
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = addr
	return u.String()
}

// TestPgBouncer runs the relay with postgres.dsn on a real PgBouncer, in
// transaction and in session mode, and postgres.replication_dsn on Postgres
// itself: setup, check, run (every event delivered, in order) and lag work
// through it. With the replication connection on PgBouncer too, check and
// run say that a pooler is in the way and name postgres.replication_dsn,
// not pg_hba.conf (issue 37, item 7).
func TestPgBouncer(t *testing.T) {
	bin := pgbouncerBinary(t)
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			direct, slot := dbEnv(t)
			pooled := startPgBouncer(t, bin, direct, mode)
			k := testenv.Kafka(t)
			aggType := "Pool" + strings.ReplaceAll(uniqueName(t, ""), "_", "")
			topic := "outbox.event." + aggType
			k.CreateTopic(t, topic, 1)
			t.Setenv("RELAY_KAFKA_BROKERS", strings.Join(k.Brokers, ","))
			t.Setenv("RELAY_METRICS_LISTEN", "")
			t.Setenv("RELAY_POSTGRES_DSN", pooled)
			t.Setenv("RELAY_POSTGRES_REPLICATION_DSN", direct)

			setUp(t)
			code, out, errOut := run(t, "check")
			if code != exitcode.OK {
				t.Fatalf("check through pgbouncer (%s mode) = exit %d; want 0\n%s%s", mode, code, out, errOut)
			}
			wantLines(t, "check", out, "ok    replication connection")

			// Before the relay starts, and while it runs: checkpoint
			// saves through the pooler, many transactions apart.
			ids := insertEvents(t, direct, aggType, 20, 0)
			p := startRelay(t)
			ids = append(ids, insertEvents(t, direct, aggType, 20, 0)...)
			waitDelivered(t, k, topic, ids, "through pgbouncer")
			assertOrder(t, k, topic, ids)
			waitCheckpoint(t, direct, slot, walNow(t, direct).String(), &syncBuffer{}, time.Minute)

			code, out, errOut = run(t, "lag")
			if code != exitcode.OK {
				t.Errorf("lag through pgbouncer (%s mode) = exit %d; want 0\n%s%s", mode, code, out, errOut)
			}
			if strings.Contains(out+errOut, "unsupported startup parameter") {
				t.Errorf("lag sent a startup parameter pgbouncer refuses:\n%s%s", out, errOut)
			}
			p.stop(t)

			// Misconfigured: the replication connection through pgbouncer.
			unsetenv(t, "RELAY_POSTGRES_REPLICATION_DSN")
			const advice = "connection pooler (PgBouncer?), which cannot carry logical replication: set postgres.replication_dsn"
			code, out, errOut = run(t, "check")
			if code == exitcode.OK {
				t.Errorf("check with the replication connection through pgbouncer = exit 0; want a failure\n%s", out)
			}
			wantLines(t, "check", out, "FAIL  replication connection", advice)
			if strings.Contains(out, "allow it in pg_hba.conf") {
				t.Errorf("check advises editing pg_hba.conf for a pooler:\n%s", out)
			}
			code, out, errOut = runWithin(t, time.Minute, "run")
			if code == exitcode.OK {
				t.Errorf("run with the replication connection through pgbouncer = exit 0; want a failure")
			}
			wantLines(t, "run", out+errOut, advice)
		})
	}
}

// runWithin is run, failing the test when the command has not returned
// within d.
func runWithin(t *testing.T, d time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var o, e syncBuffer
		c := execute(args, &o, &e)
		done <- result{c, o.String(), e.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(d):
		t.Fatalf("outbox-relay %s did not return within %s", strings.Join(args, " "), d)
		return 0, "", ""
	}
}

// assertOrder checks that the first copy of each id in topic comes in the
// order of ids (one aggregate, one partition: the order users rely on).
func assertOrder(t *testing.T, k *testenv.KafkaCluster, topic string, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	var got []string
	for _, m := range k.ReadAll(t, topic) {
		for _, h := range m.Headers {
			if h.Key == "id" && !seen[string(h.Value)] {
				seen[string(h.Value)] = true
				got = append(got, string(h.Value))
			}
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("order of first copies in %s = %v; want %v", topic, got, ids)
	}
}
