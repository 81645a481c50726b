#!/bin/sh
# docker-compose.yml's Postgres init script: run once by the postgres image's
# entrypoint on an empty volume, as the image's superuser (POSTGRES_USER), while the
# server listens on its Unix socket only. It runs the scripts of sql/ in name order
# (the outbox table, the relay's tables, the slot, and the grants of the relay's
# role outbox_relay: LOGIN REPLICATION, never superuser, see docs/security.md), then
# gives outbox_relay a password, so that the relays log in as that role, not as the
# superuser.
set -e
for f in /outbox-relay-sql/*.sql; do
	echo "initdb.sh: running $f"
	psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" -f "$f"
done
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
	-c "ALTER ROLE outbox_relay LOGIN PASSWORD '$RELAY_ROLE_PASSWORD'"
