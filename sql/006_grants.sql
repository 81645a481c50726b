-- The privileges of the relay's role, with the default names and the role
-- outbox_relay: LOGIN and REPLICATION, never superuser, plus the grants below,
-- which cover `outbox-relay run` (with its retry worker and checkpoint history) and
-- the operator commands (lag, status, retries, checkpoint, prune, replay).
-- Run after 001 to 005, as a superuser (creating a role with REPLICATION needs
-- one). Idempotent. For other names, or another role, print the statements
-- with `outbox-relay setup --print-sql [--role NAME]`; `outbox-relay check` names
-- any grant that is missing, with the statement that fixes it.
--
-- Generated from package sql's builders (go generate ./sql): edit those.

-- The role, created if missing, without a password (set one: \password
-- outbox_relay in psql), and given REPLICATION if it has neither that nor
-- superuser. On a managed service grant its replication role instead (AWS RDS:
-- GRANT rds_replication TO outbox_relay).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outbox_relay') THEN
        CREATE ROLE "outbox_relay" LOGIN REPLICATION;
    ELSIF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outbox_relay' AND (rolreplication OR rolsuper)) THEN
        ALTER ROLE "outbox_relay" REPLICATION;
    END IF;
END
$$;

-- Every command connects to this database.
DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), 'outbox_relay');
END
$$;

-- schema: every command: the relay's tables are in it
GRANT USAGE ON SCHEMA "public" TO "outbox_relay";

-- outbox table: lag reads the oldest undelivered row, replay the rows it
-- re-delivers
GRANT SELECT ON TABLE "public"."outbox" TO "outbox_relay";

-- checkpoint table: run saves the checkpoint (INSERT ... ON CONFLICT DO UPDATE),
-- checkpoint set moves it; lag, status and checkpoint show read it
GRANT SELECT, INSERT, UPDATE ON TABLE "outbox_relay_checkpoint" TO "outbox_relay";

-- checkpoint history table: run records checkpoints and deletes those older than
-- checkpoint.history_keep; replay, retention and checkpoint show read it
GRANT SELECT, INSERT, DELETE ON TABLE "outbox_relay_checkpoint_history" TO "outbox_relay";

-- retry table: run stores failed events, its retry worker updates and deletes
-- them; retries list/show/requeue/drop
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "outbox_relay_retry" TO "outbox_relay";

-- retry table's sequence: inserting into the retry table draws its seq
-- (bigserial)
GRANT USAGE ON SEQUENCE "outbox_relay_retry_seq_seq" TO "outbox_relay";

-- WAL buffer table: run stores what it reads there while it cannot deliver
-- (postgres.max_retained_wal), delivers it and deletes it; lag and status read
-- it
GRANT SELECT, INSERT, DELETE ON TABLE "outbox_relay_wal_buffer" TO "outbox_relay";

-- replay table: replay saves each run's progress, to resume it by --id
GRANT SELECT, INSERT, UPDATE ON TABLE "outbox_relay_replay" TO "outbox_relay";

-- With outbox.retention on, the relay (and `outbox-relay prune`) deletes
-- delivered rows: uncomment.
-- GRANT DELETE ON TABLE "public"."outbox" TO "outbox_relay";
