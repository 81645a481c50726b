package sql

import "fmt"

// DefaultRetryTable is the retry table's name in 004_retry.sql.
const DefaultRetryTable = "outbox_relay_retry"

// RetryTable returns the statements creating the retry table (events that
// could not be delivered, and those waiting behind them) and its indexes, if
// missing. They also upgrade a table made by an earlier version: the
// last_resort, message_time, outbox_table and slot_name columns are added,
// and the indexes of earlier versions are replaced (see RetryIndexes).
//
// Every row belongs to one replication slot (slot_name): the relay of that
// slot (and its standbys, which share the slot) is the only one that reads,
// delivers, requeues or deletes it, so relays of several slots may share the
// table. The slot leads every index the relay's queries use, and the event
// key is unique per slot: two slots reading one outbox table park the same
// event under the same key, each its own row. A row with no slot was made by
// an earlier version; the relay adopts such rows at start-up when it can
// tell they are its own (package retry's Store.Adopt), else refuses to start.
//
// No btree index holds unbounded text: event_key is a WAL position
// (lsn:<commit_lsn>:<n>), status one of two words, slot_name a slot name (at
// most 63 bytes), and the aggregate is indexed by its digest.
func RetryTable(t Table) []string {
	current, old := RetryIndexes(t)
	stmts := []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "seq" bigserial PRIMARY KEY,
    "event_key" text NOT NULL,
    "event_id" text,
    "aggregate" text NOT NULL,
    "aggregate_type" text,
    "aggregate_id" text,
    "event_type" text,
    "topic" text,
    "msg_key" bytea,
    "value" bytea,
    "headers" jsonb,
    "status" text NOT NULL CHECK ("status" IN ('pending', 'dead')),
    "waiting" boolean NOT NULL DEFAULT false,
    "attempts" integer NOT NULL DEFAULT 0,
    "next_attempt_at" timestamptz NOT NULL,
    "last_error" text,
    "first_failed_at" timestamptz NOT NULL DEFAULT now(),
    "source_lsn" pg_lsn,
    "commit_time" timestamptz,
    "created_at" timestamptz NOT NULL DEFAULT now(),
    "updated_at" timestamptz NOT NULL DEFAULT now(),
    "last_resort" bytea,
    "message_time" timestamptz,
    "outbox_table" text,
    "slot_name" text,
    "reason_code" text
)`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "last_resort" bytea`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "message_time" timestamptz`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "outbox_table" text`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "slot_name" text`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "reason_code" text`, t.Quoted()),
		// Earlier versions made event_key unique across the table (a
		// column constraint, named by PostgreSQL): found by its column,
		// whatever its name.
		fmt.Sprintf(`DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT k.conname FROM pg_catalog.pg_constraint k
        JOIN pg_catalog.pg_attribute a ON a.attrelid = k.conrelid AND a.attname = 'event_key'
        WHERE k.conrelid = to_regclass(%s) AND k.contype = 'u' AND k.conkey = ARRAY[a.attnum]
    LOOP
        EXECUTE format('ALTER TABLE %%s DROP CONSTRAINT %%I', %s, c);
    END LOOP;
END
$$`, t.Literal(), Literal(t.Quoted())),
	}
	// An index lives in its table's schema: qualify the old ones' names the
	// same way, so that the right ones are dropped.
	for _, name := range old {
		stmts = append(stmts, fmt.Sprintf(`DROP INDEX IF EXISTS %s`, Table{Schema: t.Schema, Name: name}.Quoted()))
	}
	return append(stmts,
		fmt.Sprintf(`CREATE UNIQUE INDEX IF NOT EXISTS %s
    ON %s ("slot_name", "event_key")`, Ident(current[0]), t.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s
    ON %s ("slot_name", "status", "next_attempt_at")`, Ident(current[1]), t.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s
    ON %s ("slot_name", md5("aggregate"), "seq")`, Ident(current[2]), t.Quoted()),
	)
}

// RetryIndexes returns the names of the retry table's indexes, in t's
// schema: current are those RetryTable creates, on (slot_name, event_key)
// (unique), (slot_name, status, next_attempt_at) and (slot_name,
// md5(aggregate), seq); old those of earlier versions, which it drops (on
// (status, next_attempt_at), (md5(aggregate), seq) and (aggregate, seq), the
// last of which refused aggregates longer than a btree entry can hold). For
// checking whether a table is current.
func RetryIndexes(t Table) (current, old []string) {
	return []string{indexName(t.Name, "slot_event_key_idx"), indexName(t.Name, "slot_status_next_attempt_idx"),
			indexName(t.Name, "slot_aggregate_md5_seq_idx")},
		[]string{indexName(t.Name, "status_next_attempt_at_idx"), indexName(t.Name, "aggregate_md5_seq_idx"),
			indexName(t.Name, "aggregate_seq_idx")}
}
