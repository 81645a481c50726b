package deploy

// More live alert cases (see alerts_live_test.go for how they run): the slot
// invalidated by max_slot_wal_keep_size on a private server, retention held
// back, replication pauses; alerts_decode_test.go has the decode error.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// privateSlotServer is a Postgres 15 server of the test's own (the shared dev
// server's max_slot_wal_keep_size must not change: other packages' slots live
// there), with 1 MB WAL segments so that a few megabytes of WAL fill and
// remove segments, no wal_keep_size (which would keep WAL the slot lost), and
// no checkpoint but the test's own (max_wal_size and checkpoint_timeout far
// away), so that the slot is invalidated when the test says.
func privateSlotServer(t *testing.T) *testenv.Node {
	t.Helper()
	prometheusBinary(t) // skip before making a server the test cannot use
	return testenv.NewServer(t, 15, testenv.ServerOptions{WALSegmentMB: 1, Conf: `wal_keep_size = 0
min_wal_size = 4MB
max_wal_size = 1GB
checkpoint_timeout = 1h
`})
}

// noiseWAL writes about mb MB of WAL that compresses badly into a table the
// relay does not read.
func (s *alertSlot) noiseWAL(t *testing.T, mb int) {
	t.Helper()
	s.pg.Exec(t, `CREATE TABLE IF NOT EXISTS wal_noise (b bytea)`)
	for range mb {
		s.pg.Exec(t, `INSERT INTO wal_noise SELECT decode(string_agg(md5(random()::text), ''), 'hex') FROM generate_series(1, 2000) g, generate_series(1, 30) h GROUP BY g`)
	}
}

