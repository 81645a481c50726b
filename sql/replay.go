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

// ReplayTable returns the statements creating the replay table of the
// checkpoint table's schema if missing, and adding the slot_name column to
// one of an earlier version. Setup creates it, so that replay can run as a
// role that may not create tables (CREATE TABLE IF NOT EXISTS needs CREATE
// on the schema even when the table exists).
//
// A run belongs to the slot of the relay configuration that started it
// (slot_name): replay resumes only a run of its own slot, or one of an
// earlier version (NULL), which it then takes.
func ReplayTable(checkpoint Table) []string {
	t := ReplayTableName(checkpoint).Quoted()
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "run_id" text PRIMARY KEY,
    "state" jsonb NOT NULL,
    "updated_at" timestamptz NOT NULL DEFAULT now(),
    "slot_name" text
)`, t),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "slot_name" text`, t)}
}
