package faults

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Issue 35's done-when for item 6 ("never block the walsender"), sized.
const (
	walsenderKeepSize   = "64MB"           // max_slot_wal_keep_size for the run
	walsenderPause      = 3 * time.Minute  // Kafka frozen (SIGSTOP)
	walsenderFillerRate = 4 << 20          // bytes a second of random rows into another table
	checkpointEvery     = 5 * time.Second  // a CHECKPOINT sampled this often
	checkpointLimit     = 15 * time.Second // and each must complete within this
)

// TestWalsenderNeverBlocksCheckpoints is issue 35's failure as an operator
// met it: max_slot_wal_keep_size = 64MB, Kafka frozen (SIGSTOP) for minutes
// while the application writes outbox events and another table writes
// megabytes a second of non-compressible rows, far past the limit. A relay
// that stopped reading its replication connection (its window full) left its
// walsender blocked in a socket write; at the next checkpoint Postgres told
// it to exit, to invalidate the slot, and the checkpointer waited for it:
// no checkpoint for 9 minutes, manual ones hung. Here a CHECKPOINT every 5 s
// must complete within 15 s throughout; once Kafka is back every event
// arrives (lost 0, per-aggregate order kept), the lost slot healed by
// postgres.on_slot_loss: refill. Only under RELAY_FAULTS=full (make
// test-faults): it runs about 6 minutes and changes a server-wide setting.
func TestWalsenderNeverBlocksCheckpoints(t *testing.T) {
	if os.Getenv("RELAY_FAULTS") != "full" {
		t.Skip("RELAY_FAULTS=full only (make test-faults); replication's TestStreamPauseFreesWalsender is the fast form")
	}
	testenv.Exclusive(t) // Kafka frozen, max_slot_wal_keep_size server-wide
	bin := testenv.RelayBinary(t)
	seed := uint64(time.Now().UnixNano())
	s := &suite{t: t, m: full, rng: mrand.New(mrand.NewPCG(seed, 35)), began: time.Now(), count: map[faultKind]int{}}
	s.prepare("ws")
	// The probe slot (commit positions) would be invalidated too, and is not
	// needed: drained is judged from the tables and Kafka.
	s.pg.Exec(t, `SELECT pg_drop_replication_slot($1)`, s.probe)
	for _, at := range aggregateTypes {
		s.kafka.CreateTopic(t, s.topic(at.name), 4)
	}
	ctx := context.Background()
	su := testenv.SuperuserConn(t, s.pg.DSN)
	rows, err := su.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE slot_name <> $1 AND coalesce(wal_status, '') <> 'lost'`, s.slot)
	if err != nil {
		t.Fatal(err)
	}
	others, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(others) > 0 {
		t.Fatalf("other slots on the server would be invalidated by max_slot_wal_keep_size = %s: %v; drop them or run this test on its own server", walsenderKeepSize, others)
	}
	s.pg.Exec(t, `CREATE TABLE filler (id bigserial PRIMARY KEY, b bytea NOT NULL)`)
	s.pg.Exec(t, `ALTER TABLE filler ALTER COLUMN b SET STORAGE EXTERNAL`) // stored as written, not compressed

	env := s.binaryEnv(
		"RELAY_POSTGRES_ON_SLOT_LOSS=refill",
		"RELAY_CHECKPOINT_HISTORY_INTERVAL=1s",
	)
	logFile, err := os.CreateTemp("", "outbox-relay-walsender-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	t.Logf("seed %d, relay output %s", seed, logFile.Name())
	cmd := exec.Command(bin, "run")
	cmd.Env = env
	out := &testenv.Output{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(90 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logFile.WriteString(out.String())
	}()

	prod := newProducer(s.pg.DSN, seed, 300)
	stopProducer := prod.start(t)
	defer stopProducer()
	time.Sleep(5 * time.Second)
	s.pg.WaitHistoryCovered(s.t, s.slot) // a refill needs a history row

	restore := func() {
		su.Exec(ctx, "ALTER SYSTEM RESET max_slot_wal_keep_size")
		su.Exec(ctx, "SELECT pg_reload_conf()")
	}
	defer restore()
	for _, q := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '" + walsenderKeepSize + "'", "SELECT pg_reload_conf()"} {
		if _, err := su.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}

	// Checkpoints, sampled from the start of the outage to the end of the run.
	cps := &checkpointSampler{dsn: su.Config().ConnString()}
	cpCtx, stopCheckpoints := context.WithCancel(ctx)
	cpDone := make(chan struct{})
	go func() { defer close(cpDone); cps.run(cpCtx, t) }()
	defer func() { stopCheckpoints(); <-cpDone }()

	s.logf("Kafka frozen (SIGSTOP) for %s; max_slot_wal_keep_size = %s, filler %d MB/s", walsenderPause, walsenderKeepSize, walsenderFillerRate>>20)
	testenv.PauseKafka(t)
	paused := true
	defer func() {
		if paused {
			testenv.ResumeKafka(t)
		}
	}()
	frozenAt := time.Now()
	// The relay's window fills within seconds at the producer's rate; then
	// more events than the socket buffers of both ends hold, so that a relay
	// that stops reading leaves its walsender blocked before the slot
	// passes the limit (at the producer's rate alone that takes minutes).
	time.Sleep(5 * time.Second)
	bulkEvents(t, s)
	time.Sleep(10 * time.Second)
	fillCtx, stopFiller := context.WithCancel(ctx)
	var filled atomic.Int64
	fillDone := make(chan error, 1)
	go func() { fillDone <- fill(fillCtx, s.pg.DSN, walsenderFillerRate, &filled) }()
	stopFill := func() {
		if stopFiller != nil {
			stopFiller()
			stopFiller = nil
			if err := <-fillDone; err != nil {
				t.Errorf("filler: %v", err)
			}
		}
	}
	defer stopFill()

	var statuses []string
	for end := frozenAt.Add(walsenderPause); time.Now().Before(end); time.Sleep(10 * time.Second) {
		var status, retained, wait string
		if err := s.pool.QueryRow(ctx, `SELECT coalesce(wal_status, ''), coalesce(pg_size_pretty(pg_current_wal_lsn() - restart_lsn), 'none'),
			coalesce((SELECT wait_event FROM pg_stat_activity WHERE pid = active_pid), 'no walsender')
			FROM pg_replication_slots WHERE slot_name = $1`, s.slot).Scan(&status, &retained, &wait); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Fatal(err)
		}
		statuses = append(statuses, status)
		s.logf("slot %s, retained %s, walsender waits on %s; filler wrote %d MB; checkpoints %s", status, retained, wait, filled.Load()>>20, cps.summary())
	}
	testenv.ResumeKafka(t)
	paused = false
	stopFill()
	s.logf("Kafka resumed; filler wrote %d MB in all", filled.Load()>>20)
	time.Sleep(10 * time.Second) // the producer goes on after the outage
	stopProducer()
	ps := prod.Stats()

	s.waitRowsDrained(out)
	select {
	case err := <-done:
		done <- err
		t.Fatalf("the relay exited (%v); want it streaming\n%s", err, tailLines(out.String(), 30))
	default:
	}
	stopCheckpoints()
	<-cpDone

	rep := Check(s.collect())
	pauses, refills := relayLogCount(out.String(), "replication paused"), refillLines(out.String())
	s.logf("%d events (%d poison) from %d producer transactions; LOST %d, DUPLICATES %d, ORDER violations %d; "+
		"checkpoints %s; slot wal_status while frozen %v; replication pauses %d; refills: %s",
		rep.Events, rep.Poison, ps.Transactions, rep.Lost, rep.Duplicates, rep.OrderViolations,
		cps.summary(), slices.Compact(statuses), pauses, strings.Join(refills, "; "))
	if rep.Lost != 0 || rep.OrderViolations != 0 || rep.Mismatches != 0 || rep.PoisonWrong != 0 || rep.NonPoisonRetries != 0 {
		t.Errorf("lost %d, order violations %d, mismatches %d, poison wrong %d, retry rows for events not poison %d; want 0 each:\n  %s",
			rep.Lost, rep.OrderViolations, rep.Mismatches, rep.PoisonWrong, rep.NonPoisonRetries, strings.Join(rep.Problems, "\n  "))
	}
	if bad := cps.failures(); len(bad) > 0 {
		t.Errorf("CHECKPOINT did not complete within %s %d times of %d (issue 35: the checkpointer waits on a walsender its client does not read): %s",
			checkpointLimit, len(bad), cps.count(), strings.Join(bad, "; "))
	}
	if pauses == 0 {
		t.Errorf("no \"replication paused\" in the relay's log: the stream never stopped taking batches, so the run did not test what it is for")
	}
	if cps.count() < int(walsenderPause/checkpointEvery)/2 {
		t.Errorf("only %d checkpoints sampled during a %s outage; want one every %s", cps.count(), walsenderPause, checkpointEvery)
	}
	if n := filled.Load(); n < 400<<20 {
		t.Errorf("the filler wrote %d MB; want at least 400 MB of WAL past max_slot_wal_keep_size", n>>20)
	}
}

// checkpointSampler runs a CHECKPOINT every checkpointEvery on a superuser
// connection of its own (dsn), each bounded by statement_timeout, and keeps
// how long each took.
type checkpointSampler struct {
	dsn string

	mu    sync.Mutex
	took  []time.Duration
	slow  []string
	began time.Time
}

func (c *checkpointSampler) run(ctx context.Context, t *testing.T) {
	c.mu.Lock()
	c.began = time.Now()
	c.mu.Unlock()
	connect := func() (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(c.dsn)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["statement_timeout"] = strconv.Itoa(int(checkpointLimit.Milliseconds()))
		return pgx.ConnectConfig(ctx, cfg)
	}
	conn, err := connect()
	if err != nil {
		t.Errorf("checkpoint sampler: %v", err)
		return
	}
	defer func() { conn.Close(context.Background()) }()
	tick := time.NewTicker(checkpointEvery)
	defer tick.Stop()
	for {
		at := time.Now()
		// A client-side bound too: a cancel the server does not act on must
		// not stop the sampling.
		qctx, cancel := context.WithTimeout(ctx, checkpointLimit+5*time.Second)
		_, err := conn.Exec(qctx, "CHECKPOINT")
		cancel()
		took := time.Since(at)
		if ctx.Err() != nil {
			return
		}
		c.mu.Lock()
		c.took = append(c.took, took)
		if err != nil || took > checkpointLimit {
			c.slow = append(c.slow, fmt.Sprintf("at +%s took %s (%v)", at.Sub(c.began).Round(time.Second), took.Round(time.Millisecond), err))
		}
		c.mu.Unlock()
		if err != nil && conn.IsClosed() {
			if conn, err = connect(); err != nil {
				t.Errorf("checkpoint sampler: reconnect: %v", err)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (c *checkpointSampler) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.took)
}

func (c *checkpointSampler) failures() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.slow)
}

// summary is "n, max d, m failed".
func (c *checkpointSampler) summary() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var longest time.Duration
	for _, d := range c.took {
		longest = max(longest, d)
	}
	return strconv.Itoa(len(c.took)) + " run, longest " + longest.Round(time.Millisecond).String() + ", " + strconv.Itoa(len(c.slow)) + " over " + checkpointLimit.String()
}

// fill writes rate bytes a second of random (non-compressible) rows into
// the filler table until ctx is done, adding to *written, and truncates the
// table every 256 MB so that its size on disk stays small (the WAL written
// is what counts).
func fill(ctx context.Context, dsn string, rate int, written *atomic.Int64) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	const row = 256 << 10
	buf := make([]byte, row)
	tick := time.NewTicker(time.Second * row / time.Duration(rate))
	defer tick.Stop()
	var sinceTruncate int
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		rand.Read(buf)
		if _, err := conn.Exec(ctx, `INSERT INTO filler (b) VALUES ($1)`, buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		written.Add(row)
		if sinceTruncate += row; sinceTruncate >= 256<<20 {
			sinceTruncate = 0
			if _, err := conn.Exec(ctx, `TRUNCATE filler`); err != nil && ctx.Err() == nil {
				return err
			}
		}
	}
}

// bulkEvents writes 10,000 outbox events of about 2 KB in 10 transactions,
// 20 MB, each of an aggregate of its own. (Not several per aggregate in one
// transaction: a refill orders a transaction's rows by ctid, and 2 KB rows
// of one transaction may land on pages out of their insert order; a run on
// Postgres 18 refilled 20 of them out of order. That is the refill's to fix,
// not what this test is about; the producer's events check order here.)
func bulkEvents(t *testing.T, s *suite) {
	for k := 0; k < 10; k++ {
		s.pg.Exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), 'Order', 'bulk-' || i, 'Bulk', jsonb_build_object('seq', 1, 'pad', repeat(md5(i::text), 64))
			FROM generate_series($1::int, $1::int + 999) AS i`, k*1000)
	}
}

// relayLogCount counts the relay's JSON log lines whose message starts with prefix.
func relayLogCount(out, prefix string) int {
	n := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) == nil {
			if msg, _ := l["msg"].(string); strings.HasPrefix(msg, prefix) {
				n++
			}
		}
	}
	return n
}
