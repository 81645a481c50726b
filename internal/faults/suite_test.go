package faults

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// termUptime is how long the relay runs before a SIGTERM: a signal that arrives before
// the process has installed its handler (its first milliseconds) kills it with the
// default action, which no process can prevent and which is not the drain under test.
const termUptime = time.Second

// window is the relay's pipeline.max_in_flight_events: the most one crash may resend.
const window = 1000

// faultKind is one kind of fault the suite injects.
type faultKind string

const (
	relayKill  faultKind = "relay SIGKILL"
	relayTerm  faultKind = "relay SIGTERM"
	kafkaKill  faultKind = "Kafka kill -9"
	kafkaPause faultKind = "Kafka SIGSTOP"
	pgCrash    faultKind = "Postgres immediate stop"
	pgCut      faultKind = "Postgres network cut"
)

var kinds = []faultKind{relayKill, relayTerm, kafkaKill, kafkaPause, pgCrash, pgCut}

// mode is the size of a run: how many faults of each kind and how long things last.
type mode struct {
	name     string
	faults   map[faultKind]int
	gap      [2]time.Duration // healthy time between faults
	down     [2]time.Duration // how long a server stays killed, stopped or cut
	pause    time.Duration    // how long Kafka stays frozen
	killMid  float64          // chance of also killing the relay in the middle of an outage
	rate     float64          // producer events per second
	drainMax time.Duration
}

var (
	reduced = mode{
		name: "reduced",
		faults: map[faultKind]int{
			relayKill: 10, relayTerm: 1, kafkaKill: 1, kafkaPause: 1, pgCrash: 1, pgCut: 1,
		},
		gap: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}, down: [2]time.Duration{time.Second, 3 * time.Second},
		pause: 10 * time.Second, killMid: 0.25, rate: 500, drainMax: 5 * time.Minute,
	}
	full = mode{
		name: "full",
		faults: map[faultKind]int{
			relayKill: 40, relayTerm: 3, kafkaKill: 5, kafkaPause: 4, pgCrash: 5, pgCut: 6,
		},
		gap: [2]time.Duration{time.Second, 6 * time.Second}, down: [2]time.Duration{time.Second, 8 * time.Second},
		pause: 10 * time.Second, killMid: 0.4, rate: 600, drainMax: 10 * time.Minute,
	}
)

func (m mode) between(rng *mrand.Rand, r [2]time.Duration) time.Duration {
	return r[0] + time.Duration(rng.Int64N(int64(r[1]-r[0])+1))
}

// suite is one run's state.
type suite struct {
	t      *testing.T
	m      mode
	rng    *mrand.Rand
	began  time.Time
	pg     *testenv.PG
	kafka  *testenv.KafkaCluster
	pool   *pgxpool.Pool
	prefix string
	slot   string // the relay's pgoutput slot
	probe  string // the test_decoding slot that tells commit end LSNs
	proxy  *Proxy
	sup    *supervisor

	messages   bool              // events are logical decoding messages, the outbox table their archive
	eos        bool              // delivery: exactly-once, read read_committed
	count      map[faultKind]int // faults injected
	midKills   int               // relay kills in the middle of an outage (also in count[relayKill])
	kafkaDown  bool
	kafkaFroze bool
	pgDown     bool
}

func (s *suite) logf(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("%7.1fs  "+format, append([]any{time.Since(s.began).Seconds()}, args...)...)
}

// TestFaultSuite runs a producer and the relay binary while faults hit the relay,
// Kafka and Postgres in a seeded random order, then checks that every committed event
// reached Kafka or the retry table, in order per aggregate, with bounded duplicates.
// See the package doc for the modes and the bounds.
func TestFaultSuite(t *testing.T) { faultSuite(t, false) }

// TestFaultSuiteExactlyOnce is TestFaultSuite with delivery: exactly-once,
// read as a read_committed consumer reads: the same faults, lost 0, order
// violations 0, and duplicates 0 (only messages the relay marks at least once
// may repeat, counted apart: the retry table's).
func TestFaultSuiteExactlyOnce(t *testing.T) { faultSuite(t, true) }

