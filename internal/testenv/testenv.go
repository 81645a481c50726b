// Package testenv is the one harness every integration test uses for real Postgres and
// real Kafka.
//
// Where the servers come from, decided once per test binary:
//
//  1. RELAY_TEST_POSTGRES_DSN / RELAY_TEST_KAFKA_BROKERS, as printed by
//     `make -s dev-env` for the servers of `make dev-up` (scripts/dev.sh). The fault
//     helpers (StopKafka, StartKafka, StopPostgres, StartPostgres) then run
//     scripts/dev.sh, found by walking up to the directory whose go.mod is the
//     product's (not the nested bench module's, bench/go.mod), for the dev
//     servers at RELAY_DEV_PG_PORT / RELAY_DEV_KAFKA_PORT; they refuse to act when the
//     DSN or brokers point at another port, so a foreign server is never stopped.
//  2. Otherwise testcontainers-go, when a Docker engine answers: one Postgres 15
//     (wal_level=logical) and one Kafka container per test binary, started on first
//     use on fixed loopback ports (so addresses survive a container restart) and
//     removed by the testcontainers reaper when the binary exits. The fault helpers
//     stop and start those containers.
//  3. Otherwise the test fails, naming `make dev-up` and `eval "$(make -s dev-env)"`.
//     Without -short integration tests never skip: a missing server is a failure.
//
// Under `go test -short` (`make test-short`) step 2 is left out: when the variable a
// test needs is unset, Postgres, Kafka and Exclusive skip the test at once, naming
// `make dev-up`, so a unit run needs no servers and no Docker. `make test` and CI do
// not pass -short and never skip.
//
// Isolation: Postgres gives each test its own database (dropped at cleanup together
// with its replication slots) and UniqueName gives unique topic, slot and publication
// names, so tests may run in parallel and packages may share the servers.
//
// Fault tests: a test that stops a server must call Exclusive(t) before anything else.
// Exclusive waits until no other test uses the servers, in this binary or in any other
// binary of `go test ./...` (packages run in parallel), and holds them until the test
// ends; Postgres and Kafka wait while a fault test runs or waits. Across processes this
// is an flock(2) on .dev/fault.lock at the repository root (shared by Postgres/Kafka,
// exclusive by Exclusive, with .dev/fault.lock.intent so that waiting fault tests are
// not starved); scripts/dev.sh takes the same lock exclusively when a person runs a
// fault helper by hand. A test must not call Exclusive after Postgres or Kafka: it
// would wait for itself, so that is reported as a failure instead.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	envPostgresDSN  = "RELAY_TEST_POSTGRES_DSN"
	envKafkaBrokers = "RELAY_TEST_KAFKA_BROKERS"

	defaultDevPGPort    = "54329"
	defaultDevKafkaPort = "19092"

	howToStart = "start the dev servers with `make dev-up` and export them with " +
		"`eval \"$(make -s dev-env)\"` (or run `make test`), or make a Docker engine available"
	howToRun = "to run it, start the dev servers with `make dev-up` and export them with " +
		"`eval \"$(make -s dev-env)\"`, or run `make test`"
)

var (
	repoRootOnce sync.Once
	repoRootDir  string

	lockOnce sync.Once
	lock     *faultLock
)

// repoRoot is the repository root (see rootFrom), found from the test's working
// directory (its package directory), or "" when there is none.
func repoRoot() string {
	repoRootOnce.Do(func() {
		if dir, err := os.Getwd(); err == nil {
			repoRootDir = rootFrom(dir)
		}
	})
	return repoRootDir
}

// rootModule is the module line of the repository root's go.mod.
const rootModule = "module github.com/outbox-relay/outbox-relay"

