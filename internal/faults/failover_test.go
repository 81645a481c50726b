package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The failover tests (issue 21): a primary and a streaming standby of their own
// (testenv.NewCluster), a producer writing throughout through a multi-host DSN, the
// relay binary connected with the same DSN (target_session_attrs=read-write), and the
// dev broker. The primary crashes, the standby is promoted; the relay must go on from
// what the new primary has, losing nothing and keeping per-aggregate order.
//
// The ledger is the surviving server's outbox table: with asynchronous replication a
// transaction committed on the old primary but never replicated is lost from the
// database itself, not by the relay. These tests run the standby synchronously
// (synchronous_standby_names), so that every transaction the producer saw commit is
// on the new primary too, and check that as well (the table holds what the producer
// counted).
//
// `make test` runs each with one failover; RELAY_FAULTS=full (`make test-faults`)
// with more events and longer production.

// failoverMode is how much a failover test does.
type failoverMode struct {
	name      string
	failovers int           // primary crashes, each followed by a promotion
	produce   time.Duration // producing before the first and after each failover
	rate      float64       // producer events per second
}

func failoverModeOf(t *testing.T) failoverMode {
	switch v := os.Getenv("RELAY_FAULTS"); v {
	case "full":
		return failoverMode{name: "full", failovers: 3, produce: 8 * time.Second, rate: 600}
	case "", "reduced":
		return failoverMode{name: "reduced", failovers: 1, produce: 3 * time.Second, rate: 300}
	default:
		t.Fatalf("RELAY_FAULTS=%q; want full, reduced or unset", v)
	}
	return failoverMode{}
}

// foRun is one failover test's world.
type foRun struct {
	t       *testing.T
	c       *testenv.Cluster
	kafka   *testenv.KafkaCluster
	bin     string
	prefix  string
	slot    string
	dsn     string // multi-host, primary first
	env     []string
	relays  []*relayProcess
	started time.Time
}

func newFORun(t *testing.T, version int, opts testenv.ClusterOptions, extraEnv ...string) *foRun {
	r := &foRun{t: t, started: time.Now()}
	r.bin = testenv.RelayBinary(t)
	r.c = testenv.NewCluster(t, version, opts)
	r.kafka = testenv.Kafka(t)
	r.prefix, r.slot = testenv.UniqueName(t, "fo"), testenv.UniqueName(t, "slot")
	for _, at := range aggregateTypes {
		r.kafka.CreateTopic(t, r.topic(at.name), 4)
	}
	r.dsn = r.c.MultiHostDSN("read-write", r.c.Primary, r.c.Standby)
	r.env = append(os.Environ(),
		"RELAY_POSTGRES_DSN="+r.dsn,
		"RELAY_KAFKA_BROKERS="+strings.Join(r.kafka.Brokers, ","),
		"RELAY_POSTGRES_SLOT="+r.slot,
		"RELAY_TOPICS_TEMPLATE="+r.prefix+".{aggregate_type}",
		"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS="+strconv.Itoa(window),
		"RELAY_POSTGRES_STATUS_INTERVAL=1s",
		"RELAY_CHECKPOINT_INTERVAL=100ms",
		"RELAY_METRICS_LISTEN=",
		"RELAY_LOG_FORMAT=json",
	)
	r.env = append(r.env, extraEnv...)
	t.Cleanup(func() {
		for i, p := range r.relays {
			if t.Failed() && !p.exited() {
				// A goroutine dump of a relay still running, for a stall.
				p.cmd.Process.Signal(syscall.SIGQUIT)
				p.wait(5 * time.Second)
			}
			p.kill()
			if t.Failed() {
				f, err := os.CreateTemp("", "outbox-relay-failover-*.log")
				if err == nil {
					f.WriteString(p.output())
					f.Close()
					t.Logf("relay %d output: %s; last lines:\n%s", i+1, f.Name(), lastLines(grepLines(p.output(), `"level"`), 40))
				}
			}
		}
	})
	return r
}

func (r *foRun) topic(aggregateType string) string { return r.prefix + "." + aggregateType }

func (r *foRun) logf(format string, args ...any) {
	r.t.Logf("[%6.1fs] %s", time.Since(r.started).Seconds(), fmt.Sprintf(format, args...))
}

