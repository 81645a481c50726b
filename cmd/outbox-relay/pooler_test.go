package main

import (
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestPgBouncer runs the relay with postgres.dsn on a real PgBouncer, in
// transaction and in session mode, and postgres.replication_dsn on Postgres
// itself: setup, check, run (every event delivered, in order) and lag work
// through it. With the replication connection on PgBouncer too, check and
// run say that a pooler is in the way and name postgres.replication_dsn,
// not pg_hba.conf (issue 37, item 7).
func TestPgBouncer(t *testing.T) {
	testenv.PgBouncerBinary(t)
	for _, mode := range []string{"transaction", "session"} {
		t.Run(mode, func(t *testing.T) {
			direct, slot := dbEnv(t)
			pooled := testenv.PgBouncer(t, direct, mode)
			aggType, topic, k := relayTopic(t, "Pool")
			t.Setenv("RELAY_POSTGRES_DSN", pooled)
			t.Setenv("RELAY_POSTGRES_REPLICATION_DSN", direct)

			setUp(t)
			code, out, errOut := run(t, "check")
			if code != exitcode.OK {
				t.Fatalf("check through pgbouncer (%s mode) = exit %d; want 0\n%s%s", mode, code, out, errOut)
			}
			testenv.WantLines(t, "check", out, "ok    replication connection")

			// Before the relay starts, and while it runs: checkpoint
			// saves through the pooler, many transactions apart.
			ids := insertEvents(t, direct, aggType, 20, 0)
			p := startRelay(t)
			ids = append(ids, insertEvents(t, direct, aggType, 20, 0)...)
			waitDelivered(t, k, topic, ids, "through pgbouncer")
			assertOrder(t, k, topic, ids)
			waitCheckpoint(t, direct, slot, walNow(t, direct).String(), &testenv.Output{}, time.Minute)

			code, out, errOut = run(t, "lag")
			if code != exitcode.OK {
				t.Errorf("lag through pgbouncer (%s mode) = exit %d; want 0\n%s%s", mode, code, out, errOut)
			}
			if strings.Contains(out+errOut, "unsupported startup parameter") {
				t.Errorf("lag sent a startup parameter pgbouncer refuses:\n%s%s", out, errOut)
			}
			p.stop(t)

			// Misconfigured: the replication connection through pgbouncer.
			unsetenv(t, "RELAY_POSTGRES_REPLICATION_DSN")
			const advice = "connection pooler (PgBouncer?), which cannot carry logical replication: set postgres.replication_dsn"
			code, out, errOut = run(t, "check")
			if code == exitcode.OK {
				t.Errorf("check with the replication connection through pgbouncer = exit 0; want a failure\n%s", out)
			}
			testenv.WantLines(t, "check", out, "FAIL  replication connection", advice)
			if strings.Contains(out, "allow it in pg_hba.conf") {
				t.Errorf("check advises editing pg_hba.conf for a pooler:\n%s", out)
			}
			code, out, errOut = runWithin(t, time.Minute, "run")
			if code == exitcode.OK {
				t.Errorf("run with the replication connection through pgbouncer = exit 0; want a failure")
			}
			testenv.WantLines(t, "run", out+errOut, advice)
		})
	}
}

// runWithin is run, failing the test when the command has not returned
// within d.
func runWithin(t *testing.T, d time.Duration, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	go func() {
		var o, e testenv.Output
		c := execute(args, &o, &e)
		done <- result{c, o.String(), e.String()}
	}()
	select {
	case r := <-done:
		return r.code, r.out, r.err
	case <-time.After(d):
		t.Fatalf("outbox-relay %s did not return within %s", strings.Join(args, " "), d)
		return 0, "", ""
	}
}

// assertOrder checks that the first copy of each id in topic comes in the
// order of ids (one aggregate, one partition: the order users rely on).
func assertOrder(t *testing.T, k *testenv.KafkaCluster, topic string, ids []string) {
	t.Helper()
	seen := map[string]bool{}
	var got []string
	for _, m := range k.ReadAll(t, topic) {
		for _, h := range m.Headers {
			if h.Key == "id" && !seen[string(h.Value)] {
				seen[string(h.Value)] = true
				got = append(got, string(h.Value))
			}
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("order of first copies in %s = %v; want %v", topic, got, ids)
	}
}