// faultSuite runs the suite of a table outbox in the mode RELAY_FAULTS names.
func faultSuite(t *testing.T, eos bool) {
	testenv.Exclusive(t)
	m := reduced
	if v := os.Getenv("RELAY_FAULTS"); v == "full" {
		m = full
	} else if v != "" && v != "reduced" {
		t.Fatalf("RELAY_FAULTS=%q; want full, reduced or unset", v)
	}
	runFaultSuite(t, m, false, eos)
}

// messagesMode is the run of TestFaultSuiteMessages: the relay's own faults
// and cuts of its network to Postgres (an in-process proxy), which need no
// server to themselves.
var messagesMode = mode{
	name:   "messages",
	faults: map[faultKind]int{relayKill: 8, relayTerm: 1, pgCut: 1},
	gap:    [2]time.Duration{500 * time.Millisecond, 2 * time.Second}, down: [2]time.Duration{time.Second, 3 * time.Second},
	killMid: 0.25, rate: 500, drainMax: 5 * time.Minute,
}

// TestFaultSuiteMessages is the fault suite of a table-less outbox
// (outbox.source: messages): the producer emits each event as a
// transactional logical decoding message and, in the same statement, writes
// it to an archive table the publication does not cover, which the checker
// reads as the truth (the archive docs/outbox-table.md recommends). Every
// guarantee of the table outbox is checked the same way.
func TestFaultSuiteMessages(t *testing.T) {
	m := messagesMode
	if os.Getenv("RELAY_FAULTS") == "full" {
		m.faults = map[faultKind]int{relayKill: 30, relayTerm: 3, pgCut: 5}
	}
	runFaultSuite(t, m, true, false)
}

