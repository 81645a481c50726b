package sql

import "fmt"

// DefaultReplayTable is the replay table's name in 005_replay.sql: beside
// DefaultCheckpointTable.
const DefaultReplayTable = "outbox_relay_replay"

// ReplayTableName returns the name of the table in which `outbox-relay
// replay` keeps its runs (to resume one by its --id): in the checkpoint
// table's schema, always named outbox_relay_replay (it has no setting).
func ReplayTableName(checkpoint Table) Table {
	return Table{Schema: checkpoint.Schema, Name: DefaultReplayTable}
}

// ReplayTable returns the statement creating the replay table of the
// checkpoint table's schema if missing. Setup creates it, so that replay can
// run as a role that may not create tables (CREATE TABLE IF NOT EXISTS needs
// CREATE on the schema even when the table exists).
func ReplayTable(checkpoint Table) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "run_id" text PRIMARY KEY,
    "state" jsonb NOT NULL,
    "updated_at" timestamptz NOT NULL DEFAULT now()
)`, ReplayTableName(checkpoint).Quoted())
}
