package testenv

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Cluster is a primary and a streaming standby of one Postgres major version,
// owned by one test: its own data directories under a temporary folder, its own
// loopback ports, stopped and removed at the test's end (also when it fails). It is
// for the failover tests (issue 21): promote the standby, crash the primary, bring
// the old primary back. The shared dev servers are not touched.
//
// The standby is made the way pg_basebackup would (the zonky binaries have none): the
// primary is initialised and stopped cleanly, its data directory copied without its
// replication slots, and the copy given standby.signal, primary_conninfo and
// primary_slot_name (a physical slot on the primary, which keeps the WAL the standby
// has not received).
//
// Everyone connects as the superuser postgres with trust authentication on
// 127.0.0.1: these servers hold test data only and listen on loopback only.
type Cluster struct {
	Version int
	Bin     string
	Dir     string
	// Primary and Standby are the roles at creation; after Promote the
	// standby is the primary, and the old primary, started again, a second
	// primary (split brain): the names stay.
	Primary, Standby *Node
	// Database is created on the primary before the standby is made.
	Database string
	// StandbySlot is the physical slot on the primary that the standby streams from.
	StandbySlot string
	opts        ClusterOptions
}

// A Node is one server of a Cluster.
type Node struct {
	Name string // "primary" or "standby"
	Port int
	Data string
	Log  string
	sock string
	c    *Cluster
}

// ClusterOptions configures NewCluster. The zero value is an asynchronous standby
// without slot synchronisation.
type ClusterOptions struct {
	// Synchronous makes every commit on the primary wait until the standby
	// has flushed it (synchronous_standby_names): a transaction the
	// producer saw commit is then on the standby when the primary dies.
	Synchronous bool
	// FailoverSlots sets up Postgres 17+ logical slot synchronisation: on the
	// primary synchronized_standby_slots names the standby's physical slot,
	// on the standby sync_replication_slots = on (with hot_standby_feedback
	// and a dbname in primary_conninfo, which it needs).
	FailoverSlots bool
}

// standbyApplicationName is the standby's application_name on the primary
// (synchronous_standby_names names it).
const standbyApplicationName = "standby"

