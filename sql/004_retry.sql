-- The retry table, with its default name (outbox_relay_retry): events that
-- could not be delivered to Kafka, and the events of the same aggregate that
-- wait behind them so that per-aggregate order survives the failure.
--
--   seq              global order of failure, and the short id that
--                    `outbox-relay retries` takes
--   event_key        the event id, or lsn:<commit_lsn>:<n> when the id is NULL;
--                    unique, so inserting again after a crash changes nothing
--   aggregate        the blocking identity (topic/key, or
--                    unroutable:<aggregate_type>/<aggregate_id>): no row of an
--                    aggregate is delivered while a lower seq of it is here
--   status           pending (retried with backoff) or dead (kept for the
--                    operator: requeue or drop it); a dead row still blocks
--                    its aggregate
--   waiting          true when the row is here only because an earlier event
--                    of its aggregate is, not because it failed itself
--
-- Idempotent: safe to run again. `outbox-relay setup` runs the same statements
-- with the configured name (retry.table). Run after 002_relay.sql.

CREATE TABLE IF NOT EXISTS "outbox_relay_retry" (
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
);

-- The retry worker polls for due rows with it.
CREATE INDEX IF NOT EXISTS "outbox_relay_retry_status_next_attempt_at_idx"
    ON "outbox_relay_retry" ("status", "next_attempt_at");

-- Finding the head of an aggregate, and the rows waiting behind it.
CREATE INDEX IF NOT EXISTS "outbox_relay_retry_aggregate_seq_idx"
    ON "outbox_relay_retry" ("aggregate", "seq");