// command runs an outbox-relay command to its end and returns its output and exit code.
func (r *foRun) command(args ...string) (string, int) {
	return r.commandEnv(nil, args...)
}

// commandEnv is command with more environment variables.
func (r *foRun) commandEnv(env []string, args ...string) (string, int) {
	cmd := exec.Command(r.bin, args...)
	cmd.Env = append(append([]string(nil), r.env...), env...)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		r.t.Fatalf("outbox-relay %s: %v", strings.Join(args, " "), err)
	}
	return string(out), code
}

// relayProcess is one `outbox-relay run`.
type relayProcess struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	err  error
}

func (p *relayProcess) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *relayProcess) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *relayProcess) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits up to d for the relay to exit and returns its exit code, -1 if it runs on.
func (p *relayProcess) wait(d time.Duration) int {
	select {
	case <-p.done:
	case <-time.After(d):
		return -1
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	return 0
}

func (p *relayProcess) kill() {
	if !p.exited() {
		p.cmd.Process.Kill()
		<-p.done
	}
}

func (r *foRun) startRelay() *relayProcess {
	p := &relayProcess{done: make(chan struct{})}
	p.cmd = exec.Command(r.bin, "run")
	p.cmd.Env = r.env
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		r.t.Fatalf("start outbox-relay run: %v", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	r.relays = append(r.relays, p)
	return p
}

// stopRelay stops a relay with SIGTERM and expects a clean exit after its drain.
func (r *foRun) stopRelay(p *relayProcess) {
	r.t.Helper()
	if p.exited() {
		r.t.Errorf("the relay exited before it was stopped (%v)\n%s", p.err, lastLines(p.output(), 30))
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(90 * time.Second); code != 0 {
		r.t.Errorf("relay stopped with SIGTERM: exit code %d; want 0 after its drain\n%s", code, lastLines(p.output(), 30))
	}
}

// setup runs `outbox-relay setup --create-outbox-table` and returns its output.
func (r *foRun) setup() string {
	out, code := r.command("setup", "--create-outbox-table")
	if code != 0 {
		r.t.Fatalf("outbox-relay setup: exit code %d\n%s", code, out)
	}
	return out
}

// waitSynced waits until node holds the relay's slot, synced from the primary.
func (r *foRun) waitSynced(n *testenv.Node) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var synced bool
		// Persistent, not only synced: a new synced slot stays temporary
		// (dropped at promotion) until the primary's slot has passed the
		// standby's own position and xmin, which takes the relay confirming.
		n.QueryRow(r.t, `SELECT count(*) = 1 FROM pg_replication_slots WHERE slot_name = $1 AND synced AND NOT temporary`, []any{r.slot}, &synced)
		if synced {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("slot %s not synced to %s after 2 minutes", r.slot, n.Name)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitConfirmedPast waits until the slot on n is confirmed past lsn, which only a
// relay streaming from n can do, and returns when that was.
func (r *foRun) waitConfirmedPast(n *testenv.Node, lsn pglogrepl.LSN, within time.Duration) time.Time {
	deadline := time.Now().Add(within)
	for {
		var confirmed string
		err := queryNode(n, `SELECT coalesce((SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1), '0/0')`, []any{r.slot}, &confirmed)
		if err == nil {
			if c, err := pglogrepl.ParseLSN(confirmed); err == nil && c > lsn {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the relay did not confirm past %s on %s within %s (slot confirmed %s, err %v)", lsn, n.Name, within, confirmed, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitDrained waits until the relay's checkpoint and slot on n are at or past the
// server's WAL position now (the producer has stopped).
func (r *foRun) waitDrained(n *testenv.Node) {
	var cur string
	n.QueryRow(r.t, `SELECT pg_current_wal_lsn()::text`, nil, &cur)
	target, _ := pglogrepl.ParseLSN(cur)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var slot, cp string
		err := queryNode(n, `SELECT
			(SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1),
			coalesce((SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1), '0/0')`, []any{r.slot}, &slot, &cp)
		if err == nil {
			sl, _ := pglogrepl.ParseLSN(slot)
			cl, _ := pglogrepl.ParseLSN(cp)
			if sl >= target && cl >= target {
				return
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("not drained on %s after 3 minutes: slot %s, checkpoint %s, want both >= %s (err %v)", n.Name, slot, cp, target, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func queryNode(n *testenv.Node, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.DSN(""))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// currentLSN is n's current WAL position.
func (r *foRun) currentLSN(n *testenv.Node) pglogrepl.LSN {
	var s string
	n.QueryRow(r.t, `SELECT pg_current_wal_lsn()::text`, nil, &s)
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		r.t.Fatal(err)
	}
	return lsn
}

// collect reads the outbox table of the surviving server n and every topic.
func (r *foRun) collect(n *testenv.Node) Input {
	t := r.t
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.DSN(""))
	if err != nil {
		t.Fatalf("connect to %s: %v", n.Name, err)
	}
	defer conn.Close(context.Background())
	in := Input{Topic: r.topic}
	rows, err := conn.Query(ctx, `SELECT id::text, aggregate_type, aggregate_id, payload::text, coalesce((payload->>'seq')::int, 0) FROM outbox`)
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	in.Rows, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (Row, error) {
		var o Row
		return o, row.Scan(&o.ID, &o.AggregateType, &o.AggregateID, &o.Payload, &o.Seq)
	})
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	for _, at := range aggregateTypes {
		for _, m := range r.kafka.ReadAll(t, r.topic(at.name)) {
			d := Delivery{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)}
			for _, h := range m.Headers {
				if h.Key == "id" {
					d.ID = string(h.Value)
				}
			}
			in.Delivered = append(in.Delivered, d)
		}
	}
	rows, err = conn.Query(ctx, `SELECT coalesce(event_id, event_key), status, coalesce(last_error, '') FROM outbox_relay_retry`)
	if err != nil {
		t.Fatalf("read retry table: %v", err)
	}
	in.Retry, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (RetryRow, error) {
		var rr RetryRow
		return rr, row.Scan(&rr.EventID, &rr.Status, &rr.LastError)
	})
	if err != nil {
		t.Fatalf("read retry table: %v", err)
	}
	for _, rr := range in.Retry {
		in.RetryInserted = append(in.RetryInserted, rr.EventID)
	}
	return in
}

// assertLedger checks Kafka against the surviving server's outbox table: nothing
// lost, per-aggregate order, every message an event of that table; duplicates are
// logged and bounded by bound.
func (r *foRun) assertLedger(n *testenv.Node, ps *producerStats, bound int, recoveries []time.Duration) Report {
	t := r.t
	in := r.collect(n)
	rep := Check(in)
	t.Logf("failover report (%s): %d events in the surviving server's outbox table, %d delivered, %d messages; LOST %d (want 0), DUPLICATES %d (want <= %d), ORDER violations %d (want 0), mismatches %d (want 0); time to recover per failover %v",
		n.Name, rep.Events, rep.Delivered, rep.Messages, rep.Lost, rep.Duplicates, bound, rep.OrderViolations, rep.Mismatches, recoveries)
	if ps != nil {
		if rep.Events != ps.Events {
			t.Errorf("the surviving server's outbox table holds %d events; the producer counted %d committed: with synchronous replication every commit must survive the failover", rep.Events, ps.Events)
		}
		if gaps := seqAnomalies(in.Rows); gaps != "" {
			t.Errorf("sequence numbers in the outbox table are not 1..n per aggregate: %s", gaps)
		}
	}
	if rep.Events == 0 {
		t.Errorf("no events in the outbox table: the producer wrote nothing")
	}
	if rep.Lost != 0 {
		t.Errorf("LOST %d events (in the surviving server's outbox table, not in Kafka); want 0", rep.Lost)
	}
	if rep.OrderViolations != 0 {
		t.Errorf("%d per-aggregate ORDER violations after dropping repeats; want 0", rep.OrderViolations)
	}
	if rep.Mismatches != 0 {
		t.Errorf("%d messages differ from their outbox row or have none (an event of another server's history?); want 0", rep.Mismatches)
	}
	if rep.NonPoisonRetries != 0 || len(in.Retry) != 0 {
		t.Errorf("%d rows in the retry table; want 0 (no event failed on its own)", len(in.Retry))
	}
	if rep.Duplicates > bound {
		t.Errorf("%d DUPLICATES; want at most %d", rep.Duplicates, bound)
	}
	if len(rep.Problems) > 0 {
		t.Errorf("first problems:\n  %s", strings.Join(rep.Problems, "\n  "))
	}
	return rep
}

// runProducer starts the producer on the multi-host DSN (it follows the primary as the
// relay does) and returns a stop function that waits for it and returns its stats.
func (r *foRun) runProducer(rate float64) func() producerStats {
	prod := newProducer(r.dsn, uint64(time.Now().UnixNano()), rate)
	prod.poisonP = 0 // these tests are about the slot: no event fails on its own
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- prod.Run(ctx) }()
	var once sync.Once
	var stats producerStats
	stop := func() producerStats {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				r.t.Errorf("producer: %v", err)
			}
			stats = prod.Stats()
			r.logf("producer stopped: %d transactions, %d events (%d failed with the outcome unknown: %d committed after all; %d reconnects)",
				stats.Transactions, stats.Events, stats.Failed, stats.UnknownCommitted, stats.Reconnects)
		})
		return stats
	}
	r.t.Cleanup(func() { stop() })
	return stop
}

// failover crashes the current primary, promotes the standby and waits until the
// relay confirms a position on the new primary past the promotion. It returns the
// time from the crash to that confirmation.
func (r *foRun) failover(primary, standby *testenv.Node) time.Duration {
	crash := time.Now()
	primary.Crash(r.t)
	standby.Promote(r.t)
	promoted := r.currentLSN(standby)
	r.logf("%s crashed (immediate stop), %s promoted in %s at %s", primary.Name, standby.Name, time.Since(crash).Round(time.Millisecond), promoted)
	at := r.waitConfirmedPast(standby, promoted, 2*time.Minute)
	d := at.Sub(crash)
	r.logf("the relay confirmed past the promotion on %s %s after the crash", standby.Name, d.Round(time.Millisecond))
	return d
}

// assertNoRefill checks that the relay went on from the synced slot: no gap, no
// refill, one process throughout.
func (r *foRun) assertNoRefill(p *relayProcess) {
	out := p.output()
	for _, bad := range []string{"does not continue from the checkpoint", "refill", "slot_gap"} {
		if strings.Contains(out, bad) {
			r.t.Errorf("relay output contains %q; want the relay to continue from the synced slot without a gap or a refill:\n%s", bad, lastLines(grepLines(out, bad), 5))
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// setupFailoverSlot runs setup for a Postgres 17 cluster with postgres.failover:
// the slot is created with FAILOVER.
func (r *foRun) setupFailoverSlot() {
	out := r.setup()
	if !strings.Contains(out, "created (pgoutput, failover)") {
		r.t.Fatalf("outbox-relay setup with postgres.failover: output lacks %q:\n%s", "created (pgoutput, failover)", out)
	}
}

// checkFailoverReady waits (the relay running) until the standby holds the slot
// synced and persistent, then expects check to find both sides in order.
func (r *foRun) checkFailoverReady() {
	r.waitSynced(r.c.Standby)
	out, code := r.command("check")
	if code != 0 {
		r.t.Fatalf("outbox-relay check: exit code %d; want 0\n%s", code, out)
	}
	for _, want := range []string{
		"ok    failover slot: " + r.slot + " has failover = true",
		"ok    synchronized_standby_slots: names " + r.c.StandbySlot,
		fmt.Sprintf("ok    failover standby 127.0.0.1:%d: syncs slot %s", r.c.Standby.Port, r.slot),
	} {
		if !strings.Contains(out, want) {
			r.t.Errorf("outbox-relay check: output lacks %q:\n%s", want, out)
		}
	}
}

// TestFailoverSlot is scenario (b): Postgres 17, a failover slot, the standby's
// physical slot in synchronized_standby_slots and sync_replication_slots on the
// standby. The primary crashes and the standby is promoted while the producer writes:
// the running relay reconnects through the multi-host DSN to the new primary and goes
// on from the synced slot without a gap and without a refill, its checkpoint skipping
// what it had delivered. In the full form the old primary is rebuilt as a standby of
// the new one and the roles swap again, three failovers in all.
func TestFailoverSlot(t *testing.T) {
	m := failoverModeOf(t)
	r := newFORun(t, 17, testenv.ClusterOptions{Synchronous: true, FailoverSlots: true}, "RELAY_POSTGRES_FAILOVER=true")
	r.logf("%s mode: %d failover(s), Postgres 17 primary :%d, standby :%d", m.name, m.failovers, r.c.Primary.Port, r.c.Standby.Port)
	r.setupFailoverSlot()
	relay := r.startRelay()
	stop := r.runProducer(m.rate)
	r.checkFailoverReady()
	time.Sleep(m.produce)

	primary, recoveries := r.failovers(m, relay, true)
	ps := stop()
	r.waitDrained(primary)
	r.stopRelay(relay)
	r.assertNoRefill(relay)
	// The relay resends at most what was not yet covered by a checkpoint the new
	// primary has: one window per failover.
	r.assertLedger(primary, &ps, m.failovers*window, recoveries)
}

// failovers runs m.failovers failovers under a running relay, with m.produce of
// production before each rebuild and after each failover, and returns the
// primary at the end and each failover's time to recover. With synced, a rebuilt
// standby is waited for until it holds the relay's slot synced.
func (r *foRun) failovers(m failoverMode, relay *relayProcess, synced bool) (*testenv.Node, []time.Duration) {
	t := r.t
	primary, standby := r.c.Primary, r.c.Standby
	var recoveries []time.Duration
	for i := 0; i < m.failovers; i++ {
		if i > 0 {
			// The old primary comes back as a standby of the new one (a cold
			// copy: the test's stand-in for pg_rewind).
			r.c.Rebuild(t, standby, primary)
			if synced {
				r.waitSynced(standby)
			}
			r.logf("%s rebuilt as a standby of %s", standby.Name, primary.Name)
			time.Sleep(m.produce)
		}
		recoveries = append(recoveries, r.failover(primary, standby))
		primary, standby = standby, primary
		time.Sleep(m.produce)
		if relay.exited() {
			t.Fatalf("the relay exited after failover %d (%v); want it to go on\n%s", i+1, relay.err, lastLines(relay.output(), 30))
		}
	}
	return primary, recoveries
}

// TestFailoverRefill is scenario (a): Postgres 15 has no failover slots, so the
// promoted standby has no slot. The running relay (postgres.on_slot_loss: refill)
// reconnects through the multi-host DSN, finds the slot missing (slot_missing),
// creates it, re-delivers from the outbox table every row its checkpoint does not
// cover, and streams on: nothing lost, order kept, duplicates bounded by the
// checkpoint history interval (1s here) and the in-flight window.
func TestFailoverRefill(t *testing.T) {
	m := failoverModeOf(t)
	r := newFORun(t, 15, testenv.ClusterOptions{Synchronous: true},
		"RELAY_POSTGRES_ON_SLOT_LOSS=refill", "RELAY_CHECKPOINT_HISTORY_INTERVAL=1s")
	r.logf("%s mode: %d failover(s), Postgres 15 primary :%d, standby :%d", m.name, m.failovers, r.c.Primary.Port, r.c.Standby.Port)
	r.setup()
	// Failover slots do not exist on 15: postgres.failover is refused, naming refill.
	failoverOn := []string{"RELAY_POSTGRES_FAILOVER=true"}
	for _, args := range [][]string{{"check"}, {"setup"}, {"run"}} {
		out, code := r.commandEnv(failoverOn, args...)
		if code == 0 || !strings.Contains(out, "Postgres 15") || !strings.Contains(out, "postgres.on_slot_loss: refill") {
			t.Errorf("outbox-relay %s with postgres.failover on Postgres 15: exit code %d; want non-zero, naming Postgres 15 and postgres.on_slot_loss: refill:\n%s",
				args[0], code, lastLines(out, 5))
		}
	}
	relay := r.startRelay()
	stop := r.runProducer(m.rate)
	time.Sleep(m.produce)
	primary, recoveries := r.failovers(m, relay, false)
	ps := stop()
	r.waitDrained(primary)
	r.stopRelay(relay)
	refills := refillLines(relay.output())
	r.logf("refills: %v", refills)
	if len(refills) != m.failovers {
		t.Errorf("%d refills logged; want %d, one per failover (the promoted standby has no slot)", len(refills), m.failovers)
	}
	for _, l := range refills {
		if !strings.HasPrefix(l, "slot_missing:") {
			t.Errorf("refill %q; want cause slot_missing", l)
		}
	}
	// A refill resends from the last history row at or before the checkpoint
	// (at most 1s of events here) and what was in flight.
	bound := m.failovers * (window + int(2*m.rate))
	r.assertLedger(primary, &ps, bound, recoveries)
}

// TestFailoverSplitBrain is scenario (e): after a failover the old primary comes back
// as a primary (both accept writes) with events of its own. A running relay whose
// reconnection lands on it sees the timeline go back and exits 4 naming the cause; a
// relay started then is refused as well (another host of its DSN superseded the
// server, exit 4); neither streams from it. With the old primary stopped again, the
// relay delivers everything of the new primary.
func TestFailoverSplitBrain(t *testing.T) {
	m := failoverModeOf(t)
	r := newFORun(t, 17, testenv.ClusterOptions{Synchronous: true, FailoverSlots: true}, "RELAY_POSTGRES_FAILOVER=true")
	r.logf("%s mode, Postgres 17 primary :%d, standby :%d", m.name, r.c.Primary.Port, r.c.Standby.Port)
	r.setupFailoverSlot()
	relay := r.startRelay()
	stop := r.runProducer(m.rate)
	r.checkFailoverReady()
	time.Sleep(m.produce)
	recovered := r.failover(r.c.Primary, r.c.Standby)
	time.Sleep(m.produce)
	ps := stop()

	// The old primary comes back as it was: a second primary, behind the DSN's first host.
	old, cur := r.c.Primary, r.c.Standby
	old.Start(t)
	var oldSlot string
	old.QueryRow(t, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, []any{r.slot}, &oldSlot)
	// Events only the old primary has: they must never reach Kafka.
	// (Its synchronous_standby_names would hold a commit for ever: the
	// standby it waits for is the new primary. An application with
	// asynchronous replication commits there at once; so does this one.)
	old.Exec(t, "", `BEGIN; SET LOCAL synchronous_commit = local;
		INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'Order', 'split-brain', 'Written', jsonb_build_object('seq', g) FROM generate_series(1, 20) g;
		COMMIT`)
	r.logf("old primary back as a second primary, its slot at %s; 20 events written to it", oldSlot)

	// The running relay's next connection lands on the old primary (first host).
	cur.Exec(t, "", `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, r.slot)
	code := relay.wait(2 * time.Minute)
	if code != 4 {
		t.Fatalf("running relay reconnecting to the old primary: exit code %d; want 4 (refused, with the reason)\n%s", code, lastLines(relay.output(), 30))
	}
	if out := relay.output(); !strings.Contains(out, "timeline_forked") && !strings.Contains(out, "timeline") {
		t.Errorf("running relay refused the old primary without naming the timeline:\n%s", lastLines(out, 10))
	}
	r.logf("running relay refused the old primary: exit 4; its last line: %s", lastLines(relay.output(), 1))

	// A relay started now reaches the old primary first and is refused too.
	fresh := r.startRelay()
	code = fresh.wait(2 * time.Minute)
	if code != 4 {
		t.Fatalf("relay started during the split brain: exit code %d; want 4\n%s", code, lastLines(fresh.output(), 30))
	}
	if out := fresh.output(); !strings.Contains(out, "old primary") {
		t.Errorf("relay started during the split brain: output does not say the server is an old primary:\n%s", lastLines(out, 10))
	}
	r.logf("relay started during the split brain refused: exit 4; its last line: %s", lastLines(fresh.output(), 1))
	var after string
	old.QueryRow(t, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, []any{r.slot}, &after)
	if after != oldSlot {
		t.Errorf("the old primary's slot moved from %s to %s: a relay streamed from it", oldSlot, after)
	}

	// The operator stops the old primary: the relay goes to the new one and delivers
	// everything it has (and nothing of the old primary's own events).
	old.Crash(t)
	final := r.startRelay()
	r.waitDrained(cur)
	r.stopRelay(final)
	r.assertLedger(cur, &ps, window, []time.Duration{recovered})
}