// newClusterNodes gives c (its Version set) its binaries and a directory of
// its own, removed at the test's end, and makes one node per name with a
// free loopback port and its paths in that directory. Nothing is initialised
// or started.
func newClusterNodes(t testing.TB, c *Cluster, names ...string) []*Node {
	t.Helper()
	reapClusters()
	c.Bin = postgresBin(t, c.Version)
	dir, err := os.MkdirTemp("", "outbox-relay-cluster-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c.Dir = dir
	// The owner file lets a later run stop servers whose test died without
	// its cleanups (a -timeout panic).
	if err := os.WriteFile(filepath.Join(dir, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { c.destroy(t) })
	if err := c.chownForServer(dir); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ports, err := serverPorts(len(names))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	nodes := make([]*Node, len(names))
	for i, name := range names {
		n := &Node{Name: name, Port: ports[i], c: c,
			Data: filepath.Join(dir, name), Log: filepath.Join(dir, name+".log"), sock: filepath.Join(dir, name+".sock")}
		c.run(t, "mkdir", "-p", n.sock)
		nodes[i] = n
	}
	return nodes
}

// NewCluster starts a primary and a standby of Postgres version (13..18) and
// returns once the standby streams. The binaries are Debian's for 15 when
// installed, else the Maven Central ones of scripts/dev.sh (fetched on first use).
func NewCluster(t testing.TB, version int, opts ClusterOptions) *Cluster {
	t.Helper()
	skipUnlessServers(t, envPostgresDSN)
	if opts.FailoverSlots && version < 17 {
		t.Fatalf("testenv: failover slots need Postgres 17 or later, not %d", version)
	}
	c := &Cluster{Version: version, Database: "outbox", StandbySlot: "standby_slot", opts: opts}
	nodes := newClusterNodes(t, c, "primary", "standby")
	c.Primary, c.Standby = nodes[0], nodes[1]
	bin, p := c.Bin, c.Primary
	c.run(t, filepath.Join(bin, "initdb"), "-D", p.Data, "-U", "postgres", "-E", "UTF8", "--locale=C", "--auth=trust")
	c.writeFile(t, filepath.Join(p.Data, "postgresql.conf"), "\ninclude_if_exists = 'relay_ha.conf'\ninclude_if_exists = 'relay_role.conf'\n", true)
	c.writeFile(t, filepath.Join(p.Data, "relay_ha.conf"), c.commonConf(), false)
	// Without the standby's settings while there is no standby: a
	// synchronous commit would wait for it.
	c.writeFile(t, filepath.Join(p.Data, "relay_role.conf"), c.primaryConf(p, ClusterOptions{}), false)
	p.Start(t)
	p.Exec(t, "postgres", "CREATE DATABASE "+c.Database)
	p.Exec(t, "postgres", "SELECT pg_create_physical_replication_slot($1, true)", c.StandbySlot)
	c.run(t, filepath.Join(bin, "pg_ctl"), "stop", "-w", "-m", "fast", "-D", p.Data)

	s := c.Standby
	c.run(t, "cp", "-a", p.Data, s.Data)
	// pg_basebackup copies no replication slots: a copied physical slot
	// would retain WAL on the standby for ever.
	c.run(t, "find", filepath.Join(s.Data, "pg_replslot"), "-mindepth", "1", "-delete")
	c.run(t, "rm", "-f", filepath.Join(s.Data, "postmaster.opts"))
	c.writeFile(t, filepath.Join(s.Data, "relay_role.conf"), c.standbyConf(s, p, opts), false)
	c.writeFile(t, filepath.Join(s.Data, "standby.signal"), "", false)
	c.writeFile(t, filepath.Join(p.Data, "relay_role.conf"), c.primaryConf(p, opts), false)
	p.Start(t)
	s.Start(t)
	c.WaitStreaming(t)
	return c
}

// Rebuild makes n, a stopped former primary, a standby of primary, the way an
// operator would with pg_rewind or a new base backup: primary is stopped for a
// moment (a planned outage), its data directory copied over n's without
// replication slots, and both started, primary with the primary's settings (a
// physical slot for n, synchronous commit and synchronized_standby_slots as the
// cluster was made with). It returns once n streams.
func (c *Cluster) Rebuild(t testing.TB, n, primary *Node) {
	t.Helper()
	primary.Exec(t, "postgres", `SELECT pg_create_physical_replication_slot($1, true) WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = $1)`, c.StandbySlot)
	c.writeFile(t, filepath.Join(primary.Data, "relay_role.conf"), c.primaryConf(primary, ClusterOptions{}), false)
	// Immediate, not fast: a fast shutdown waits until every walsender's
	// client has confirmed all it was sent, and a relay cannot confirm what
	// it cannot save in the checkpoint table of a server that refuses new
	// connections while it shuts down, so the two wait for each other. The
	// copy of a stopped server is consistent either way (crash recovery).
	c.run(t, filepath.Join(c.Bin, "pg_ctl"), "stop", "-w", "-t", "120", "-m", "immediate", "-D", primary.Data)
	c.run(t, "rm", "-rf", n.Data)
	c.run(t, "cp", "-a", primary.Data, n.Data)
	c.run(t, "find", filepath.Join(n.Data, "pg_replslot"), "-mindepth", "1", "-delete")
	c.run(t, "rm", "-f", filepath.Join(n.Data, "postmaster.opts"))
	c.writeFile(t, filepath.Join(n.Data, "relay_role.conf"), c.standbyConf(n, primary, c.opts), false)
	c.writeFile(t, filepath.Join(n.Data, "standby.signal"), "", false)
	c.writeFile(t, filepath.Join(primary.Data, "relay_role.conf"), c.primaryConf(primary, c.opts), false)
	primary.Start(t)
	n.Start(t)
	c.waitStreaming(t, primary)
}

// commonConf is what both servers run with.
func (c *Cluster) commonConf() string {
	return `# Written by internal/testenv (NewCluster).
listen_addresses = '127.0.0.1'
wal_level = logical
max_replication_slots = 20
max_wal_senders = 20
max_connections = 60
shared_buffers = 16MB
hot_standby = on
hot_standby_feedback = on
wal_keep_size = '256MB'
# Test data only: a crashed server (not a crashed machine) loses nothing.
fsync = off
log_min_messages = warning
log_line_prefix = '%m [%p] '
`
}

// primaryConf is the primary's own part (relay_role.conf): the standby's copy
// is rewritten, so that a promoted standby does not wait for a standby of its
// own, or for a slot it does not have.
func (c *Cluster) primaryConf(n *Node, opts ClusterOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port = %d\nunix_socket_directories = '%s'\n", n.Port, n.sock)
	if opts.Synchronous {
		fmt.Fprintf(&b, "synchronous_standby_names = '%s'\nsynchronous_commit = on\n", standbyApplicationName)
	}
	if opts.FailoverSlots {
		fmt.Fprintf(&b, "synchronized_standby_slots = '%s'\n", c.StandbySlot)
	}
	return b.String()
}

func (c *Cluster) standbyConf(n, upstream *Node, opts ClusterOptions) string {
	var b strings.Builder
	fmt.Fprintf(&b, "port = %d\nunix_socket_directories = '%s'\n", n.Port, n.sock)
	fmt.Fprintf(&b, "primary_conninfo = 'host=127.0.0.1 port=%d user=postgres application_name=%s dbname=postgres'\n", upstream.Port, standbyApplicationName)
	fmt.Fprintf(&b, "primary_slot_name = '%s'\n", c.StandbySlot)
	if opts.FailoverSlots {
		b.WriteString("sync_replication_slots = on\n")
	}
	return b.String()
}

// DSN is the connection string of node n's server, database db ("" is the
// cluster's Database).
func (n *Node) DSN(db string) string {
	if db == "" {
		db = n.c.Database
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, db)
}

// MultiHostDSN is the URL form of a multi-host connection string for the nodes, in
// that order, with target_session_attrs (e.g. read-write).
func (c *Cluster) MultiHostDSN(attrs string, nodes ...*Node) string {
	hosts := make([]string, len(nodes))
	for i, n := range nodes {
		hosts[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port))
	}
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable&target_session_attrs=%s&connect_timeout=5",
		strings.Join(hosts, ","), c.Database, attrs)
}

