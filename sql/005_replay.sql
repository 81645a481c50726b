-- The replay table, with its default name (beside the checkpoint table):
-- `outbox-relay replay` keeps each run's selection and progress here, so that a
-- run resumes by its --id. `outbox-relay setup` creates it too. Replay would create it
-- itself, but only as a role that may create tables in the schema. Idempotent.
--
-- Generated from package sql's builders (go generate ./sql): edit those.

CREATE TABLE IF NOT EXISTS "outbox_relay_replay" (
    "run_id" text PRIMARY KEY,
    "state" jsonb NOT NULL,
    "updated_at" timestamptz NOT NULL DEFAULT now(),
    "slot_name" text
);

-- Tables made before runs belonged to a slot.
ALTER TABLE "outbox_relay_replay" ADD COLUMN IF NOT EXISTS "slot_name" text;
