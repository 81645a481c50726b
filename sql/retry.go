package sql

import "fmt"

// DefaultRetryTable is the retry table's name in 004_retry.sql.
const DefaultRetryTable = "outbox_relay_retry"

// RetryTable returns the statements creating the retry table (events that
// could not be delivered, and those waiting behind them) and its two indexes,
// if missing: (status, next_attempt_at) for the retry worker's poll, and
// (aggregate, seq) for finding the head of an aggregate.
func RetryTable(t Table) []string {
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
    "updated_at" timestamptz NOT NULL DEFAULT now()
)`, t.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("status", "next_attempt_at")`,
			Ident(indexName(t.Name, "status_next_attempt_at_idx")), t.Quoted()),
		fmt.Sprintf(`CREATE INDEX IF NOT EXISTS %s ON %s ("aggregate", "seq")`,
			Ident(indexName(t.Name, "aggregate_seq_idx")), t.Quoted()),
	}
}
