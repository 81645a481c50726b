-- What outbox-relay itself needs, with the default names: its checkpoint table,
-- the checkpoint history and the publication of the outbox table. Run after
-- 001_outbox.sql (the publication names the table). Idempotent: safe to run
-- again.
-- `outbox-relay setup` does the same with the configured names and also creates
-- the replication slot (003_slot.sql).
--
-- Generated from package sql's builders (go generate ./sql): edit those.

-- The relay's own record of the last transaction delivered to Kafka, one row
-- per slot. It never moves backwards, unlike a slot's confirmed_flush_lsn,
-- which the server persists only at checkpoints and may lose in a crash.
-- system_identifier and timeline_id name the server the slot was read from: a
-- relay that finds its slot on another system, or on a timeline that forked
-- before the checkpoint, refuses to stream from it.
CREATE TABLE IF NOT EXISTS "outbox_relay_checkpoint" (
    "slot_name" text PRIMARY KEY,
    "lsn" pg_lsn NOT NULL,
    "last_commit_time" timestamptz,
    "saved_at" timestamptz NOT NULL DEFAULT now(),
    "epoch" bigint NOT NULL DEFAULT 0,
    "leader" text,
    "leader_since" timestamptz,
    "system_identifier" text,
    "timeline_id" integer,
    "stopped_before" pg_lsn,
    "stop_reason" text,
    "last_refill" text,
    "pruned" jsonb,
    "refill_progress" jsonb
);

-- A compact history of the checkpoints saved, one row at most every
-- checkpoint.history_interval (1m) per slot, kept checkpoint.history_keep (30d).
-- It maps a checkpoint's LSN to its commit time (replay), and says which outbox
-- rows are delivered (retention): snapshot_xmin is the oldest transaction still
-- running when the row was written and snapshot_lsn the WAL position read just
-- after, so every transaction older than snapshot_xmin committed (if at all)
-- before snapshot_lsn. Once the checkpoint reaches snapshot_lsn, every row those
-- transactions inserted was delivered.
CREATE TABLE IF NOT EXISTS "outbox_relay_checkpoint_history" (
    "slot_name" text NOT NULL,
    "lsn" pg_lsn NOT NULL,
    "last_commit_time" timestamptz,
    "saved_at" timestamptz NOT NULL DEFAULT now(),
    "snapshot_xmin" xid8 NOT NULL,
    "snapshot_lsn" pg_lsn NOT NULL,
    PRIMARY KEY ("slot_name", "lsn")
);
CREATE INDEX IF NOT EXISTS "outbox_relay_checkpoint_history_snapshot_lsn_idx"
    ON "outbox_relay_checkpoint_history" ("slot_name", "snapshot_lsn");

-- Only INSERTs are published: an event is an insert, and applications that
-- delete relayed rows (or update them) then cost no decoding bandwidth and no
-- network traffic, because the walsender filters those changes out before
-- they are sent. CREATE PUBLICATION has no IF NOT EXISTS, hence the DO block.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'outbox_relay') THEN
        CREATE PUBLICATION "outbox_relay" FOR TABLE "public"."outbox" WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END
$$;
