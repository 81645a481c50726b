# outbox-relay: build, test and the local dev environment.
# `make demo` and `make test` work on a fresh Debian 12 machine: scripts/dev.sh installs
# Postgres 15, Java, Maven, kcat and Prometheus (for the alert tests) with apt when they
# are missing.

SHELL   := bash
GO      ?= go
DEV     := scripts/dev.sh
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
# Exports RELAY_POSTGRES_DSN, RELAY_KAFKA_BROKERS and the RELAY_TEST_* twins for a recipe.
WITH_DEV_ENV := eval "$$($(DEV) env)" &&

BENCH   := cd bench &&
# The CloudEvents SDK's end-to-end test is a module of its own: the SDK's Kafka binding is
# built on sarama, and the product's module carries one Kafka client (franz-go).
CETEST  := cd cmd/outbox-relay/cloudeventstest &&

.PHONY: all build bench-build test test-short test-faults test-pg-matrix test-kafka dev-up dev-down dev-clean dev-env debezium-libs demo bench bench-soak bench-replay lint deploy-check clean

all: build

# Built as the release image builds it (Dockerfile): static, without the symbol table
# and DWARF (profiles still name functions: pclntab stays), so the bench measures the
# binary operators run: 1.3 MiB less RSS than a cgo build with symbols.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w $(LDFLAGS)" -o bin/outbox-relay ./cmd/outbox-relay

# The bench is a module of its own (bench/go.mod: its plotting stays out of the
# product's go.mod); bin/outbox-bench runs from the repository root, where its defaults
# (bin/outbox-relay, docs/bench) are.
bench-build:
	$(BENCH) $(GO) build -o ../bin/outbox-bench ./cmd/outbox-bench

# The integration tests need the dev servers: start them (a no-op when they run), and
# the Kafka Connect + Debezium jars that internal/testenv/debezium runs (cached).
# ./... stops at bench/go.mod and cmd/outbox-relay/cloudeventstest/go.mod: those modules'
# tests run after, on the same servers.
test: dev-up
	@$(DEV) debezium-libs
	$(WITH_DEV_ENV) $(GO) test -race -count=1 -timeout 40m ./...
	$(WITH_DEV_ENV) $(BENCH) $(GO) test -race -count=1 -timeout 10m ./...
	$(WITH_DEV_ENV) $(CETEST) $(GO) test -race -count=1 -timeout 10m ./...

# Unit tests only, in well under a minute: no servers and no Docker. Integration tests
# skip, naming `make dev-up` (testenv, under -short with no RELAY_TEST_* servers).
test-short:
	env -u RELAY_TEST_POSTGRES_DSN -u RELAY_TEST_KAFKA_BROKERS $(GO) test -short -count=1 ./...
	$(BENCH) env -u RELAY_TEST_POSTGRES_DSN -u RELAY_TEST_KAFKA_BROKERS $(GO) test -short -count=1 ./...
	$(CETEST) env -u RELAY_TEST_POSTGRES_DSN -u RELAY_TEST_KAFKA_BROKERS $(GO) test -short -count=1 ./...

# The fault-injection suite and the randomized hostile-data run in their full forms
# (`make test` runs reduced ones): the fault suite kills and pauses the dev servers, so it
# waits for other tests to leave them (testenv.Exclusive).
test-faults: dev-up
	$(WITH_DEV_ENV) RELAY_FAULTS=full $(GO) test -race -count=1 -timeout 90m -run 'TestFaultSuite|TestHighAvailability|TestSlotLoss|TestFailover|TestPrimaryFastShutdown|TestWALBufferKafkaOutage|TestWalsenderNeverBlocksCheckpoints' -v ./internal/faults
	$(WITH_DEV_ENV) RELAY_FAULTS=full $(GO) test -race -count=1 -timeout 60m -v ./internal/hostile
	$(WITH_DEV_ENV) RELAY_FAULTS=full $(GO) test -race -count=1 -timeout 20m -run 'TestRunMemory' -v ./cmd/outbox-relay

