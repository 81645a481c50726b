package hostile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

const (
	batchBytes = 1 << 20 // the sink's kafka.batch_bytes
	window     = 2000    // max_in_flight_events: the most a restart may resend
	stallBound = 45 * time.Second
	noProgress = 30 * time.Second // settle gives up when nothing moves for this long
)

// mode is the size of a run.
type mode struct {
	name      string
	kinds     []string // column types of payload and headers, one subtest each
	txns      int      // transactions per subtest
	actions   int      // operator actions per subtest
	tooLarge  int      // payloads beyond batch_bytes per subtest
	finalWait time.Duration
}

var (
	reduced = mode{name: "reduced", kinds: []string{"jsonb", "text"}, txns: 50, actions: 6, tooLarge: 3, finalWait: 90 * time.Second}
	full    = mode{name: "full", kinds: []string{"jsonb", "json", "text"}, txns: 400, actions: 30, tooLarge: 12, finalWait: 4 * time.Minute}
)

// seed returns RELAY_HOSTILE_SEED or a random seed, and logs it.
func seed(t *testing.T) uint64 {
	if v := os.Getenv("RELAY_HOSTILE_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("RELAY_HOSTILE_SEED=%q: %v", v, err)
		}
		return s
	}
	return mrand.Uint64() >> 1
}

// TestHostile runs the relay over hostile rows with operator actions, one
// subtest per column type, then the schema-drift subtest. See the package doc.
func TestHostile(t *testing.T) {
	m := reduced
	if v := os.Getenv("RELAY_FAULTS"); v == "full" {
		m = full
	} else if v != "" && v != "reduced" {
		t.Fatalf("RELAY_FAULTS=%q; want full, reduced or unset", v)
	}
	s := seed(t)
	t.Logf("mode %s, seed %d (replay with RELAY_HOSTILE_SEED=%d)", m.name, s, s)
	for i, kind := range m.kinds {
		t.Run(kind, func(t *testing.T) {
			t.Logf("seed %d (replay with RELAY_HOSTILE_SEED=%d)", s, s)
			runHostile(t, m, kind, s+uint64(i), false)
		})
	}
	t.Run("messages", func(t *testing.T) {
		t.Logf("seed %d (replay with RELAY_HOSTILE_SEED=%d)", s, s)
		runHostile(t, m, "text", s+50, true)
	})
	t.Run("schema_drift", func(t *testing.T) {
		t.Logf("seed %d (replay with RELAY_HOSTILE_SEED=%d)", s, s)
		runDrift(t, s+100)
	})
}

// env is one subtest's database, topics, relay and record of what happened.
type env struct {
	t      *testing.T
	pg     *testenv.PG
	kafka  *testenv.KafkaCluster
	pool   *pgxpool.Pool
	store  *retry.Store
	prefix string
	slot   string
	probe  string
	kind   string
	// messages: the events are logical decoding messages (outbox.source
	// messages), and the outbox table, which the publication does not
	// cover, their archive: the truth the checker reads (see messages_test.go).
	messages bool
	g        *gen
	rng      *mrand.Rand
	cfg      relay.Config

	headersColumn bool // the table still has its headers column
	extraHeaders  map[int64]bool
	committed     map[int64]time.Time
	seqs          map[int64]int
	ends          []pglogrepl.LSN // end LSN of every outbox transaction, from the probe slot
	touched       bool            // probe: the open transaction touched the outbox

	run        *running
	down       []Interval
	restarts   int
	unexpected int
	dropped    []RetryRow
	created    map[string]bool // topics created by the test
	missing    map[string]bool // topics that were missing while events of them were inserted
	columns    []string        // unmapped columns that may be dropped
	nextColumn int
}