// Start starts the node's server and waits until it accepts connections.
func (n *Node) Start(t testing.TB) {
	t.Helper()
	n.c.run(t, filepath.Join(n.c.Bin, "pg_ctl"), "start", "-w", "-t", "120", "-D", n.Data, "-l", n.Log)
}

// Crash stops the node's server at once, as a crash would (pg_ctl stop -m
// immediate: no shutdown checkpoint, clients cut off).
func (n *Node) Crash(t testing.TB) {
	t.Helper()
	n.c.run(t, filepath.Join(n.c.Bin, "pg_ctl"), "stop", "-w", "-t", "120", "-m", "immediate", "-D", n.Data)
}

// Stop stops the node's server with pg_ctl stop -m mode (fast: a planned
// restart), waiting at most within, and returns pg_ctl's error: a server
// that did not stop in time is still stopping (the test's cleanup kills it).
func (n *Node) Stop(mode string, within time.Duration) error {
	secs := strconv.Itoa(max(1, int(within.Seconds())))
	out, err := n.c.command(filepath.Join(n.c.Bin, "pg_ctl"), "stop", "-w", "-t", secs, "-m", mode, "-D", n.Data).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s of %s: %w: %s", mode, n.Name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Promote promotes the node (a standby) and waits until it accepts writes.
func (n *Node) Promote(t testing.TB) {
	t.Helper()
	n.c.run(t, filepath.Join(n.c.Bin, "pg_ctl"), "promote", "-w", "-t", "120", "-D", n.Data)
	deadline := time.Now().Add(time.Minute)
	for {
		var inRecovery bool
		err := n.queryRow("postgres", "SELECT pg_is_in_recovery()", nil, &inRecovery)
		if err == nil && !inRecovery {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: %s still in recovery a minute after pg_ctl promote (err %v); log %s", n.Name, err, n.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Exec runs sql on database db of the node ("" is the cluster's database).
func (n *Node) Exec(t testing.TB, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.DSN(db))
	if err != nil {
		t.Fatalf("testenv: connect to %s: %v", n.Name, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testenv: %s on %s: %v", sql, n.Name, err)
	}
}

// QueryRow runs sql on the node's database and scans its one row into dest.
func (n *Node) QueryRow(t testing.TB, sql string, args []any, dest ...any) {
	t.Helper()
	if err := n.queryRow("", sql, args, dest...); err != nil {
		t.Fatalf("testenv: %s on %s: %v", sql, n.Name, err)
	}
}

func (n *Node) queryRow(db, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.DSN(db))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// WaitStreaming waits until the primary's walsender of the standby streams.
func (c *Cluster) WaitStreaming(t testing.TB) {
	t.Helper()
	c.waitStreaming(t, c.Primary)
}

func (c *Cluster) waitStreaming(t testing.TB, primary *Node) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var n int
		err := primary.queryRow("postgres", `SELECT count(*) FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'`,
			[]any{standbyApplicationName}, &n)
		if err == nil && n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: the standby does not stream after 2 minutes (err %v); logs %s, %s", err, c.Primary.Log, c.Standby.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitReplayed waits until the standby has replayed the primary's current WAL position.
func (c *Cluster) WaitReplayed(t testing.TB) {
	t.Helper()
	var target string
	c.Primary.QueryRow(t, "SELECT pg_current_wal_lsn()::text", nil, &target)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var ok bool
		err := c.Standby.queryRow("postgres", "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", []any{target}, &ok)
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: the standby has not replayed %s after 2 minutes (err %v)", target, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// destroy stops both servers and removes the cluster's folder.
func (c *Cluster) destroy(t testing.TB) {
	for _, n := range []*Node{c.Primary, c.Standby} {
		if n == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(n.Data, "postmaster.pid")); err == nil {
			if out, err := c.command(filepath.Join(c.Bin, "pg_ctl"), "stop", "-w", "-t", "60", "-m", "immediate", "-D", n.Data).CombinedOutput(); err != nil {
				t.Logf("testenv: stop %s: %v\n%s", n.Name, err, out)
			}
		}
		if t.Failed() {
			if b, err := os.ReadFile(n.Log); err == nil {
				t.Logf("testenv: %s's log (%s), last lines:\n%s", n.Name, n.Log, lastLines(string(b), 30))
			}
		}
	}
	os.RemoveAll(c.Dir)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// reapClusters stops the servers of clusters whose test process is gone (killed by
// a -timeout panic before its cleanups ran), once per test binary.
var reapOnce sync.Once

func reapClusters() {
	reapOnce.Do(func() {
		dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "outbox-relay-cluster-*"))
		for _, dir := range dirs {
			b, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
				continue
			}
			for _, name := range []string{"primary", "standby"} {
				data := filepath.Join(dir, name)
				b, err := os.ReadFile(filepath.Join(data, "postmaster.pid"))
				if err != nil {
					continue
				}
				if pm, err := strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0]); err == nil && pm > 0 {
					_ = syscall.Kill(pm, syscall.SIGQUIT) // an immediate shutdown
				}
			}
			time.Sleep(time.Second)
			os.RemoveAll(dir)
		}
	})
}

