package sql

import "fmt"

// DefaultWALBufferTable is the WAL buffer table's name (internal/walbuffer:
// what a relay that cannot deliver has read, postgres.max_retained_wal).
const DefaultWALBufferTable = "outbox_relay_wal_buffer"

// WALBufferTable is the WAL buffer table beside the retry table retry: in
// its schema, named DefaultWALBufferTable, so that retry.table places both.
func WALBufferTable(retry Table) Table {
	return Table{Schema: retry.Schema, Name: DefaultWALBufferTable}
}

// WALBufferTableDDL creates the WAL buffer table t, a no-op when it exists:
// one row per buffered event, owned by a slot, keyed by its place in the WAL
// (its transaction's commit LSN and its position in it), the event itself an
// encoded copy (internal/walbuffer).
func WALBufferTableDDL(t Table) []string {
	return []string{fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "slot_name" text NOT NULL,
    "commit_lsn" pg_lsn NOT NULL,
    "pos" integer NOT NULL,
    "event" bytea NOT NULL,
    "buffered_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("slot_name", "commit_lsn", "pos")
)`, t.Quoted())}
}