# The Postgres compatibility suite (scripts/pg-matrix.sh holds the selection) on each
# version of PG_MATRIX_VERSIONS (all of 13..18 by default): each runs as its own dev
# server (scripts/dev.sh pg-up N, binaries from Maven Central) beside the default one;
# Kafka is the dev broker. One PASS/FAIL line per version, with its time; fails if any failed.
PG_MATRIX_VERSIONS ?=
test-pg-matrix: dev-up
	@scripts/pg-matrix.sh $(PG_MATRIX_VERSIONS)

# The Kafka compatibility suite (scripts/kafka-matrix.sh holds the selection: sink/,
# end to end, exactly-once, the secure listeners) on each version of KAFKA_VERSIONS, or
# on KAFKA_VERSION alone (make test-kafka KAFKA_VERSION=4.4.0); by default the dev
# broker's 3.9.1 and the newest 4.x. Each version runs on a broker of its own
# (.dev/kafka-matrix/<version>, 127.0.0.1:19192 to 19196, jars from Maven Central) beside
# the dev servers, whose Postgres it uses. One PASS/FAIL line per version, with its time.
KAFKA_VERSIONS ?=
KAFKA_VERSION ?=
test-kafka: dev-up
	@scripts/kafka-matrix.sh $(KAFKA_VERSIONS) $(KAFKA_VERSION)

dev-up:
	@$(DEV) up

dev-down:
	@$(DEV) down

dev-clean:
	@$(DEV) clean

debezium-libs:
	@$(DEV) debezium-libs

# Use as: eval "$(make -s dev-env)"
dev-env:
	@$(DEV) env

demo:
	@scripts/demo.sh

# The workloads of docs/performance.md in one invocation (drains of 1,000- and 1-event
# transactions; 10,000 events/s in 100- and 1-event transactions), medians of -runs;
# BENCH_ARGS="-peers debezium" adds Debezium, BENCH_ARGS="-events 200000 -runs 1
# -duration 10s" is the quick form. Reports (report.json, report.md, plots) go to
# docs/bench/<time>/. The bench holds the dev servers shared for its whole
# run, as testenv's tests do (.dev/fault.lock): it waits while a fault test of a concurrent
# `go test` has a server stopped on purpose (dev-up would restart it), and no fault test
# stops one under it. -o: a server that `up` starts must not inherit the lock.
bench: build bench-build
	@mkdir -p .dev
	flock -o -s .dev/fault.lock bash -c '$(DEV) up && $(WITH_DEV_ENV) bin/outbox-bench $(BENCH_ARGS)'

# A soak (not in CI): the relay's drain capacity first, then the relay at half of it for
# SOAK (30m), RSS and commit→ack p99 per minute, appended to report.md and soak.jsonl as
# the minutes pass (soak.svg at the end); it ends at SOAK however far the producer got.
# PASS/FAIL on flat RSS, no p99 drift and every event delivered. BENCH_ARGS adds flags
# (-rate N skips the capacity drain). Same shared lock as bench.
SOAK ?= 30m
bench-soak: build bench-build
	@mkdir -p .dev
	flock -o -s .dev/fault.lock bash -c '$(DEV) up && $(WITH_DEV_ENV) bin/outbox-bench -soak $(SOAK) $(BENCH_ARGS)'

# A replay of 1,000,000 outbox rows through the binary: events/s, CPU and peak RSS (the
# test's log). make test runs the same test on 20,000 rows.
bench-replay: build dev-up
	$(WITH_DEV_ENV) RELAY_REPLAY_ROWS=$${RELAY_REPLAY_ROWS:-1000000} $(GO) test -count=1 -timeout 30m -v -run '^TestReplayLarge$$' ./internal/replay

lint:
	@files=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$files" ]; then echo "gofmt needed:"; echo "$$files"; exit 1; fi
	$(GO) vet ./...
	$(BENCH) $(GO) vet ./...
	$(CETEST) $(GO) vet ./...

# The Helm chart and the plain manifests in deploy/: helm lint, kubeconform against the
# Kubernetes schemas, a negative check, and deploy/kubernetes/outbox-relay.yaml up to date
# with the chart (scripts/validate-deploy.sh --update rewrites it). Offline; builds its
# pinned tools with go install the first time (~2 min), seconds after.
deploy-check:
	@scripts/validate-deploy.sh

clean:
	rm -rf bin docs/bench/tmp