// serverPorts returns n loopback ports that were free a moment ago, below Linux's
// ephemeral range (32768-60999): a server stopped and started again must not find
// its port taken as the local port of some client's connection.
func serverPorts(n int) ([]int, error) {
	var out []int
	for tries := 0; len(out) < n && tries < 200; tries++ {
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		dup := false
		for _, q := range out {
			dup = dup || q == p
		}
		if !dup {
			out = append(out, p)
		}
	}
	if len(out) < n {
		return nil, errors.New("no free loopback port found in 20000-32000")
	}
	return out, nil
}

// postgresBin returns the server binaries of Postgres version: Debian's for 15
// when installed, else those scripts/dev.sh pg-bin fetches from Maven Central.
func postgresBin(t testing.TB, version int) string {
	t.Helper()
	if version == 15 {
		if _, err := os.Stat("/usr/lib/postgresql/15/bin/postgres"); err == nil {
			return "/usr/lib/postgresql/15/bin"
		}
	}
	root := repoRoot()
	if root == "" {
		t.Fatalf("testenv: no repository root (go.mod) above the working directory: cannot run scripts/dev.sh pg-bin %d", version)
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "dev.sh"), "pg-bin", strconv.Itoa(version))
	cmd.Dir = root
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("testenv: scripts/dev.sh pg-bin %d (fetches the Postgres %d binaries from Maven Central): %v\n%s", version, version, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// serverUser is the system user the servers run as: postgres when we are root
// (Postgres refuses to run as root), else ourselves.
func serverUser() (*user.User, bool) {
	if os.Geteuid() != 0 {
		return nil, false
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, false
	}
	return u, true
}

// command runs name as the servers' user.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	if _, root := serverUser(); root {
		cmd := exec.Command("runuser", append([]string{"-u", "postgres", "--", name}, args...)...)
		cmd.Dir = "/"
		return cmd
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	return cmd
}

func (c *Cluster) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := c.command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: %s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out)
	}
}

// writeFile writes (or with appendTo, appends) content to path as the servers' user.
func (c *Cluster) writeFile(t testing.TB, path, content string, appendTo bool) {
	t.Helper()
	op := ">"
	if appendTo {
		op = ">>"
	}
	cmd := c.command("sh", "-c", "cat "+op+" \"$1\"", "sh", path)
	cmd.Stdin = strings.NewReader(content)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: write %s: %v\n%s", path, err, out)
	}
}

// chownForServer gives dir to the servers' user when we are root.
func (c *Cluster) chownForServer(dir string) error {
	u, root := serverUser()
	if !root {
		return nil
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return os.Chown(dir, uid, gid)
}
