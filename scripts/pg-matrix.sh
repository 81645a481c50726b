#!/usr/bin/env bash
# pg-matrix.sh runs the Postgres compatibility suite on Postgres 13 to 18 (issue 20):
# for each version it starts that version's dev server (scripts/dev.sh pg-up N), runs
# the selection below with the test environment pointing at it (Kafka stays the shared
# dev broker), stops the server, and prints one PASS/FAIL line with the time and the
# events lost by the fault suite, the HA run and the hostile run. It exits non-zero
# when a version failed.
#
#   scripts/pg-matrix.sh            every version (make test-pg-matrix)
#   scripts/pg-matrix.sh 13 16 18   those versions only (PG_MATRIX_VERSIONS in make)
#
# Each version's `go test -v` output goes to .dev/pg-matrix/pg-N.log.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DEV=scripts/dev.sh
GO=${GO:-go}

# The compatibility suite: existing integration tests of what differs between server
# versions (catalog queries, grants, pgoutput, slots), in ONE place. Keep it in step
# with docs/postgres-versions.md.
#   - setup and check, as a least-privilege role and as the owner (cmd/outbox-relay);
#   - end to end, and the relay SIGKILLed / SIGTERMed mid-stream (internal/relay);
#   - the reduced fault suite: relay SIGKILLs, Kafka kill and pause, Postgres crash and
#     network cut; the reduced HA takeover run (internal/faults);
#   - the reduced hostile-data run (internal/hostile; not RELAY_FAULTS=full);
#   - lag and status, including a lost slot (internal/ops, internal/relay);
#   - replay (internal/replay), retention and prune (internal/retention, internal/relay,
#     cmd/outbox-relay), the slot reader (replication/pgslot), the pgoutput stream itself
#     (replication), checkpoints (checkpoint), the grant statements (sql);
#   - partitioned outboxes and inserts under other names (TestPartition*, the renamed
#     outbox, an inheritance child, a table ignored), columns checked at start;
#   - a slot recreated or invalidated under the relay, and the idle slot's advance.
# Not here: the TLS and SASL tests (they test the client side, not the server version),
# the Debezium comparisons and the large replay (make test runs them on the default server).
PG_MATRIX_PACKAGES=(
	./cmd/outbox-relay
	./internal/relay
	./internal/faults
	./internal/hostile
	./internal/ops
	./internal/replay
	./internal/retention
	./internal/walbuffer
	./replication/pgslot
	./replication
	./checkpoint
	./sql
)
PG_MATRIX_RUN='^('\
'TestLeastPrivilege|TestCheckWarnsSuperuser|TestCheckGood|TestCheckBroken|TestSetup.*|TestGrant.*|'\
'TestPublicationRecreatedAfterSlot|TestStartLSNBeyondWAL.*|TestCheckpointSet.*|TestPrune|'\
'TestEndToEnd|TestMessagesEndToEnd|TestSIGKILLMidStream|TestSIGTERMMidStream|TestIdleAdvancesSlot|TestPostgresRestart|TestSchemaDriftStops|'\
'TestFaultSuite|TestHighAvailability|TestHostile|TestWALBuffer|TestStore|TestDrainer|TestDrainerFenced|TestWriteCost|TestLogSnapshots|TestCheckWALBound|'\
'TestLag.*|TestStatus|TestMetricsDuringRun|'\
'TestReplay(ByTimeAggregateAndTopic|FromLSN|OrderWithConcurrentWriters|Resume|BesideLiveRelay|KilledAndResumed)|'\
'TestInsertThenDelete|TestRetention.*|TestRound.*|TestDryRun|TestCheckTable|'\
'TestRead|TestStream.*|TestSave.*|TestStart|TestHorizon|TestRecordAndPruneHistory|TestSkip|'\
'TestPartition.*|TestOutboxRenamedWhileRunning|TestOutboxInheritanceChild|TestOtherTableIgnored|TestColumnsCheckedAtStart|'\
'TestSlotRecreatedWhileStopped|TestRecreatedSlotRefused|TestInvalidatedSlotRefused|TestIdleSlotKilledRestarts'\
')$'
PG_MATRIX_TIMEOUT=${PG_MATRIX_TIMEOUT:-40m}

versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
	read -r -a versions <<<"$(bash "$DEV" pg-versions)"
fi

logdir=$(cd -P .dev 2>/dev/null && pwd || echo "$ROOT/.dev")/pg-matrix
mkdir -p "$logdir"

fmt_time() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# lost_events LOG prints the events the fault suite, the HA runs and the hostile run
# report lost (their "LOST n" and "lost n," lines), and how many reports there were.
lost_events() {
	# A failed hostile run repeats its report after "hostile check failed": counted once.
	awk '
		/^ *LOST +[0-9]+ +want 0/ { lost += $2; reports++ }
		/hostile check failed/ { again = 1 }
		match($0, /(^|[^a-z])lost [0-9]+, no reason/) {
			if (again) { again = 0; next }
			s = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", s); lost += s; reports++
		}
		END { printf "events lost %d (%d fault/HA/hostile reports)", lost, reports }
	' "$1"
}

began=$SECONDS
failed=()
summary=()
for v in "${versions[@]}"; do
	log=$logdir/pg-$v.log
	start=$SECONDS
	status=0
	echo "==> postgres $v: scripts/dev.sh pg-up $v; go test ... (log: $log)"
	{
		bash "$DEV" pg-up "$v" >/dev/null &&
			env_lines=$(bash "$DEV" pg-env "$v") &&
			(
				eval "$env_lines"
				echo "postgres $v: $RELAY_TEST_POSTGRES_DSN"
				$GO test -count=1 -timeout "$PG_MATRIX_TIMEOUT" -v -run "$PG_MATRIX_RUN" "${PG_MATRIX_PACKAGES[@]}"
			)
	} >"$log" 2>&1 || status=$?
	# Stopped after its run: six idle servers would take memory from the next runs.
	bash "$DEV" pg-down "$v" >>"$log" 2>&1 || true
	took=$((SECONDS - start))
	release=$(bash "$DEV" pg-release "$v" 2>/dev/null || echo "?")
	if [ $status -eq 0 ]; then
		line=$(printf 'PASS  postgres %-3s (%s)  %s  %s' "$v" "$release" "$(fmt_time $took)" "$(lost_events "$log")")
	else
		failed+=("$v")
		line=$(printf 'FAIL  postgres %-3s (%s)  %s  %s  (log: %s)' "$v" "$release" "$(fmt_time $took)" "$(lost_events "$log")" "$log")
		bash "$ROOT/scripts/fail-excerpt.sh" "$log" | sed 's/^/      /' || true
	fi
	echo "$line"
	summary+=("$line")
done

echo
echo "Postgres compatibility matrix:"
printf '%s\n' "${summary[@]}"
echo "total: $(fmt_time $((SECONDS - began))) for ${#versions[@]} versions"
if [ ${#failed[@]} -gt 0 ]; then
	echo "FAILED on postgres ${failed[*]}"
	exit 1
fi
