package testenv

import (
	"testing"
	"time"
)

// TestClusterFailover runs the harness the failover tests stand on: a Postgres 17
// primary and standby with slot synchronisation; a failover slot of the primary
// appears synced on the standby, the primary crashes, the standby is promoted and
// takes writes with the slot in place, and the old primary comes back as a second
// primary (the split brain the relay must refuse).
func TestClusterFailover(t *testing.T) {
	c := NewCluster(t, 17, ClusterOptions{Synchronous: true, FailoverSlots: true})
	c.Primary.Exec(t, "", "CREATE TABLE t (v int)")
	c.Primary.Exec(t, "", "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, false, true)")
	c.Primary.Exec(t, "", "INSERT INTO t VALUES (1)")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var synced bool
		c.Standby.QueryRow(t, "SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = 's' AND synced", nil, &synced)
		if synced {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot s not synced to the standby after 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.Primary.Crash(t)
	c.Standby.Promote(t)
	c.Standby.Exec(t, "", "INSERT INTO t VALUES (2)")
	var n int
	c.Standby.QueryRow(t, "SELECT count(*) FROM t", nil, &n)
	if n != 2 {
		t.Errorf("rows on the promoted standby = %d; want 2 (the synchronous commit of 1, and 2)", n)
	}
	var tli int
	c.Standby.QueryRow(t, "SELECT timeline_id FROM pg_control_checkpoint()", nil, &tli)
	c.Primary.Start(t)
	var ro string
	c.Primary.QueryRow(t, "SHOW transaction_read_only", nil, &ro)
	if ro != "off" {
		t.Errorf("old primary brought back: transaction_read_only = %s; want off (a second primary)", ro)
	}
}

// TestClusterPromote15 runs the harness on Debian's Postgres 15 (no failover slots):
// a synchronous commit survives the primary's crash, the promoted standby takes
// writes on a new timeline, and Rebuild makes the old primary its standby.
func TestClusterPromote15(t *testing.T) {
	c := NewCluster(t, 15, ClusterOptions{Synchronous: true})
	c.Primary.Exec(t, "", "CREATE TABLE t (v int)")
	c.Primary.Exec(t, "", "INSERT INTO t VALUES (1)")
	c.Primary.Crash(t)
	c.Standby.Promote(t)
	c.Standby.Exec(t, "", "INSERT INTO t VALUES (2)")
	c.Rebuild(t, c.Primary, c.Standby)
	c.Standby.Exec(t, "", "INSERT INTO t VALUES (3)") // synchronous again: waits for the rebuilt standby
	var n, tli int
	c.Primary.QueryRow(t, "SELECT count(*) FROM t", nil, &n)
	c.Standby.QueryRow(t, "SELECT timeline_id FROM pg_control_checkpoint()", nil, &tli)
	if n != 3 || tli != 2 {
		t.Errorf("rebuilt standby has %d rows, the new primary timeline %d; want 3 rows (replicated) and timeline 2", n, tli)
	}
}
