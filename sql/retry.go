package sql

import "fmt"

// DefaultRetryTable is the retry table's name in 004_retry.sql.
const DefaultRetryTable = "outbox_relay_retry"

// RetryTable returns the statements creating the retry table (events that
// could not be delivered, and those waiting behind them) and its indexes, if
// missing: (status, next_attempt_at) for the retry worker's poll, and
// (md5(aggregate), seq) for finding the head of an aggregate. They also
// upgrade a table made by an earlier version: the last_resort,
// message_time and outbox_table columns are added, and the old (aggregate, seq) index, which refused aggregates longer
// than a btree entry can hold, is replaced.
//
// No btree index holds unbounded text: event_key is a WAL position
// (lsn:<commit_lsn>:<n>), status one of two words, and the aggregate is
// indexed by its digest.
func RetryTable(t Table) []string {
	current, old := RetryAggregateIndex(t)
	return []string{
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "seq" bigserial PRIMARY KEY,
    "event_key" text NOT NULL UNIQUE,
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
    "outbox_table" text
)`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "last_resort" bytea`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "message_time" timestamptz`, t.Quoted()),
		fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "outbox_table" text`, t.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s
    ON %s ("status", "next_attempt_at")`,
			Ident(indexName(t.Name, "status_next_attempt_at_idx")), t.Quoted()),
		// An index lives in its table's schema: qualify the old one's name
		// the same way, so that the right one is dropped.
		fmt.Sprintf(`DROP INDEX IF EXISTS %s`, Table{Schema: t.Schema, Name: old}.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s
    ON %s (md5("aggregate"), "seq")`, Ident(current), t.Quoted()),
	}
}

// RetryAggregateIndex returns the names of the retry table's index on
// (md5(aggregate), seq) and of the (aggregate, seq) index of earlier versions,
// which RetryTable drops: for checking whether a table is current.
func RetryAggregateIndex(t Table) (current, old string) {
	return indexName(t.Name, "aggregate_md5_seq_idx"), indexName(t.Name, "aggregate_seq_idx")
}
