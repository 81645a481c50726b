-- The logical replication slot, with the default name. Optional here:
-- `outbox-relay setup` creates it too. From the moment it exists the server
-- keeps WAL for it until outbox-relay confirms it, so create it only where the
-- relay will run (an unused slot fills the disk). Idempotent.
--
-- Must not run inside a transaction that has written anything (psql's default
-- autocommit is fine; docker-entrypoint-initdb.d runs files that way).
--
-- Generated from package sql's builders (go generate ./sql): edit those.

SELECT pg_catalog.pg_create_logical_replication_slot('outbox_relay', 'pgoutput')
WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = 'outbox_relay');
