package walbuffer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

func TestShouldNudge(t *testing.T) {
	tests := []struct {
		retained, unconfirmed, bound int64
		want                         bool
	}{
		{25, 0, 100, true},
		{24, 0, 100, false}, // under a quarter of the bound
		{60, 29, 100, true},
		{60, 30, 100, false}, // the relay holds half of it: a record would not move the slot
		{90, 0, 0, false},    // the bound off
	}
	for _, tt := range tests {
		if got := ShouldNudge(tt.retained, tt.unconfirmed, tt.bound); got != tt.want {
			t.Errorf("ShouldNudge(%d, %d, %d) = %v; want %v", tt.retained, tt.unconfirmed, tt.bound, got, tt.want)
		}
	}
}

// TestLogSnapshots: a role with REPLICATION logs running-xacts records by a
// temporary slot on any version, and by pg_log_standby_snapshot() on 16+
// once granted EXECUTE; a role with neither cannot. Either way the records
// move a slot as snapshots.go says: a record that finds a transaction open
// leaves restart_lsn before that transaction, one logged after it ended
// moves restart_lsn past it; and no temporary slot is left behind. The slot
// is read with the SQL interface (pg_logical_slot_get_binary_changes), which
// confirms what it read, as a relay confirms.
func TestLogSnapshots(t *testing.T) {
	ctx := context.Background()
	pg := testenv.Postgres(t)
	su := testenv.SuperuserConnIn(t, pg.DSN)
	var version int
	if err := su.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	// as returns a session acting as a new role with attrs.
	as := func(attrs string) (*pgx.Conn, string) {
		role := testenv.UniqueName(t, "snap")
		mustExec(t, su, `CREATE ROLE `+sql.Ident(role)+` NOLOGIN `+attrs)
		t.Cleanup(func() {
			su.Exec(ctx, `DROP OWNED BY `+sql.Ident(role))
			if _, err := su.Exec(ctx, `DROP ROLE `+sql.Ident(role)); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
		c := testenv.SuperuserConnIn(t, pg.DSN)
		mustExec(t, c, `SET ROLE `+sql.Ident(role))
		return c, role
	}
	method := func(c *pgx.Conn) SnapshotMethod {
		t.Helper()
		m, function, err := SnapshotMethodOf(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if function != (version >= 160000) {
			t.Errorf("Postgres %d: SnapshotMethodOf says the server has pg_log_standby_snapshot() = %v", version, function)
		}
		return m
	}

	plain, _ := as("NOREPLICATION")
	if m := method(plain); m != NoSnapshots {
		t.Errorf("a role without REPLICATION or the grant: method %s; want none", m)
	}
	repl, role := as("REPLICATION")
	if m := method(repl); m != SnapshotSlot {
		t.Fatalf("a role with REPLICATION, no grant: method %s; want a temporary logical slot", m)
	}
	if err := LogSnapshot(ctx, repl); err == nil {
		t.Fatal("LogSnapshot without EXECUTE (or before 16) = nil; want an error")
	}
	t.Run("temporary slot", func(t *testing.T) {
		name := testenv.UniqueName(t, "xacts")
		moves(t, pg, su, func() error { return LogSnapshotBySlot(ctx, repl, name) })
		var left int
		if err := su.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, name).Scan(&left); err != nil || left != 0 {
			t.Errorf("temporary slots left: %d, %v; want 0", left, err)
		}
	})
	if version < 160000 {
		return
	}
	mustExec(t, su, sql.GrantLogSnapshots(role))
	if m := method(repl); m != SnapshotFunction {
		t.Fatalf("after the grant: method %s; want pg_log_standby_snapshot()", m)
	}
	t.Run("function", func(t *testing.T) {
		moves(t, pg, su, func() error { return LogSnapshot(ctx, repl) })
	})
}

// moves checks that records logged by logSnapshot move a new slot as
// snapshots.go says.
func moves(t *testing.T, pg *testenv.PG, su *pgx.Conn, logSnapshot func() error) {
	ctx := context.Background()
	table, slot := testenv.UniqueName(t, "snap_t"), testenv.UniqueName(t, "snap_slot")
	mustExec(t, su, `CREATE TABLE `+sql.Ident(table)+` (n int)`)
	mustExec(t, su, `CREATE PUBLICATION `+sql.Ident(slot)+` FOR TABLE `+sql.Ident(table))
	mustExec(t, su, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, slot)
	t.Cleanup(func() { su.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot) })
	consume := func() pglogrepl.LSN {
		t.Helper()
		mustExec(t, su, `SELECT count(*) FROM pg_logical_slot_get_binary_changes($1, NULL, NULL, 'proto_version', '1', 'publication_names', $2)`, slot, slot)
		var restart string
		if err := su.QueryRow(ctx, `SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&restart); err != nil {
			t.Fatal(err)
		}
		lsn, err := pglogrepl.ParseLSN(restart)
		if err != nil {
			t.Fatal(err)
		}
		return lsn
	}
	current := func() pglogrepl.LSN {
		t.Helper()
		var s string
		if err := su.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		lsn, _ := pglogrepl.ParseLSN(s)
		return lsn
	}
	if err := logSnapshot(); err != nil {
		t.Fatalf("logging a record: %v", err)
	}
	consume()

	// A transaction open across a record: the slot stays before it.
	open := testenv.SuperuserConnIn(t, pg.DSN)
	tx, err := open.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := current()
	if _, err := tx.Exec(ctx, `INSERT INTO `+sql.Ident(table)+` VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		mustExec(t, su, `INSERT INTO `+sql.Ident(table)+` SELECT generate_series(1, 1000)`)
		// A temporary slot waits for the open transaction, up to its
		// lock_timeout, after logging its record: a timeout is expected.
		logSnapshot()
	}
	if r := consume(); r > before {
		t.Errorf("restart_lsn %s with a transaction open since %s; want it before that transaction", r, before)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := current()

	// Records logged after it: the slot passes it. Other tests' transactions
	// (any database's) open at a record hold it the same way: a few tries.
	var r pglogrepl.LSN
	for try := 0; try < 20; try++ {
		if err := logSnapshot(); err != nil {
			t.Logf("logging a record: %v", err)
		}
		if r = consume(); r >= committed {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("restart_lsn %s after 20 records logged past the transaction's commit at %s; want at or past it", r, committed)
}

func mustExec(t *testing.T, c *pgx.Conn, q string, args ...any) {
	t.Helper()
	if _, err := c.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}
