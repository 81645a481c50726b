package testenv

import (
	"net"
	"path/filepath"
	"strconv"
	"testing"
)

// ServerOptions configures NewServer.
type ServerOptions struct {
	// WALSegmentMB is initdb's --wal-segsize (a power of two, 1 to 1024);
	// 0 keeps the default 16. Small segments let a test fill and remove
	// WAL in a few megabytes.
	WALSegmentMB int
	// Conf is appended to the server's settings after NewCluster's common
	// ones (wal_level logical, loopback only, fsync off, …): a later line
	// wins, so it can override them (wal_keep_size, say).
	Conf string
}

// NewServer starts one Postgres server of version, owned by the test, for
// cluster-wide settings that the shared dev server must never be given
// (max_slot_wal_keep_size, wal_keep_size: the other packages' slots live
// there). It is a Cluster without a standby, made and removed the same way:
// its own data directory under a temporary folder, a free loopback port,
// superuser postgres with trust authentication, database Database created,
// stopped and removed at the test's end (and by a later run's reap if the
// test process died without its cleanups). ALTER SYSTEM and pg_reload_conf()
// as postgres change its settings while it runs.
func NewServer(t testing.TB, version int, opts ServerOptions) *Node {
	t.Helper()
	skipUnlessServers(t, envPostgresDSN)
	c := &Cluster{Version: version, Database: "outbox"}
	p := newClusterNodes(t, c, "primary")[0]
	c.Primary = p
	args := []string{"-D", p.Data, "-U", "postgres", "-E", "UTF8", "--locale=C", "--auth=trust"}
	if opts.WALSegmentMB > 0 {
		args = append(args, "--wal-segsize="+strconv.Itoa(opts.WALSegmentMB))
	}
	c.run(t, filepath.Join(c.Bin, "initdb"), args...)
	c.writeFile(t, filepath.Join(p.Data, "postgresql.conf"), "\ninclude_if_exists = 'relay_ha.conf'\ninclude_if_exists = 'relay_role.conf'\ninclude_if_exists = 'relay_test.conf'\n", true)
	c.writeFile(t, filepath.Join(p.Data, "relay_ha.conf"), c.commonConf(), false)
	c.writeFile(t, filepath.Join(p.Data, "relay_role.conf"), c.primaryConf(p, ClusterOptions{}), false)
	c.writeFile(t, filepath.Join(p.Data, "relay_test.conf"), opts.Conf, false)
	p.Start(t)
	p.Exec(t, "postgres", "CREATE DATABASE "+c.Database)
	return p
}

// FreeAddr returns a loopback address ("127.0.0.1:port") that was free a
// moment ago, for a listener the code under test opens itself (metrics,
// health), or for a server that is not there. Its port is below the
// ephemeral range (serverPorts): a port Listen(":0") gives is handed out
// again as the local port of the next outgoing connection of any process
// here, and a relay given it then failed to listen and exited, again at
// every restart (a standby that never came up failed TestHighAvailability
// on CI so). Another test may still take it in between: a small race, which
// tests accept.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports, err := serverPorts(1)
	if err != nil {
		t.Fatalf("testenv: FreeAddr: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}