func newEnv(t *testing.T, kind string, g *gen, seed uint64, messages bool) *env {
	e := &env{messages: messages,
		t: t, pg: testenv.Postgres(t), kafka: testenv.Kafka(t),
		prefix: testenv.UniqueName(t, "h"), slot: testenv.UniqueName(t, "slot"), probe: testenv.UniqueName(t, "probe"),
		kind: kind, g: g, rng: mrand.New(mrand.NewPCG(seed, 7)),
		headersColumn: true, extraHeaders: map[int64]bool{}, committed: map[int64]time.Time{}, seqs: map[int64]int{},
		created: map[string]bool{}, missing: map[string]bool{}, columns: []string{"note"},
	}
	e.pool = e.pg.Pool(t)
	// Every column nullable, id as text, payload and headers of the subtest's
	// type; hnum and hseq are the test's own (unmapped) columns.
	e.pg.Exec(t, fmt.Sprintf(`CREATE TABLE outbox (
		hnum bigint PRIMARY KEY,
		hseq integer,
		id text,
		aggregate_type text,
		aggregate_id text,
		event_type text,
		payload %[1]s,
		headers %[1]s,
		note text DEFAULT 'unmapped',
		created_at timestamptz DEFAULT now())`, kind))
	e.pg.Exec(t, `CREATE TABLE business (id bigserial PRIMARY KEY, note text)`)
	e.pg.Exec(t, outboxsql.CheckpointTable(outboxsql.Table{Schema: "public", Name: "outbox_relay_checkpoint"}))
	for _, stmt := range outboxsql.RetryTable(outboxsql.Table{Schema: "public", Name: "outbox_relay_retry"}) {
		e.pg.Exec(t, stmt)
	}
	if messages {
		var v int
		if err := e.pool.QueryRow(context.Background(), `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		if v < replication.MessagesMinVersion {
			t.Skipf("Postgres %d: pgoutput sends logical decoding messages from 14 on", v)
		}
		e.pg.Exec(t, outboxsql.CreateMessagesPublication("outbox_relay"))
	} else {
		e.pg.Exec(t, outboxsql.CreatePublication("outbox_relay", outboxsql.Table{Schema: "public", Name: "outbox"}))
	}
	e.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, e.slot)
	e.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'test_decoding')`, e.probe)
	for _, typ := range validTypes {
		e.createTopic(typ, 4)
	}
	// Col.x and Col_x collide in Kafka: create one, the other cannot exist.
	if g.collide == "Col.x" {
		e.createTopic("Col_x", 2)
	} else {
		e.createTopic("Col.x", 2)
	}
	var err error
	if e.store, err = retry.NewStore(e.pool, "outbox_relay_retry", e.slot); err != nil {
		t.Fatal(err)
	}
	e.cfg = relay.Config{
		Replication: replication.Config{DSN: e.pg.DSN, Slot: e.slot, Publication: "outbox_relay", StatusInterval: time.Second},
		Router:      router.Config{Topic: e.prefix + ".{aggregate_type}"},
		Sink:        kafkaclient.Config{Brokers: e.kafka.Brokers, RetryMax: 500 * time.Millisecond, BatchBytes: batchBytes},
		Retry:       retry.WorkerConfig{BackoffMin: 200 * time.Millisecond, BackoffMax: time.Second, PollInterval: 200 * time.Millisecond},

		CheckpointInterval: 50 * time.Millisecond,
		MaxInFlightEvents:  window,
		ShutdownTimeout:    10 * time.Second,
		Logger:             testLogger(t),
	}
	if messages {
		e.cfg.Source = relay.SourceMessages
	}
	return e
}

func (e *env) topic(aggregateType string) string { return e.prefix + "." + aggregateType }

func (e *env) createTopic(typ string, partitions int) {
	e.kafka.CreateTopic(e.t, e.topic(typ), partitions)
	e.created[e.topic(typ)] = true
}

func testLogger(t *testing.T) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("RELAY_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: level}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(trunc(strings.TrimRight(string(p), "\n"), 2000))
	return len(p), nil
}

// running is a relay started in this process.
type running struct {
	cancel context.CancelFunc
	done   chan error
	err    error
	exited bool
}

func (e *env) start(cfg relay.Config) {
	// Two sinks, as the CLI builds them: the pipeline's and the retry
	// worker's, closed after the relay stopped (cleanups run last first).
	var sinks relay.Sinks
	for _, s := range []*relay.Sink{&sinks.Stream, &sinks.Retry} {
		k, err := sink.New(cfg.Sink)
		if err != nil {
			e.t.Fatalf("sink.New: %v", err)
		}
		e.t.Cleanup(func() { k.Close() })
		*s = k
	}
	r, err := relay.New(cfg, sinks)
	if err != nil {
		e.t.Fatalf("relay.New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- r.Run(ctx) }()
	e.run = run
	e.t.Cleanup(func() {
		cancel()
		if !run.exited {
			select {
			case <-run.done:
			case <-time.After(60 * time.Second):
				e.t.Errorf("relay did not stop within 60s of cancel")
			}
		}
	})
}

// exitedByItself reports (once) a relay that returned without being asked.
func (e *env) exitedByItself() (error, bool) {
	if e.run.exited {
		return nil, false
	}
	select {
	case err := <-e.run.done:
		e.run.exited, e.run.err = true, err
		return err, true
	default:
		return nil, false
	}
}

// supervise restarts a relay that stopped by itself, as systemd would, and
// reports it: the relay must not stop for data.
func (e *env) supervise() {
	if err, ok := e.exitedByItself(); ok {
		e.unexpected++
		e.t.Errorf("relay stopped by itself (restart %d): %v", e.unexpected, err)
		from := time.Now()
		e.start(e.cfg)
		e.down = append(e.down, Interval{from, time.Now()})
	}
}

// stop cancels the relay and requires a clean shutdown.
func (e *env) stop() time.Time {
	from := time.Now()
	if err, ok := e.exitedByItself(); ok {
		e.t.Errorf("relay had stopped by itself: %v", err)
		return from
	}
	e.run.cancel()
	select {
	case err := <-e.run.done:
		e.run.exited = true
		if !errors.Is(err, context.Canceled) {
			e.t.Errorf("Run after cancel = %v; want an error wrapping context.Canceled", err)
		}
	case <-time.After(60 * time.Second):
		e.t.Fatalf("relay did not stop within 60s of cancel")
	}
	return from
}

func (e *env) restart() {
	from := e.stop()
	e.restarts++
	e.start(e.cfg)
	e.down = append(e.down, Interval{from, time.Now()})
}

// insert commits evs in one transaction, sometimes with a business row.
func (e *env) insert(evs []ev) {
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(ctx)
	if e.rng.IntN(3) == 0 {
		if _, err := tx.Exec(ctx, `INSERT INTO business (note) VALUES ('business row')`); err != nil {
			e.t.Fatalf("insert business: %v", err)
		}
	}
	b := &pgx.Batch{}
	for _, v := range evs {
		if e.messages {
			e.queueMessage(b, &v)
			continue
		}
		if e.headersColumn {
			b.Queue(fmt.Sprintf(`INSERT INTO outbox (hnum, hseq, id, aggregate_type, aggregate_id, event_type, payload, headers)
				VALUES ($1, $2, $3, $4, $5, $6, $7::text::%[1]s, $8::text::%[1]s)`, e.kind),
				v.n, v.seq, v.id, v.aggType, v.aggID, v.evType, v.payload, v.h)
		} else {
			b.Queue(fmt.Sprintf(`INSERT INTO outbox (hnum, hseq, id, aggregate_type, aggregate_id, event_type, payload)
				VALUES ($1, $2, $3, $4, $5, $6, $7::text::%s)`, e.kind),
				v.n, v.seq, v.id, v.aggType, v.aggID, v.evType, v.payload)
		}
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		e.t.Fatalf("insert outbox rows %d..%d: %v", evs[0].n, evs[len(evs)-1].n, err)
	}
	if err := tx.Commit(ctx); err != nil {
		e.t.Fatalf("commit: %v", err)
	}
	now := time.Now()
	for _, v := range evs {
		e.committed[v.n] = now
		e.seqs[v.n] = v.seq
		e.extraHeaders[v.n] = e.headersColumn
		if v.aggType != nil && *v.aggType != "" {
			if tp := e.topic(*v.aggType); validTopic(tp) && !e.created[tp] {
				e.missing[tp] = true
			}
		}
	}
}

// probeEnds consumes the probe slot and appends the end LSN of every
// transaction that touched the outbox.
func (e *env) probeEnds() {
	rows, err := e.pool.Query(context.Background(), `SELECT lsn::text, left(data, 40) FROM pg_logical_slot_get_changes($1, NULL, NULL)`, e.probe)
	if err != nil {
		e.t.Fatalf("read probe slot: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var lsn, data string
		if err := rows.Scan(&lsn, &data); err != nil {
			e.t.Fatal(err)
		}
		switch {
		case strings.HasPrefix(data, "table public.outbox:"):
			e.touched = true
		case strings.HasPrefix(data, "COMMIT"):
			if e.touched {
				l, err := pglogrepl.ParseLSN(lsn)
				if err != nil {
					e.t.Fatal(err)
				}
				e.ends = append(e.ends, l)
			}
			e.touched = false
		}
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("read probe slot: %v", err)
	}
}

// ---------------------------------------------------------------- operator actions

// retryRows reads the retry table directly (Store.List leaves out values,
// which identify the events that have no id).
func (e *env) retryRows(where string) []RetryRow {
	rows, err := e.pool.Query(context.Background(), `SELECT seq, event_key, coalesce(event_id, ''), coalesce(aggregate_type, ''),
		coalesce(aggregate_id, ''), coalesce(event_type, ''), value, status, coalesce(last_error, '')
		FROM outbox_relay_retry `+where+` ORDER BY seq`)
	if err != nil {
		e.t.Fatalf("read retry table: %v", err)
	}
	defer rows.Close()
	var out []RetryRow
	for rows.Next() {
		var r RetryRow
		if err := rows.Scan(&r.Seq, &r.EventKey, &r.EventID, &r.AggregateType, &r.AggregateID, &r.EventType, &r.Value, &r.Status, &r.LastError); err != nil {
			e.t.Fatalf("read retry table: %v", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatalf("read retry table: %v", err)
	}
	return out
}

func (e *env) deadRows() []RetryRow { return e.retryRows(`WHERE status = 'dead'`) }

// act performs one operator action drawn from the seed and says what it did.
func (e *env) act() string {
	ctx := context.Background()
	switch p := e.rng.IntN(100); {
	case p < 30:
		e.restart()
		return "restarted the relay"
	case p < 45:
		seqs, err := e.store.RequeueAllDead(ctx)
		if err != nil {
			e.t.Fatalf("RequeueAllDead: %v", err)
		}
		return fmt.Sprintf("requeued all %d dead rows", len(seqs))
	case p < 55:
		dead := e.deadRows()
		if len(dead) == 0 {
			return "requeue one: no dead row"
		}
		d := dead[e.rng.IntN(len(dead))]
		if _, err := e.store.Requeue(ctx, []string{strconv.FormatInt(d.Seq, 10)}); err != nil {
			e.t.Fatalf("Requeue(%d): %v", d.Seq, err)
		}
		return fmt.Sprintf("requeued dead row %d (%s)", d.Seq, short(d.EventKey))
	case p < 72:
		dead := e.deadRows()
		if len(dead) == 0 {
			return "drop: no dead row"
		}
		d := dead[e.rng.IntN(len(dead))]
		rr := d
		rr.DroppedAt = time.Now()
		seqs, err := e.store.Drop(ctx, []string{strconv.FormatInt(d.Seq, 10)})
		if err != nil {
			if errors.Is(err, retry.ErrNotFound) {
				return fmt.Sprintf("drop: row %d was gone", d.Seq)
			}
			e.t.Fatalf("Drop(%d): %v", d.Seq, err)
		}
		if len(seqs) == 1 {
			e.dropped = append(e.dropped, rr)
		}
		return fmt.Sprintf("dropped dead row %d (%s: %s)", d.Seq, short(d.EventKey), trunc(d.LastError, 120))
	case p < 86:
		e.nextColumn++
		name := fmt.Sprintf("extra_%d", e.nextColumn)
		typ := []string{"text DEFAULT 'x'", "integer", "jsonb DEFAULT '{\"a\": 1}'", "bytea"}[e.rng.IntN(4)]
		e.pg.Exec(e.t, fmt.Sprintf(`ALTER TABLE outbox ADD COLUMN %s %s`, name, typ))
		e.columns = append(e.columns, name)
		return "added column " + name + " " + typ
	default:
		if len(e.columns) == 0 {
			return "drop column: no unmapped column left"
		}
		i := e.rng.IntN(len(e.columns))
		name := e.columns[i]
		e.columns = slices.Delete(e.columns, i, i+1)
		e.pg.Exec(e.t, fmt.Sprintf(`ALTER TABLE outbox DROP COLUMN %s`, name))
		return "dropped unmapped column " + name
	}
}

// ---------------------------------------------------------------- end state

// rows reads the outbox table back: the truth of what was committed.
func (e *env) rows(preDrop map[int64]*string) []Row {
	cols := `hnum, id, aggregate_type, aggregate_id, event_type, payload::text, NULL::text`
	if e.headersColumn {
		cols = `hnum, id, aggregate_type, aggregate_id, event_type, payload::text, headers::text`
	}
	rows, err := e.pool.Query(context.Background(), `SELECT `+cols+` FROM outbox ORDER BY hnum`)
	if err != nil {
		e.t.Fatalf("read outbox: %v", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.N, &r.ID, &r.AggregateType, &r.AggregateID, &r.EvType, &r.Payload, &r.Headers); err != nil {
			e.t.Fatal(err)
		}
		if h, ok := preDrop[r.N]; ok {
			r.Headers = h
		}
		r.ExtraHeaders = e.extraHeaders[r.N]
		r.Seq = e.seqs[r.N]
		r.Committed = e.committed[r.N]
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// topics lists the topics of this run's prefix that exist.
func (e *env) topics() map[string]bool {
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.kafka.Brokers...))
	if err != nil {
		e.t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tds, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		e.t.Fatalf("list topics: %v", err)
	}
	out := map[string]bool{}
	for topic := range tds {
		if strings.HasPrefix(topic, e.prefix+".") {
			out[topic] = true
		}
	}
	return out
}

func (e *env) records(topics map[string]bool) []Record {
	var out []Record
	for tp := range topics {
		for _, m := range e.kafka.ReadAll(e.t, tp) {
			r := Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Time: m.Time}
			for _, h := range m.Headers {
				r.Headers = append(r.Headers, Header{h.Key, string(h.Value)})
			}
			out = append(out, r)
		}
	}
	return out
}

func (e *env) lsn(q string, args ...any) pglogrepl.LSN {
	var s *string
	err := e.pool.QueryRow(context.Background(), q, args...).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && s == nil) {
		return 0
	}
	if err != nil {
		e.t.Fatalf("%s: %v", q, err)
	}
	l, err := pglogrepl.ParseLSN(*s)
	if err != nil {
		e.t.Fatal(err)
	}
	return l
}

func (e *env) slotConfirmed() pglogrepl.LSN {
	return e.lsn(`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, e.slot)
}

func (e *env) checkpoint() pglogrepl.LSN {
	return e.lsn(`SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, e.slot)
}

// input gathers the end state.
func (e *env) input(preDrop map[int64]*string) Input {
	e.probeEnds()
	topics := e.topics()
	retryRows := e.retryRows("")
	in := Input{
		Rows: e.rows(preDrop), Records: e.records(topics), Retry: retryRows, Dropped: e.dropped,
		Topic: e.topic, Exists: func(tp string) bool { return topics[tp] }, EverMissing: func(tp string) bool { return e.missing[tp] },
		BatchBytes: batchBytes, MaxDuplicates: (e.restarts + e.unexpected) * window, StallBound: stallBound, Down: e.down,
		SlotConfirmed: e.slotConfirmed(), Checkpoint: e.checkpoint(),
	}
	if len(e.ends) > 0 {
		in.LastEnd = e.ends[len(e.ends)-1]
	}
	return in
}

// settle waits until nothing is left to deliver or confirm (or the time is
// up), then checks the end state and fails the test with the report.
func (e *env) settle(timeout time.Duration, preDrop map[int64]*string) {
	deadline := time.Now().Add(timeout)
	var rep Report
	var last string
	lastChange := time.Now()
	for {
		e.supervise()
		in := e.input(preDrop)
		rep = Check(in)
		if rep.Lost+rep.Stuck+rep.NotConfirmed+rep.Both == 0 || time.Now().After(deadline) {
			break
		}
		// Nothing moved for noProgress: the pipeline is stuck, waiting longer
		// only slows the report down.
		if sig := fmt.Sprint(rep.Records, rep.InRetry, rep.Lost, rep.Stuck, in.SlotConfirmed, in.Checkpoint); sig != last {
			last, lastChange = sig, time.Now()
		} else if time.Since(lastChange) > noProgress {
			e.t.Logf("no progress for %s: checking now", noProgress)
			break
		}
		time.Sleep(2 * time.Second)
	}
	e.t.Logf("restarts %d, unexpected exits %d, dropped by the operator %d, commit ends %d\n%s",
		e.restarts, e.unexpected, len(e.dropped), len(e.ends), rep.String())
	if rep.Failed() {
		e.t.Errorf("hostile check failed (replay with RELAY_HOSTILE_SEED; see the seed above):\n%s", rep.String())
	}
}

// ---------------------------------------------------------------- the runs

func runHostile(t *testing.T, m mode, kind string, seed uint64, messages bool) {
	g := newGen(seed, kind)
	g.tooLarge = m.tooLarge
	e := newEnv(t, kind, g, seed, messages)
	began := time.Now()
	e.start(e.cfg)

	// Operator actions after these transactions; Late's topic is created
	// about halfway.
	at := map[int]bool{}
	for range m.actions {
		at[1+e.rng.IntN(m.txns-1)] = true
	}
	lateAt := m.txns/3 + e.rng.IntN(m.txns/3)
	events := 0
	for i := range m.txns {
		evs := make([]ev, g.txnSize())
		for j := range evs {
			evs[j] = g.event(false)
		}
		e.insert(evs)
		events += len(evs)
		if i == lateAt {
			e.createTopic("Late", 2)
			t.Logf("%6.1fs after txn %d: created topic %s", time.Since(began).Seconds(), i, e.topic("Late"))
		}
		if at[i] {
			t.Logf("%6.1fs after txn %d: %s", time.Since(began).Seconds(), i, e.act())
		}
		if i%20 == 19 {
			e.probeEnds()
			e.supervise()
		}
	}
	t.Logf("%6.1fs: inserted %d events in %d transactions; settling", time.Since(began).Seconds(), events, m.txns)
	e.settle(m.finalWait, nil)
	e.stop()
}

// runDrift drops the mapped headers column while the relay runs: Run must
// return an error naming it, having confirmed nothing from the change on;
// restarted with outbox.columns.headers = "-" it must lose nothing.
func runDrift(t *testing.T, seed uint64) {
	g := newGen(seed, "jsonb")
	e := newEnv(t, "jsonb", g, seed, false)
	e.start(e.cfg)
	batch := func(n int) {
		for range n {
			evs := make([]ev, 1+e.rng.IntN(20))
			for j := range evs {
				evs[j] = g.event(true)
			}
			e.insert(evs)
		}
	}
	batch(15)
	time.Sleep(time.Second)
	e.probeEnds()
	pre := len(e.ends)

	// What the relay must still send for the rows before the change: their
	// headers, read before the column goes.
	preDrop := map[int64]*string{}
	for _, r := range e.rows(nil) {
		preDrop[r.N] = r.Headers
	}
	dropAt := time.Now()
	e.pg.Exec(t, `ALTER TABLE outbox DROP COLUMN headers`)
	e.headersColumn = false
	batch(15)
	e.probeEnds()
	if len(e.ends) <= pre {
		t.Fatalf("probe saw %d outbox transactions after the drop; want 15", len(e.ends)-pre)
	}
	firstAfter := e.ends[pre]

	var runErr error
	select {
	case runErr = <-e.run.done:
		e.run.exited = true
	case <-time.After(60 * time.Second):
		t.Fatalf("relay still running 60s after the mapped column headers was dropped; want Run to return an error naming it")
	}
	stoppedAt := time.Now()
	t.Logf("Run returned %.1fs after the drop: %v", stoppedAt.Sub(dropAt).Seconds(), runErr)
	if runErr == nil || errors.Is(runErr, context.Canceled) || !strings.Contains(runErr.Error(), "headers") {
		t.Errorf("Run = %v; want an error naming the dropped column \"headers\"", runErr)
	}
	if slot, cp := e.slotConfirmed(), e.checkpoint(); slot >= firstAfter || cp >= firstAfter {
		t.Errorf("after the stop: slot confirmed_flush_lsn %s, checkpoint %s; want both before %s, the end of the first transaction without the headers column (it could not be delivered whole)",
			slot, cp, firstAfter)
	}

	// The operator fixes the config and restarts.
	e.cfg.Router.Columns.Headers = router.NoHeaders
	e.start(e.cfg)
	e.down = append(e.down, Interval{dropAt, time.Now()})
	batch(5)
	e.settle(90*time.Second, preDrop)
	e.stop()
}
