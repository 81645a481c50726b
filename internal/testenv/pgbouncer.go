package testenv

import (
	"bytes"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// PgBouncerBinary is Debian's pgbouncer (scripts/dev.sh deps installs it, as
// .ci/run does); without it the test skips, naming the fix, except in CI.
func PgBouncerBinary(t testing.TB) string {
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

// PgBouncer starts a PgBouncer of the test's own in pool mode mode
// (transaction, session) on a free loopback port, in front of the server of
// dsn (a URL DSN with a password), and returns dsn with the host and port
// replaced by PgBouncer's.
// It is stopped when the test ends. It forwards no startup parameter but its
// defaults (ignore_startup_parameters is left empty), as a stock PgBouncer.
func PgBouncer(t testing.TB, dsn, mode string) string {
	t.Helper()
	bin := PgBouncerBinary(t)
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
	ports, err := serverPorts(1)
	if err != nil {
		t.Fatal(err)
	}
	port := ports[0]
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
