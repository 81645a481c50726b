package sql

import "fmt"

// DefaultCheckpointHistoryTable is the checkpoint history table's name in
// 002_relay.sql: CheckpointHistoryName of DefaultCheckpointTable.
const DefaultCheckpointHistoryTable = "outbox_relay_checkpoint_history"

// CheckpointHistoryName returns the name of the history table that belongs
// to the checkpoint table t: in t's schema, named t's name + "_history"
// (shortened as PostgreSQL would, so that the name is the same on every
// run). The relay, setup, replay and prune all find it this way: there is
// no setting of its own.
func CheckpointHistoryName(t Table) Table {
	return Table{Schema: t.Schema, Name: indexName(t.Name, "history")}
}

// CheckpointHistoryTable returns the statements creating the history table
// of the checkpoint table t, and its index, if missing.
//
// Each row is a checkpoint the relay saved (lsn, the commit time of the
// transaction that ended there) and a snapshot of the server taken when the
// row was written: snapshot_xmin, the oldest transaction still running, and
// snapshot_lsn, the WAL insert position read after that snapshot. Every
// transaction older than snapshot_xmin had finished by then, so its commit
// record lies before snapshot_lsn: once a checkpoint reaches snapshot_lsn,
// every outbox row inserted by a transaction older than snapshot_xmin was
// delivered (package checkpoint states the rule; retention relies on it).
// The index on (slot_name, snapshot_lsn) finds the newest such row.
func CheckpointHistoryTable(t Table) []string {
	h := CheckpointHistoryName(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "slot_name" text NOT NULL,
    "lsn" pg_lsn NOT NULL,
    "last_commit_time" timestamptz,
    "saved_at" timestamptz NOT NULL DEFAULT now(),
    "snapshot_xmin" xid8 NOT NULL,
    "snapshot_lsn" pg_lsn NOT NULL,
    PRIMARY KEY ("slot_name", "lsn")
)`, h.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s
    ON %s ("slot_name", "snapshot_lsn")`, Ident(CheckpointHistoryIndex(t).Name), h.Quoted()),
	}
}

// CheckpointHistoryIndex returns the name of the history table's index on
// (slot_name, snapshot_lsn), in its schema: for checking that it exists.
func CheckpointHistoryIndex(t Table) Table {
	h := CheckpointHistoryName(t)
	return Table{Schema: h.Schema, Name: indexName(h.Name, "snapshot_lsn_idx")}
}