// runFaultSuite is one run of the fault suite; with messages, events are
// logical decoding messages (see TestFaultSuiteMessages); with eos, delivery
// is exactly-once, read read_committed.
func runFaultSuite(t *testing.T, m mode, messages, eos bool) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RELAY_FAULTS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("RELAY_FAULTS_SEED=%q: %v; want an unsigned integer", v, err)
		}
	}
	t.Logf("fault suite: %s mode, %s, seed %d (replay the fault order with RELAY_FAULTS_SEED=%d)", m.name, delivery(eos), seed, seed)

	s := &suite{t: t, m: m, rng: mrand.New(mrand.NewPCG(seed, 1)), began: time.Now(), count: map[faultKind]int{}, messages: messages, eos: eos}
	bin := testenv.RelayBinary(t)
	s.prepare("f")
	for _, at := range aggregateTypes {
		s.kafka.CreateTopic(t, s.topic(at.name), 4)
	}

	// Whatever happens, every server runs again before testenv's cleanups (which drop
	// the database) and before other tests get the servers back: defers run before
	// cleanups, also after t.Fatal.
	defer s.restoreServers()

	target, err := hostPort(s.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	s.proxy, err = Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	relayLog, err := os.CreateTemp("", "outbox-relay-faults-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer relayLog.Close()
	t.Logf("relay output: %s", relayLog.Name())
	env := os.Environ()
	if messages {
		env = append(env, "RELAY_OUTBOX_SOURCE=messages")
	}
	s.sup = &supervisor{bin: bin, log: relayLog, reqs: make(chan signalReq), env: append(env,
		"RELAY_POSTGRES_DSN="+withHostPort(s.pg.DSN, s.proxy.Addr()),
		"RELAY_KAFKA_BROKERS="+strings.Join(s.kafka.Brokers, ","),
		"RELAY_POSTGRES_SLOT="+s.slot,
		"RELAY_TOPICS_TEMPLATE="+s.prefix+".{aggregate_type}",
		"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS="+strconv.Itoa(window),
		"RELAY_KAFKA_BATCH_BYTES="+strconv.Itoa(largePayloadLimit),
		"RELAY_POSTGRES_STATUS_INTERVAL=1s",
		"RELAY_CHECKPOINT_INTERVAL=100ms",
		"RELAY_METRICS_LISTEN=",
		"RELAY_LOG_FORMAT=json",
	)}
	s.sup.env = append(s.sup.env, s.deliveryEnv()...)
	prod := newProducer(s.pg.DSN, seed, m.rate)
	prod.messages = messages

	// Three goroutines with owners: the proxy and the relay supervisor until the end
	// (services), the producer until the faults are over.
	svcCtx, stopSvc := context.WithCancel(context.Background())
	services, _ := errgroup.WithContext(svcCtx)
	services.Go(func() error { return s.proxy.Serve(svcCtx) })
	services.Go(func() error { return s.sup.Run(svcCtx) })
	stopProducer := prod.start(t)
	defer func() {
		// Servers first: the producer keeps settling its last transaction while
		// Postgres is down.
		s.restoreServers()
		stopProducer()
		stopSvc()
		if err := services.Wait(); err != nil {
			t.Errorf("proxy or relay supervisor: %v", err)
		}
		if t.Failed() {
			t.Logf("last relay output:\n%s", s.sup.lastTail)
		}
	}()

	// Warm up: the relay streams before the first fault.
	time.Sleep(3 * time.Second)
	for i, k := range s.plan() {
		s.inject(i, k)
		time.Sleep(m.between(s.rng, m.gap))
	}

	stopProducer()
	ps := prod.Stats()
	s.logf("producer stopped: %d transactions, %d events, %d poison", ps.Transactions, ps.Events, ps.Poison)
	// The relay is restarted normally (a clean stop, then a start) and must drain.
	e, err := s.sup.Signal(context.Background(), syscall.SIGTERM, termUptime, 0)
	if err != nil {
		t.Fatal(err)
	}
	if e.asked != "" && !exitedCleanly(e.err) {
		t.Errorf("final SIGTERM: relay exited with %v; want exit status 0 after draining\n%s", e.err, e.tail)
	}
	last := s.lastOutboxCommit()
	s.logf("waiting for the relay to confirm %s (the last outbox commit) and for no pending retry row", last)
	s.waitDrained(last)
	s.logf("drained")

	in := s.collect()
	rep := Check(in)
	unexpected := s.sup.Unexpected()
	kills := s.count[relayKill] + len(unexpected)
	allowance := window * (s.count[kafkaKill] + 2*s.count[kafkaPause])
	bound := kills*window + allowance
	if eos {
		bound = 0
	}
	s.report(seed, ps, rep, unexpected, bound)

	if rep.Events != ps.Events+ps.Poison {
		t.Errorf("outbox table holds %d events; the producer counted %d committed (%d + %d poison): its commit bookkeeping is wrong",
			rep.Events, ps.Events+ps.Poison, ps.Events, ps.Poison)
	}
	if gaps := seqAnomalies(in.Rows); gaps != "" {
		t.Errorf("sequence numbers in the outbox table are not 1..n per aggregate (the producer misjudged a commit): %s", gaps)
	}
	if rep.Poison == 0 {
		t.Errorf("no poison event was committed; want some (raise the chance or the run length)")
	}
	if rep.Lost != 0 {
		t.Errorf("LOST %d events (in the outbox table, neither in Kafka nor in the retry table with a reason); want 0", rep.Lost)
	}
	if rep.OrderViolations != 0 {
		t.Errorf("%d per-aggregate ORDER violations after dropping repeats; want 0", rep.OrderViolations)
	}
	if rep.NonPoisonRetries != 0 {
		t.Errorf("%d retry rows written for events that are not poison (only broker outages happened to them); want 0", rep.NonPoisonRetries)
	}
	if rep.PoisonWrong != 0 {
		t.Errorf("%d poison events not dead in the retry table with their reason; want 0", rep.PoisonWrong)
	}
	if rep.Mismatches != 0 {
		t.Errorf("%d messages differ from their outbox row or have none; want 0", rep.Mismatches)
	}
	switch {
	case eos && rep.Duplicates > 0:
		t.Errorf("%d DUPLICATES read_committed with delivery: exactly-once; want 0", rep.Duplicates)
	case rep.Duplicates > bound:
		t.Errorf("%d DUPLICATES; want at most %d = (%d SIGKILLs + %d unexpected exits) × %d max_in_flight_events + %d for Kafka kills and pauses",
			rep.Duplicates, bound, s.count[relayKill], len(unexpected), window, allowance)
	}
	if len(rep.Problems) > 0 {
		t.Errorf("first problems:\n  %s", strings.Join(rep.Problems, "\n  "))
	}
}

// plan returns the faults in a random order drawn from the seed.
func (s *suite) plan() []faultKind {
	var p []faultKind
	for _, k := range kinds {
		for range s.m.faults[k] {
			p = append(p, k)
		}
	}
	s.rng.Shuffle(len(p), func(i, j int) { p[i], p[j] = p[j], p[i] })
	return p
}

// inject runs one fault to its end: every server runs again when it returns.
func (s *suite) inject(i int, k faultKind) {
	t := s.t
	t.Helper()
	s.count[k]++
	switch k {
	case relayKill:
		s.logf("fault %d: %s", i+1, k)
		s.signalRelay(syscall.SIGKILL, 0, s.m.between(s.rng, [2]time.Duration{0, time.Second}))
	case relayTerm:
		s.logf("fault %d: %s", i+1, k)
		e := s.signalRelay(syscall.SIGTERM, termUptime, 200*time.Millisecond)
		if e.asked != "" && !exitedCleanly(e.err) {
			t.Errorf("SIGTERM: relay exited with %v; want exit status 0 after draining\n%s", e.err, e.tail)
		}
	case kafkaKill:
		s.serverOutage(i, k, s.m.between(s.rng, s.m.down), &s.kafkaDown, testenv.StopKafka, testenv.StartKafka)
	case kafkaPause:
		s.serverOutage(i, k, s.m.pause, &s.kafkaFroze, testenv.PauseKafka, testenv.ResumeKafka)
	case pgCrash:
		s.serverOutage(i, k, s.m.between(s.rng, s.m.down), &s.pgDown, testenv.StopPostgres, testenv.StartPostgres)
	case pgCut:
		d := s.m.between(s.rng, s.m.down)
		s.logf("fault %d: %s for %s", i+1, k, d.Round(time.Millisecond))
		s.proxy.Cut()
		s.outage(d)
		s.proxy.Restore()
	}
}

// serverOutage runs fault i, of kind k: stop takes a server away for d (an
// outage), start brings it back; *away holds while it is away.
func (s *suite) serverOutage(i int, k faultKind, d time.Duration, away *bool, stop, start func(testing.TB)) {
	s.logf("fault %d: %s for %s", i+1, k, d.Round(time.Millisecond))
	*away = true
	stop(s.t)
	s.outage(d)
	start(s.t)
	*away = false
}

// outage waits out d, killing the relay half way with the mode's chance: a relay
// (re)starting while a server is away must cope too.
func (s *suite) outage(d time.Duration) {
	if s.rng.Float64() >= s.m.killMid {
		time.Sleep(d)
		return
	}
	time.Sleep(d / 2)
	s.logf("  and %s in the middle of it", relayKill)
	s.count[relayKill]++
	s.midKills++
	s.signalRelay(syscall.SIGKILL, 0, 0)
	time.Sleep(d / 2)
}

func (s *suite) signalRelay(sig syscall.Signal, minUptime, restartAfter time.Duration) exit {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e, err := s.sup.Signal(ctx, sig, minUptime, restartAfter)
	if err != nil {
		s.t.Fatalf("signal relay %s: %v", sig, err)
	}
	return e
}

// restoreServers brings back whatever a failed run left down; once is enough.
func (s *suite) restoreServers() {
	if s.proxy != nil {
		s.proxy.Restore()
	}
	if s.kafkaFroze {
		s.kafkaFroze = false
		testenv.ResumeKafka(s.t)
	}
	if s.kafkaDown {
		s.kafkaDown = false
		testenv.StartKafka(s.t)
	}
	if s.pgDown {
		s.pgDown = false
		testenv.StartPostgres(s.t)
	}
}

func (s *suite) topic(aggregateType string) string { return s.prefix + "." + aggregateType }

// setupDatabase creates what `outbox-relay setup` creates, a test_decoding probe slot
// that tells the exact end LSN of every transaction (it never advances, so it sees
// everything), and an audit trigger recording every row the relay inserts into the
// retry table (delivered rows are deleted from the table itself).
func (s *suite) setupDatabase() {
	outbox := outboxsql.Table{Schema: "public", Name: "outbox"}
	retryTable := outboxsql.Table{Schema: "public", Name: outboxsql.DefaultRetryTable}
	for _, stmt := range outboxsql.OutboxTable(outbox, outboxsql.Columns{}, outboxsql.LayoutRelay) {
		s.pg.Exec(s.t, stmt)
	}
	s.pg.Exec(s.t, outboxsql.CheckpointTable(outboxsql.Table{Schema: "public", Name: "outbox_relay_checkpoint"}))
	for _, stmt := range outboxsql.RetryTable(retryTable) {
		s.pg.Exec(s.t, stmt)
	}
	if s.messages {
		// The archive is not published: its inserts are no events.
		s.pg.Exec(s.t, outboxsql.CreateMessagesPublication("outbox_relay"))
	} else {
		s.pg.Exec(s.t, outboxsql.CreatePublication("outbox_relay", outbox))
	}
	s.pg.Exec(s.t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s.slot)
	s.pg.Exec(s.t, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, s.probe)
	s.pg.Exec(s.t, `CREATE TABLE retry_audit (event_key text, event_id text, status text, waiting boolean, last_error text,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	s.pg.Exec(s.t, `CREATE FUNCTION retry_audit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO retry_audit (event_key, event_id, status, waiting, last_error)
			VALUES (NEW.event_key, NEW.event_id, NEW.status, NEW.waiting, NEW.last_error);
			RETURN NULL;
		END$$`)
	s.pg.Exec(s.t, `CREATE TRIGGER retry_audit AFTER INSERT ON `+retryTable.Quoted()+` FOR EACH ROW EXECUTE FUNCTION retry_audit()`)
}

// lastOutboxCommit is the end LSN of the last transaction that inserted into the
// outbox, from the probe slot.
func (s *suite) lastOutboxCommit() pglogrepl.LSN {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT lsn::text, left(data, 24) FROM pg_logical_slot_peek_changes($1, NULL, NULL)`, s.probe)
	if err != nil {
		s.t.Fatalf("peek probe slot: %v", err)
	}
	defer rows.Close()
	var last pglogrepl.LSN
	touched := false
	for rows.Next() {
		var lsn, data string
		if err := rows.Scan(&lsn, &data); err != nil {
			s.t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(data, "table public.outbox:"):
			touched = true
		case strings.HasPrefix(data, "COMMIT"):
			if touched {
				if last, err = pglogrepl.ParseLSN(lsn); err != nil {
					s.t.Fatal(err)
				}
			}
			touched = false
		}
	}
	if err := rows.Err(); err != nil {
		s.t.Fatalf("peek probe slot: %v", err)
	}
	if last == 0 {
		s.t.Fatalf("the probe slot saw no outbox transaction")
	}
	return last
}

// waitDrained waits until the slot and the checkpoint are at or past last and the retry
// table holds no pending row.
func (s *suite) waitDrained(last pglogrepl.LSN) {
	deadline := time.Now().Add(s.m.drainMax)
	for {
		state, ok := s.drainState(last)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("not drained after %s: %s; want slot and checkpoint >= %s and no pending retry row", s.m.drainMax, state, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (s *suite) drainState(last pglogrepl.LSN) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var slot, cp string
	var pending int
	err := s.pool.QueryRow(ctx, `SELECT
		(SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots WHERE slot_name = $1),
		coalesce((SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1), '0/0'),
		(SELECT count(*) FROM `+outboxsql.DefaultRetryTable+` WHERE status = 'pending')`, s.slot).Scan(&slot, &cp, &pending)
	if err != nil {
		return fmt.Sprintf("read state: %v", err), false
	}
	sl, err1 := pglogrepl.ParseLSN(slot)
	cl, err2 := pglogrepl.ParseLSN(cp)
	state := fmt.Sprintf("slot confirmed %s, checkpoint %s, %d pending retry rows", slot, cp, pending)
	return state, err1 == nil && err2 == nil && sl >= last && cl >= last && pending == 0
}

// waitRowsDrained waits up to 5 minutes after the producer stopped until every
// outbox row is in Kafka or the retry table and no retry row is pending. It
// reads no slot, unlike waitDrained: in some runs the probe slot is lost with
// the relay's. out is the relay's output, whose tail a failure shows.
func (s *suite) waitRowsDrained(out *testenv.Output) {
	t, ctx := s.t, context.Background()
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(time.Second) {
		var pending int
		if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_retry WHERE status = 'pending'`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if rep := Check(s.collect()); rep.Lost == 0 && pending == 0 {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("not drained 5 minutes after the producer stopped: %d lost, %d pending retry rows: %v\n%s", rep.Lost, pending, rep.Problems, tailLines(out.String(), 30))
		}
	}
}

// collect reads the outbox table, every topic, the retry table and its audit.
func (s *suite) collect() Input {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	in := Input{Topic: s.topic}
	rows, err := s.pool.Query(ctx, `SELECT id::text, aggregate_type, aggregate_id, payload::text, coalesce((payload->>'seq')::int, 0) FROM outbox`)
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	in.Rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) {
		var o Row
		err := r.Scan(&o.ID, &o.AggregateType, &o.AggregateID, &o.Payload, &o.Seq)
		if strings.HasPrefix(o.AggregateID, "poison-") {
			o.Poison = reasonTooLarge
			if o.AggregateType == invalidType {
				o.Poison = reasonInvalidTopic
			}
		}
		return o, err
	})
	if err != nil {
		t.Fatalf("read outbox: %v", err)
	}
	for _, at := range aggregateTypes {
		in.Delivered = append(in.Delivered, s.read(s.topic(at.name))...)
	}
	rows, err = s.pool.Query(ctx, `SELECT coalesce(event_id, event_key), status, coalesce(last_error, '') FROM `+outboxsql.DefaultRetryTable)
	if err != nil {
		t.Fatalf("read retry table: %v", err)
	}
	in.Retry, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (RetryRow, error) {
		var rr RetryRow
		return rr, r.Scan(&rr.EventID, &rr.Status, &rr.LastError)
	})
	if err != nil {
		t.Fatalf("read retry table: %v", err)
	}
	rows, err = s.pool.Query(ctx, `SELECT coalesce(event_id, event_key) FROM retry_audit`)
	if err != nil {
		t.Fatalf("read retry audit: %v", err)
	}
	in.RetryInserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("read retry audit: %v", err)
	}
	return in
}

// seqAnomalies returns a description of the first aggregates whose sequence numbers in
// the table are not exactly 1..n, or "".
func seqAnomalies(rows []Row) string {
	seqs := map[string][]int{}
	for _, r := range rows {
		if r.Poison == "" {
			seqs[r.AggregateID] = append(seqs[r.AggregateID], r.Seq)
		}
	}
	var bad []string
	for agg, ss := range seqs {
		have := map[int]int{}
		for _, q := range ss {
			have[q]++
		}
		for q := 1; q <= len(ss); q++ {
			if have[q] != 1 {
				bad = append(bad, fmt.Sprintf("%s has seq %d %d times (%d rows)", agg, q, have[q], len(ss)))
				break
			}
		}
	}
	if len(bad) > 5 {
		bad = bad[:5]
	}
	return strings.Join(bad, "; ")
}

// report logs the run as a table.
func (s *suite) report(seed uint64, ps producerStats, rep Report, unexpected []exit, bound int) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "fault suite report\t\t%s mode, %s, seed %d, %s\n", s.m.name, delivery(s.eos), seed, time.Since(s.began).Round(time.Second))
	for _, k := range kinds {
		switch k {
		case relayKill:
			fmt.Fprintf(w, "fault: %s\t%d\t(%d in the middle of an outage)\n", k, s.count[k], s.midKills)
		case relayTerm:
			fmt.Fprintf(w, "fault: %s\t%d\t(+1 for the final restart)\n", k, s.count[k])
		default:
			fmt.Fprintf(w, "fault: %s\t%d\t\n", k, s.count[k])
		}
	}
	fmt.Fprintf(w, "relay runs\t%d\t(%d exits not asked for)\n", s.sup.Runs(), len(unexpected))
	fmt.Fprintf(w, "producer transactions\t%d\t(%d failed: %d committed after all, %d not; %d reconnects)\n",
		ps.Transactions, ps.Failed, ps.UnknownCommitted, ps.UnknownRolledBack, ps.Reconnects)
	fmt.Fprintf(w, "events in outbox table\t%d\t(%d poison)\n", rep.Events, rep.Poison)
	fmt.Fprintf(w, "delivered (distinct)\t%d\t\n", rep.Delivered)
	fmt.Fprintf(w, "messages in Kafka\t%d\t\n", rep.Messages)
	fmt.Fprintf(w, "poison dead with reason\t%d\twant %d\n", rep.DeadRows, rep.Poison)
	fmt.Fprintf(w, "LOST\t%d\twant 0\n", rep.Lost)
	fmt.Fprintf(w, "DUPLICATES\t%d\twant <= %d\n", rep.Duplicates, bound)
	fmt.Fprintf(w, "duplicates marked at least once\t%d\t(sent by the retry worker)\n", rep.MarkedDuplicates)
	fmt.Fprintf(w, "ORDER violations\t%d\twant 0\n", rep.OrderViolations)
	fmt.Fprintf(w, "retry rows for non-poison events\t%d\twant 0\n", rep.NonPoisonRetries)
	fmt.Fprintf(w, "poison handled wrong\t%d\twant 0\n", rep.PoisonWrong)
	fmt.Fprintf(w, "content mismatches\t%d\twant 0\n", rep.Mismatches)
	w.Flush()
	s.t.Logf("\n%s", b.String())
	for _, e := range unexpected {
		s.t.Logf("relay run %d exited by itself after %s: %v\n%s", e.run, e.uptime.Round(time.Millisecond), e.err, e.tail)
	}
}

// hostPort returns the host:port a DSN connects to.
func hostPort(dsn string) (string, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("parse postgres dsn: %w", err)
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// withHostPort returns dsn pointed at addr instead of its server.
func withHostPort(dsn, addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Host = addr
		return u.String()
	}
	return dsn + " host=" + host + " port=" + port
}

// delivery names the relay's delivery mode of a run.
func delivery(eos bool) string {
	if eos {
		return relay.DeliveryExactlyOnce
	}
	return relay.DeliveryAtLeastOnce
}

// prepare gives s its servers: a fresh database set up for the run (s.messages
// says for which source), Kafka, topics named under a unique name starting
// with prefix, and a slot and a probe slot of unique names.
func (s *suite) prepare(prefix string) {
	t := s.t
	s.pg = testenv.Postgres(t)
	s.kafka = testenv.Kafka(t)
	s.pool = s.pg.Pool(t)
	// Slot names are global to the server, not per database.
	s.prefix, s.slot, s.probe = testenv.UniqueName(t, prefix), testenv.UniqueName(t, "slot"), testenv.UniqueName(t, "probe")
	s.setupDatabase()
}

// takeLate takes the events of aggregate type late, whose topic is created
// late so that they go through the retry table on purpose, out of in's
// retry-table inserts, and returns their ids and how many it took.
func takeLate(in *Input, late string) (ids map[string]bool, taken int) {
	ids = map[string]bool{}
	for _, r := range in.Rows {
		if r.AggregateType == late && r.Poison == "" {
			ids[r.ID] = true
		}
	}
	in.RetryInserted = slices.DeleteFunc(in.RetryInserted, func(id string) bool {
		if ids[id] {
			taken++
			return true
		}
		return false
	})
	return ids, taken
}

// binaryEnv is the environment of a relay binary run on the suite's database,
// slot, topics and Kafka, with the intervals short enough for a run of
// minutes, followed by extra (what the run sets of its own).
func (s *suite) binaryEnv(extra ...string) []string {
	env := append(s.relayEnv(s.pg.DSN, ""), "RELAY_POSTGRES_STATUS_INTERVAL=1s")
	return append(env, extra...)
}

// relayEnv is the environment every relay binary of the suite runs with:
// Postgres at dsn, the suite's slot, topics and Kafka, intervals short enough
// for a run of minutes, JSON logs, metrics served on metrics ("" for none).
func (s *suite) relayEnv(dsn, metrics string) []string {
	return append(os.Environ(),
		"RELAY_POSTGRES_DSN="+dsn,
		"RELAY_KAFKA_BROKERS="+strings.Join(s.kafka.Brokers, ","),
		"RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION=false",
		"RELAY_POSTGRES_SLOT="+s.slot,
		"RELAY_TOPICS_TEMPLATE="+s.prefix+".{aggregate_type}",
		"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS="+strconv.Itoa(window),
		"RELAY_KAFKA_BATCH_BYTES="+strconv.Itoa(largePayloadLimit),
		"RELAY_CHECKPOINT_INTERVAL=100ms",
		"RELAY_RETRY_BACKOFF_MIN=200ms",
		"RELAY_RETRY_BACKOFF_MAX=1s",
		"RELAY_RETRY_POLL_INTERVAL=200ms",
		"RELAY_METRICS_LISTEN="+metrics,
		"RELAY_LOG_FORMAT=json",
	)
}

// deliveryEnv is the relay's environment for the run's delivery mode: with
// exactly-once, a checkpoint topic of the run's own, created here as setup
// would.
func (s *suite) deliveryEnv() []string {
	if !s.eos {
		return []string{"RELAY_DELIVERY=" + relay.DeliveryAtLeastOnce}
	}
	topic := s.prefix + ".checkpoints"
	s.kafka.CreateTopic(s.t, topic, 1)
	return []string{"RELAY_DELIVERY=" + relay.DeliveryExactlyOnce, "RELAY_KAFKA_CHECKPOINT_TOPIC=" + topic}
}

// read reads topic's messages: with exactly-once as a read_committed
// consumer does (aborted transactions' records and markers left out), else
// everything Kafka holds.
func (s *suite) read(topic string) []Delivery {
	t := s.t
	t.Helper()
	var out []Delivery
	add := func(d Delivery, headers []testenv.Header) {
		for _, h := range headers {
			switch h.Key {
			case "id":
				d.ID = string(h.Value)
			case event.HeaderDelivery:
				d.AtLeastOnce = string(h.Value) == event.DeliveryAtLeastOnce
			}
		}
		out = append(out, d)
	}
	if !s.eos {
		for _, m := range s.kafka.ReadAll(t, topic) {
			add(Delivery{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)}, m.Headers)
		}
		return out
	}
	c, err := kafkaadmin.NewReader(kafkaclient.Config{Brokers: s.kafka.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	parts, err := c.Partitions(ctx, topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	for _, p := range parts {
		if _, err := c.ReadCommitted(ctx, topic, p, 0, func(r kafkaadmin.Record) error {
			hs := make([]testenv.Header, len(r.Headers))
			for i, h := range r.Headers {
				hs[i] = testenv.Header(h)
			}
			add(Delivery{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key), Value: string(r.Value)}, hs)
			return nil
		}); err != nil {
			t.Fatalf("read %s[%d] read_committed: %v", topic, p, err)
		}
	}
	return out
}
