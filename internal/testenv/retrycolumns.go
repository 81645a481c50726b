package testenv

// OldRetryColumns are the retry table's columns as the versions before
// slot_name and last_resort created it (event_key unique across the table),
// for the tests that upgrade such a table: package sql's of the DDL, package
// retry's of Store.Migrate.
const OldRetryColumns = `"seq" bigserial PRIMARY KEY,
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
    "updated_at" timestamptz NOT NULL DEFAULT now()`
