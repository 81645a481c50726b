#!/usr/bin/env bash
# kafka-matrix.sh runs the Kafka compatibility suite (issue 36) on each Kafka version
# given: for each it starts a broker of that version alone (scripts/dev.sh kafka-up)
# in a directory and on ports of its own, beside the dev servers, runs the selection
# below with the test environment pointing at that broker (Postgres stays the dev
# server), stops the broker, and prints one PASS/FAIL line with the version and the
# time. It exits non-zero when a version failed.
#
#   scripts/kafka-matrix.sh               Kafka 3.9.1 (the dev default) and the newest 4.x
#   scripts/kafka-matrix.sh 4.4.0         that version only (make test-kafka KAFKA_VERSIONS=4.4.0)
#
# Each version's broker lives in .dev/kafka-matrix/<version> (its data is kept: a second
# run starts in seconds) on 127.0.0.1:$KAFKA_MATRIX_PORT (19192) to +4; its TLS files
# are the dev servers' (.dev/tls), so the test environment's CA holds for both. Each
# version's `go test -v` output goes to .dev/kafka-matrix/kafka-<version>.log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEV=scripts/dev.sh
GO=${GO:-go}

# The newest Kafka 4.x that Maven Central served when this was last checked (a scratch
# pom with org.apache.kafka:kafka_2.13 at a version range such as [4,5), or
# `RELAY_DEV_KAFKA_VERSION=4.x.y scripts/dev.sh kafka-up`). Bump it with docs/contributing.md.
KAFKA_MATRIX_NEWEST=4.4.0
KAFKA_MATRIX_PORT=${KAFKA_MATRIX_PORT:-19192}
KAFKA_MATRIX_TIMEOUT=${KAFKA_MATRIX_TIMEOUT:-20m}

# The compatibility suite: what the broker's version can change for the relay.
#   - every test of sink/ and its packages (the producer, idempotence and its
#     sequences, transactions and fencing, the admin checks, topic errors, SASL SCRAM
#     and mTLS with ACLs, OAUTHBEARER, a broker killed and paused): run whole, so a test
#     added there is in the suite without a change here;
#   - end to end through the relay, at least once and exactly once, including the
#     broker's transaction timeout (internal/relay);
#   - the binary end to end: the secure listeners with the relay's ACLs, check's
#     transactional-id ACLs (cmd/outbox-relay), CloudEvents read by the SDK's Kafka
#     binding (cmd/outbox-relay/cloudeventstest, a module of its own: KAFKA_MATRIX_CE).
KAFKA_MATRIX_WHOLE=(./sink/...)
KAFKA_MATRIX_PACKAGES=(./internal/relay ./cmd/outbox-relay)
KAFKA_MATRIX_RUN='^('\
'TestEndToEnd|TestMessagesEndToEnd|TestMessagesNonTransactional|TestExactlyOnce.*|'\
'TestSecureRun.*|TestCheckTransactionsACLs'\
')$'
KAFKA_MATRIX_CE=cmd/outbox-relay/cloudeventstest

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
	# The dev broker's default release, whatever RELAY_DEV_KAFKA_VERSION the caller exported.
	versions=("$(RELAY_DEV_KAFKA_VERSION='' bash "$DEV" kafka-version)" "$KAFKA_MATRIX_NEWEST")
fi

# The dev servers' directory (the physical one: a worktree's .dev may be a link) holds
# the matrix's brokers; its Postgres and TLS files serve every version.
dev_env=$(bash "$DEV" env)
dev_dir=$(eval "$dev_env" && echo "$RELAY_DEV_DIR")
matrix=$dev_dir/kafka-matrix
mkdir -p "$matrix"

fmt_time() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# broker_env V prints the dev script's variables for version V's broker.
broker_env() {
	echo "export RELAY_DEV_DIR='$matrix/$1' RELAY_DEV_KAFKA_PORT='$KAFKA_MATRIX_PORT' RELAY_DEV_KAFKA_VERSION='$1'"
	echo "unset RELAY_DEV_KAFKA_CONTROLLER_PORT RELAY_DEV_KAFKA_SASL_PORT RELAY_DEV_KAFKA_MTLS_PORT RELAY_DEV_KAFKA_OAUTH_PORT"
}

began=$SECONDS
failed=()
summary=()
for v in "${versions[@]}"; do
	log=$matrix/kafka-$v.log
	start=$SECONDS
	status=0
	mkdir -p "$matrix/$v"
	[ -e "$matrix/$v/tls" ] || ln -s "$dev_dir/tls" "$matrix/$v/tls"
	echo "==> kafka $v: scripts/dev.sh kafka-up on 127.0.0.1:$KAFKA_MATRIX_PORT; go test ... (log: $log)"
	{
		(eval "$(broker_env "$v")" && bash "$DEV" kafka-up) &&
			(
				# Postgres (and the tools' settings) from the dev servers, Kafka from
				# this version's broker: the later export lines win.
				eval "$dev_env"
				eval "$(broker_env "$v")"
				eval "$(bash "$DEV" env | grep -E '_KAFKA_|RELAY_DEV_DIR')"
				echo "kafka $v: $RELAY_TEST_KAFKA_BROKERS (SASL_SSL $RELAY_TEST_KAFKA_SASL_BROKERS, mTLS $RELAY_TEST_KAFKA_MTLS_BROKERS, OAUTHBEARER $RELAY_TEST_KAFKA_OAUTH_BROKERS); postgres $RELAY_TEST_POSTGRES_DSN"
				$GO test -count=1 -timeout "$KAFKA_MATRIX_TIMEOUT" -v "${KAFKA_MATRIX_WHOLE[@]}" &&
					$GO test -count=1 -timeout "$KAFKA_MATRIX_TIMEOUT" -v -run "$KAFKA_MATRIX_RUN" "${KAFKA_MATRIX_PACKAGES[@]}" &&
					(cd "$KAFKA_MATRIX_CE" && $GO test -count=1 -timeout "$KAFKA_MATRIX_TIMEOUT" -v -run '^TestCloudEventsEndToEnd$' ./...)
			)
	} >"$log" 2>&1 || status=$?
	# Stopped after its run: the next version takes the same ports.
	(eval "$(broker_env "$v")" && bash "$DEV" kafka-down) >>"$log" 2>&1 || true
	took=$((SECONDS - start))
	tests=$(grep -c '^--- PASS' "$log" || true)
	if [ $status -eq 0 ]; then
		line=$(printf 'PASS  kafka %-7s %s  %d tests passed' "$v" "$(fmt_time $took)" "$tests")
	else
		failed+=("$v")
		line=$(printf 'FAIL  kafka %-7s %s  %d tests passed  (log: %s)' "$v" "$(fmt_time $took)" "$tests" "$log")
		bash "$ROOT/scripts/fail-excerpt.sh" "$log" | sed 's/^/      /' || true
	fi
	echo "$line"
	summary+=("$line")
done

echo
echo "Kafka compatibility matrix:"
printf '%s\n' "${summary[@]}"
echo "total: $(fmt_time $((SECONDS - began))) for ${#versions[@]} versions"
if [ ${#failed[@]} -gt 0 ]; then
	echo "FAILED on kafka ${failed[*]}"
	exit 1
fi
