#!/usr/bin/env bash
# demo.sh shows outbox-relay end to end on the local dev servers: build, start Postgres
# and Kafka, create the outbox table, run the relay, insert events of three aggregate
# types in one transaction, show them arriving on their Kafka topics, print the lag,
# stop the relay with SIGTERM. Every step fails loudly, with the relay's log tail.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEMO_DIR=$ROOT/.dev/demo
RELAY_LOG=$DEMO_DIR/relay.log
BIN=$ROOT/bin/outbox-relay
TIMEOUT=${DEMO_TIMEOUT_SECONDS:-60}
RUN_ID=demo-$(date +%s)-$$
SLOT=${RELAY_POSTGRES_SLOT:-outbox_relay}
relay_pid=""

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

relay_log_tail() {
	if [ -f "$RELAY_LOG" ]; then
		echo "--- last lines of $RELAY_LOG:" >&2
		tail -n 40 "$RELAY_LOG" >&2
	fi
}

fail() {
	echo "demo: error: $*" >&2
	relay_log_tail
	exit 1
}

stop_relay() {
	if [ -n "$relay_pid" ] && kill -0 "$relay_pid" 2>/dev/null; then
		kill -TERM "$relay_pid" 2>/dev/null || true
		wait "$relay_pid" 2>/dev/null || true
	fi
}

# An inactive slot makes the server keep all WAL written after it, and the dev server
# also serves the test suite, which writes a lot: drop the demo's slot when done.
# The next demo's setup creates it again.
drop_slot() {
	[ -n "${RELAY_POSTGRES_DSN:-}" ] || return 0
	psql "$RELAY_POSTGRES_DSN" -X -q -At -v slot="$SLOT" >/dev/null 2>&1 <<'SQL' || true
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = :'slot' AND NOT active;
SQL
}

cleanup() {
	stop_relay
	drop_slot
}
trap cleanup EXIT

step "build"
make -s build || fail "make build failed"
"$BIN" version || fail "outbox-relay version failed"

step "dev servers"
scripts/dev.sh up || fail "scripts/dev.sh up failed"
eval "$(scripts/dev.sh env)"
command -v kcat >/dev/null || fail "kcat is missing: apt-get install kcat"
mkdir -p "$DEMO_DIR"

step "outbox-relay setup --create-outbox-table"
"$BIN" setup --create-outbox-table >"$DEMO_DIR/setup.log" 2>&1 || {
	cat "$DEMO_DIR/setup.log" >&2
	fail "setup failed"
}
cat "$DEMO_DIR/setup.log"

step "outbox-relay run (log: $RELAY_LOG)"
"$BIN" run >"$RELAY_LOG" 2>&1 &
relay_pid=$!
sleep 2
kill -0 "$relay_pid" 2>/dev/null || fail "the relay exited right after start"
echo "relay running, pid $relay_pid"

step "insert 7 events of Order, Payment and Customer in one transaction (run $RUN_ID)"
psql "$RELAY_POSTGRES_DSN" -X -q -v ON_ERROR_STOP=1 -v run="$RUN_ID" <<'SQL' || fail "insert failed"
BEGIN;
INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, headers, created_at)
SELECT gen_random_uuid(), e.aggregate_type, e.aggregate_id, e.event_type, e.payload::jsonb,
       jsonb_build_object('demo_run', :'run'), now()
FROM (VALUES
  ('Order',    'order-1001', 'OrderPlaced',     '{"order_id":"order-1001","customer_id":"cust-7","total":42.50}'),
  ('Order',    'order-1002', 'OrderPlaced',     '{"order_id":"order-1002","customer_id":"cust-8","total":9.99}'),
  ('Payment',  'pay-5001',   'PaymentReceived', '{"payment_id":"pay-5001","order_id":"order-1001","amount":42.50}'),
  ('Order',    'order-1001', 'OrderShipped',    '{"order_id":"order-1001","carrier":"DHL"}'),
  ('Payment',  'pay-5002',   'PaymentReceived', '{"payment_id":"pay-5002","order_id":"order-1002","amount":9.99}'),
  ('Customer', 'cust-7',     'CustomerUpdated', '{"customer_id":"cust-7","email":"ada@example.com"}'),
  ('Customer', 'cust-8',     'CustomerCreated', '{"customer_id":"cust-8","email":"alan@example.com"}')
) AS e(aggregate_type, aggregate_id, event_type, payload);
COMMIT;
SQL
declare -A want=([Order]=3 [Payment]=2 [Customer]=2)

# count_run prints how many messages of this demo run a topic holds.
count_run() {
	{ kcat -b "$RELAY_KAFKA_BROKERS" -C -t "$1" -o beginning -e -q -f '%h\n' 2>/dev/null || true; } |
		grep -c "demo_run=$RUN_ID" || true
}

step "wait until they arrive on outbox.event.<aggregate_type>"
deadline=$((SECONDS + TIMEOUT))
for agg in Order Payment Customer; do
	topic=outbox.event.$agg
	while :; do
		n=$(count_run "$topic")
		[ "$n" -ge "${want[$agg]}" ] && break
		kill -0 "$relay_pid" 2>/dev/null || fail "the relay exited while events were pending"
		[ $SECONDS -lt $deadline ] || fail "$topic has $n of ${want[$agg]} events after ${TIMEOUT}s"
		sleep 0.5
	done
	echo "$topic: ${want[$agg]} events"
done

step "the events, per topic (kcat)"
for agg in Order Payment Customer; do
	topic=outbox.event.$agg
	echo "--- $topic"
	kcat -b "$RELAY_KAFKA_BROKERS" -C -t "$topic" -o beginning -e -q \
		-f 'topic=%t partition=%p offset=%o key=%k headers=%h\n  value=%s\n' |
		grep -A1 "demo_run=$RUN_ID" | grep -v '^--$' || fail "kcat could not read $topic"
done

step "outbox-relay lag"
"$BIN" lag || fail "outbox-relay lag failed"

step "stop the relay (SIGTERM)"
kill -TERM "$relay_pid"
status=0
wait "$relay_pid" || status=$?
relay_pid=""
[ $status -eq 0 ] || fail "the relay exited with status $status after SIGTERM"
echo "relay stopped cleanly; its log: $RELAY_LOG"
echo "The dev servers keep running: make dev-down stops them. The demo's slot $SLOT is dropped on exit."
