-- The outbox table, with the default name (public.outbox) and column names.
--
-- Applications insert one row per event inside their business transaction;
-- outbox-relay reads the inserts from the WAL and produces them to Kafka.
-- The layout matches the Debezium outbox event router, so consumers can move
-- between the two unchanged:
--   aggregate_type  routes the event to a topic (outbox.event.<aggregate_type>)
--   aggregate_id    is the Kafka key, which keeps per-aggregate order
--   id              is sent as the Kafka header "id": the consumers' dedup key
--   payload         is the message value, the bytes as stored
--   headers         (a JSON object) adds Kafka headers
--
-- Idempotent: safe to run again. `outbox-relay setup --create-outbox-table`
-- runs the same statements with the configured names.
--
-- Generated from package sql's builders (go generate ./sql): edit those.

CREATE TABLE IF NOT EXISTS "public"."outbox" (
    "id" uuid PRIMARY KEY,
    "aggregate_type" text NOT NULL,
    "aggregate_id" text NOT NULL,
    "event_type" text NOT NULL,
    "payload" jsonb,
    "headers" jsonb,
    "created_at" timestamptz NOT NULL DEFAULT now()
);

-- `outbox-relay lag` finds the oldest row with it, and applications that purge
-- relayed rows (DELETE ... WHERE created_at < ...) use it too.
CREATE INDEX IF NOT EXISTS "outbox_created_at_idx" ON "public"."outbox" ("created_at");