// privateExec runs sql on the private server of srv as its superuser, over
// srv's own DSN: never testenv.SuperuserConn, which prefers the shared dev
// server's superuser, whose cluster-wide settings must not change.
func privateExec(t *testing.T, srv *testenv.Node, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, srv.DSN(""))
	if err != nil {
		t.Fatalf("connect to the private server: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// TestAlertsSlotAtRiskThenLost: a relay that cannot deliver (Kafka
// unreachable) with the WAL bound off holds its slot while other tables write
// WAL, on a private server whose max_slot_wal_keep_size is set to 8 MB while
// it runs (a SIGHUP setting). OutboxRelaySlotAtRisk fires once less than 4 MB
// can be written before the slot may be lost (the shipped 2 GB lowered to
// 4 MB in the test's copy: the test writes megabytes, not gigabytes), and the
// slot's WAL then becomes unreserved; a CHECKPOINT removes that WAL and
// invalidates the slot (wal_status lost): OutboxRelaySlotLost fires.
func TestAlertsSlotAtRiskThenLost(t *testing.T) {
	t.Parallel()
	rules, names := rulesCopy(t, override{"OutboxRelaySlotAtRisk", "< 2e9", "< 4e6"})
	srv := privateSlotServer(t)
	s := newAlertSlotOn(t, &testenv.PG{DSN: srv.DSN(""), AdminDSN: srv.DSN("postgres")}, "RELAY_POSTGRES_MAX_RETAINED_WAL=off")
	r := s.newAlertRelay(t, "r", "RELAY_KAFKA_BROKERS="+testenv.FreeAddr(t))
	p := startPrometheus(t, rules, len(names), r.addr)
	r.start(t)
	r.waitMetric(t, "outbox_relay_active", "1")
	// Undeliverable: the slot's position stays before them.
	s.insert(t, "order", 10, 100)
	privateExec(t, srv, `ALTER SYSTEM SET max_slot_wal_keep_size = '8MB'`)
	privateExec(t, srv, `SELECT pg_reload_conf()`)
	p.waitSeen(t, `outbox_relay_slot_safe_wal_size_bytes > bool 4e6`, "1")
	p.waitSeen(t, `outbox_relay_slot_wal_status{status="reserved"}`, "1")
	for _, a := range p.alerts(t) {
		if n := a.Labels["alertname"]; n == "OutboxRelaySlotAtRisk" || n == "OutboxRelaySlotLost" {
			t.Fatalf("more than 4 MB left before the slot may be lost: %s; want it silent", a)
		}
	}

	s.noiseWAL(t, 6)
	written := time.Now()
	// The slot is sampled every 10 s.
	const settle = 12 * time.Second
	p.waitFiring(t, "OutboxRelaySlotAtRisk", r.addr, written, settle)
	if f, ok := p.firing(t, "OutboxRelaySlotLost", ""); ok {
		t.Fatalf("the slot is at risk, not lost: %s", f)
	}
	s.noiseWAL(t, 6)
	p.waitSeen(t, `outbox_relay_slot_wal_status{status="unreserved"}`, "1")

	privateExec(t, srv, `CHECKPOINT`)
	lost := time.Now()
	var status string
	if err := s.queryRow(`SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, []any{s.slot}, &status); err != nil || status != "lost" {
		t.Fatalf("after CHECKPOINT the slot's wal_status is %q (%v); want lost", status, err)
	}
	p.waitFiring(t, "OutboxRelaySlotLost", "", lost, settle)
}

// TestAlertsRetentionBehind: with retention on (1 s, a round every second)
// and Kafka unreachable, no row is delivered, so no row may be deleted:
// outbox_relay_retention_lag_seconds, how long the oldest row past the
// retention has been due, grows with the rows' age and
// OutboxRelayRetentionBehind fires (its one-hour threshold lowered to 5 s in
// the test's copy, its 30m `for:` to testFor like every other).
func TestAlertsRetentionBehind(t *testing.T) {
	t.Parallel()
	rules, names := rulesCopy(t, override{"OutboxRelayRetentionBehind", "> 3600", "> 5"})
	s := newAlertSlot(t, "RELAY_OUTBOX_RETENTION=1s", "RELAY_OUTBOX_RETENTION_INTERVAL=1s")
	r := s.newAlertRelay(t, "r", "RELAY_KAFKA_BROKERS="+testenv.FreeAddr(t))
	p := startPrometheus(t, rules, len(names), r.addr)
	r.start(t)
	r.waitMetric(t, "outbox_relay_active", "1")
	p.waitSeen(t, `outbox_relay_retention_lag_seconds`, "0")
	s.insert(t, "order", 20, 100)
	// Due 1 s after their insert, over the threshold 5 s later.
	over := time.Now().Add(6 * time.Second)
	time.Sleep(time.Until(over))
	p.waitFiring(t, "OutboxRelayRetentionBehind", r.addr, over, 2*time.Second)
	var left int
	if err := s.queryRow(`SELECT count(*) FROM outbox`, nil, &left); err != nil || left != 20 {
		t.Errorf("RetentionBehind fired; the outbox holds %d rows (%v), want the 20 undelivered ones", left, err)
	}
}

// TestAlertsReplicationPausing: the relay's pipeline is held three times
// (the test locks the checkpoint table against writes, so no checkpoint is
// saved; with pipeline.max_in_flight_events 5 the pipeline stops taking
// batches once 5 events wait for one) while a producer inserts; after 5 s
// without a batch taken the stream pauses, and resumes when the lock goes.
// Two pauses are silent; the third fires OutboxRelayReplicationPausing.
func TestAlertsReplicationPausing(t *testing.T) {
	t.Parallel()
	rules, names := rulesCopy(t)
	s := newAlertSlot(t, "RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS=5")
	r := s.newAlertRelay(t, "r")
	p := startPrometheus(t, rules, len(names), r.addr)
	r.start(t)
	r.waitMetric(t, "outbox_relay_active", "1")
	p.waitSeen(t, `outbox_relay_replication_pauses_total`, "0")
	s.produce(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var third time.Time
	for i := 1; i <= 3; i++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE outbox_relay_checkpoint IN EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, fmt.Sprintf("pause %d", i), func() error {
			if got := r.metric("outbox_relay_replication_pauses_total"); got != fmt.Sprint(i) {
				return fmt.Errorf("replication_pauses_total = %q", got)
			}
			return nil
		})
		third = time.Now()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// Resumed: the pipeline took the batch and saves checkpoints again.
		r.waitMetric(t, "outbox_relay_ready", "1")
		if i == 2 {
			p.waitSeen(t, `outbox_relay_replication_pauses_total`, "2")
			time.Sleep(3 * scrapeEvery)
			if f, ok := p.firing(t, "OutboxRelayReplicationPausing", ""); ok {
				t.Fatalf("two pauses: %s; want it silent", f)
			}
		}
	}
	p.waitFiring(t, "OutboxRelayReplicationPausing", r.addr, third, time.Second)
}

// TestAlertsEveryRuleFiredLive: every rule of the shipped alerts.yaml is made
// to fire by one of the live tests of this package (a waitFiring call naming
// it), so that a rule added later without one fails here.
func TestAlertsEveryRuleFiredLive(t *testing.T) {
	_, names := rulesCopy(t)
	files, err := filepath.Glob("alerts_*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	fired := map[string]bool{}
	for _, m := range regexp.MustCompile(`waitFiring\(t, "(\w+)"`).FindAllStringSubmatch(src.String(), -1) {
		fired[m[1]] = true
	}
	// TestAlertsKafkaUnreachable fires these four in a loop over their names.
	for _, m := range regexp.MustCompile(`"(OutboxRelay\w+)"`).FindAllStringSubmatch(loopFired(t, src.String()), -1) {
		fired[m[1]] = true
	}
	// TestAlertsSlotLoss fires one per on_slot_loss mode, from its table.
	for _, m := range regexp.MustCompile(`\{"\w+", "(OutboxRelay\w+)"\}`).FindAllStringSubmatch(src.String(), -1) {
		fired[m[1]] = true
	}
	for _, n := range names {
		if !fired[n] {
			t.Errorf("no live test makes %s fire (deploy/alerts_*_test.go): add one that makes its condition true", n)
		}
	}
}

// loopFired is the list of names of the one loop that calls waitFiring(t,
// name, …) over a literal slice.
func loopFired(t *testing.T, src string) string {
	t.Helper()
	m := regexp.MustCompile(`for _, name := range \[\]string\{([^}]*)\} \{\s*p\.waitFiring\(t, name,`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("the loop of TestAlertsKafkaUnreachable over the alerts it fires is not found: update loopFired")
	}
	return m[1]
}
