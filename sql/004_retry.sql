-- The retry table, with its default name (outbox_relay_retry): events that
-- could not be delivered to Kafka, and the events of the same aggregate that
-- wait behind them so that per-aggregate order survives the failure.
--
--   seq              global order of failure, and the short id that
--                    `outbox-relay retries` takes
--   event_key        the event's position in the WAL, lsn:<commit_lsn>:<n>
--                    (older versions stored the event id); unique per slot,
--                    so inserting again after a crash changes nothing. Short
--                    by construction: with slot_name, the only text under a
--                    btree index
--   aggregate        the blocking identity (topic/key, or
--                    unroutable:<aggregate_type>/<aggregate_id>): no row of an
--                    aggregate is delivered while a lower seq of it is here.
--                    Unbounded, so indexed by its md5 only
--   headers          the event's extra headers (from the outbox headers
--                    column), as [{"key":…,"value":…}]; a key or value that
--                    is not valid UTF-8 or holds a NUL byte (which jsonb
--                    cannot store) is in "key_b64"/"value_b64" instead. The
--                    relay's own headers (id, event_type, aggregate_type) are
--                    built from their columns at delivery
--   status           pending (retried with backoff) or dead (kept for the
--                    operator: requeue or drop it); a dead row still blocks
--                    its aggregate
--   waiting          true when the row is here only because an earlier event
--                    of its aggregate is, not because it failed itself
--   last_resort      NULL, except for an event the other columns refused
--                    (a data error): then the whole event as a JSON document
--                    (bytes in base64), the row is dead and the relay never
--                    delivers it; see `outbox-relay retries show`
--   slot_name        the replication slot of the relay that stored the row:
--                    only that relay (and its standbys, on the same slot)
--                    reads, delivers, requeues, lists or deletes it, so
--                    relays of several slots may share this table. NULL for
--                    a row of an earlier version, which the relay adopts at
--                    start-up when it can tell the row is its own (else it
--                    refuses to start and says which UPDATE assigns them)
--
-- Idempotent: safe to run again, and upgrades a table made by an earlier
-- version. `outbox-relay setup` runs the same statements with the configured
-- name (retry.table). Run after 002_relay.sql.
--
-- Generated from package sql's builders (go generate ./sql): edit those.

CREATE TABLE IF NOT EXISTS "outbox_relay_retry" (
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
);

-- Tables made before last-resort records, message timestamps, several outbox tables,
-- rows owned by a slot and reason codes existed.
ALTER TABLE "outbox_relay_retry" ADD COLUMN IF NOT EXISTS "last_resort" bytea;
ALTER TABLE "outbox_relay_retry" ADD COLUMN IF NOT EXISTS "message_time" timestamptz;
ALTER TABLE "outbox_relay_retry" ADD COLUMN IF NOT EXISTS "outbox_table" text;
ALTER TABLE "outbox_relay_retry" ADD COLUMN IF NOT EXISTS "slot_name" text;
ALTER TABLE "outbox_relay_retry" ADD COLUMN IF NOT EXISTS "reason_code" text;

-- Earlier versions made event_key unique across the table. It is unique per
-- slot now: two slots reading one outbox table park the same event under the
-- same key, each its own row.
DO $$
DECLARE c name;
BEGIN
    FOR c IN SELECT k.conname FROM pg_catalog.pg_constraint k
        JOIN pg_catalog.pg_attribute a ON a.attrelid = k.conrelid AND a.attname = 'event_key'
        WHERE k.conrelid = to_regclass('"outbox_relay_retry"') AND k.contype = 'u' AND k.conkey = ARRAY[a.attnum]
    LOOP
        EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', '"outbox_relay_retry"', c);
    END LOOP;
END
$$;

-- Indexes of earlier versions: without the slot, or on the aggregate's text.
DROP INDEX IF EXISTS "outbox_relay_retry_status_next_attempt_at_idx";
DROP INDEX IF EXISTS "outbox_relay_retry_aggregate_md5_seq_idx";
DROP INDEX IF EXISTS "outbox_relay_retry_aggregate_seq_idx";

-- An event is stored once per slot: inserting it again after a crash changes nothing.
CREATE UNIQUE INDEX IF NOT EXISTS "outbox_relay_retry_slot_event_key_idx"
    ON "outbox_relay_retry" ("slot_name", "event_key");

-- The retry worker polls for its slot's due rows with it.
CREATE INDEX IF NOT EXISTS "outbox_relay_retry_slot_status_next_attempt_idx"
    ON "outbox_relay_retry" ("slot_name", "status", "next_attempt_at");

-- Finding the head of an aggregate, and the rows waiting behind it. On the
-- md5 of the aggregate: a btree entry of the text itself fails above ~2.7 kB
-- (and an insert failing there would stall the relay). Queries compare both
-- md5(aggregate) and aggregate, so a collision costs a little speed only.
-- Earlier versions indexed the text itself.
CREATE INDEX IF NOT EXISTS "outbox_relay_retry_slot_aggregate_md5_seq_idx"
    ON "outbox_relay_retry" ("slot_name", md5("aggregate"), "seq");

-- The WAL buffer: what a relay that cannot deliver has read, in WAL order, so that
-- its slot need not keep the WAL (postgres.max_retained_wal; docs/wal-buffer.md).
CREATE TABLE IF NOT EXISTS "outbox_relay_wal_buffer" (
    "slot_name" text NOT NULL,
    "commit_lsn" pg_lsn NOT NULL,
    "pos" integer NOT NULL,
    "event" bytea NOT NULL,
    "buffered_at" timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY ("slot_name", "commit_lsn", "pos")
);