// rootFrom walks up from dir to the directory whose go.mod declares the product's
// module, or returns "". Not the first go.mod above dir: the bench is a nested module
// (bench/go.mod) whose tests run in bench/cmd/outbox-bench, and they must share
// .dev/fault.lock, the Postgres socket and scripts/dev.sh with every other test.
func rootFrom(dir string) string {
	for {
		if mod, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			for _, line := range strings.Split(string(mod), "\n") {
				if strings.TrimSpace(line) == rootModule {
					return dir
				}
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

func faultLocker() *faultLock {
	lockOnce.Do(func() {
		dir := filepath.Join(os.TempDir(), "outbox-relay-testenv")
		if root := repoRoot(); root != "" {
			dir = filepath.Join(root, ".dev")
		}
		lock = newFaultLock(filepath.Join(dir, "fault.lock"))
	})
	return lock
}

// useServers takes the shared fault lock for the test's lifetime.
func useServers(t testing.TB) {
	t.Helper()
	release, err := faultLocker().shared(t.Name())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(release)
}

// Exclusive makes t the only test using the servers, in this and every other test
// binary, until t ends. Call it first in any test that calls StopKafka, StartKafka,
// StopPostgres or StartPostgres. It blocks until running tests have finished with the
// servers.
func Exclusive(t testing.TB) {
	t.Helper()
	// Under -short with no servers at all, skip before waiting for the lock; with one
	// of them, Postgres or Kafka skips when the test asks for the other.
	if os.Getenv(envPostgresDSN) == "" && os.Getenv(envKafkaBrokers) == "" {
		skipUnlessServers(t, envPostgresDSN)
	}
	release, err := faultLocker().exclusive(t.Name())
	if err != nil {
		t.Fatalf("testenv: Exclusive: %v", err)
	}
	t.Cleanup(release)
}

func requireExclusive(t testing.TB, fn string) {
	t.Helper()
	if !faultLocker().holdsExclusive(t.Name()) {
		t.Fatalf("testenv: %s stops servers other tests use: call testenv.Exclusive(t) first", fn)
	}
}

// UniqueName returns a name unique to this call, made of prefix, the test's name and a
// random suffix: lower-case [a-z0-9_], starting with a letter, at most 63 bytes, so it
// is valid unquoted as a Postgres identifier (database, slot, publication, table) and
// as a Kafka topic.
func UniqueName(t testing.TB, prefix string) string {
	t.Helper()
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatalf("testenv: UniqueName: %v", err)
	}
	suffix := hex.EncodeToString(b[:])
	p := sanitize(prefix, 20)
	if p == "" || p[0] < 'a' || p[0] > 'z' {
		p = "t" + p
	}
	// 63 = prefix + "_" + test + "_" + suffix
	room := 63 - len(p) - len(suffix) - 2
	if n := sanitize(t.Name(), room); n != "" {
		return p + "_" + n + "_" + suffix
	}
	return p + "_" + suffix
}

// sanitize lower-cases s, turns runs of other characters than [a-z0-9] into one '_',
// trims '_' at both ends and cuts the result to at most max bytes.
func sanitize(s string, max int) string {
	var b strings.Builder
	under := false
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
			under = false
		} else if !under {
			b.WriteByte('_')
			under = true
		}
	}
	out := strings.Trim(b.String(), "_")
	if max < 0 {
		max = 0
	}
	if len(out) > max {
		out = strings.TrimRight(out[:max], "_")
	}
	return out
}

// ---------------------------------------------------------------- Postgres

// checkDevPort refuses to stop or start the dev server unless the tests' server is it.
func checkDevPort(t testing.TB, env, def, got string) {
	t.Helper()
	want := os.Getenv(env)
	if want == "" {
		want = def
	}
	if got != want {
		t.Fatalf("testenv: the test server's port %s is not the dev server's port %s (%s): "+
			"fault helpers only stop and start the servers of `make dev-up`", got, want, env)
	}
}

// runDev runs scripts/dev.sh cmd; the caller holds the fault lock, which the script
// would otherwise take itself.
func runDev(t testing.TB, cmd string) {
	t.Helper()
	root := repoRoot()
	if root == "" {
		t.Fatalf("testenv: %s: no go.mod above the working directory, cannot find scripts/dev.sh", cmd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	c := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "dev.sh"), cmd)
	c.Dir = root
	c.Env = append(os.Environ(), "RELAY_FAULT_LOCK_HELD=1")
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: scripts/dev.sh %s: %v\n%s", cmd, err, out)
	}
}
