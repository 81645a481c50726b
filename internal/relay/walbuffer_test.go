package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"

	outboxevent "github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// blockedSink is a stream sink whose broker can be made unreachable: while
// blocked its Sends wait (as sink.Kafka's do through an outage), Outage
// says so, and Ping fails.
type blockedSink struct {
	relay.Sink
	mu      sync.Mutex
	since   time.Time
	release chan struct{}
	// sticky: after unblock, Outage still reports the outage until a Send
	// or Write succeeds, as sink.Kafka's does (it learns that Kafka is
	// back only by writing to it).
	sticky bool
	stale  bool
}

// blocked reports whether the broker is unreachable now (Outage may say
// so for longer: sticky).
func (s *blockedSink) blocked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.release != nil
}

// wrote records a successful Send or Write: a sticky outage is over.
func (s *blockedSink) wrote() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stale {
		s.since, s.stale = time.Time{}, false
	}
}

func (s *blockedSink) block() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.since, s.release = time.Now(), make(chan struct{})
}

func (s *blockedSink) unblock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release != nil {
		close(s.release)
	}
	s.release = nil
	if s.sticky && !s.since.IsZero() {
		s.stale = true
		return
	}
	s.since = time.Time{}
}

func (s *blockedSink) wait(ctx context.Context) error {
	s.mu.Lock()
	rel := s.release
	s.mu.Unlock()
	if rel == nil {
		return nil
	}
	select {
	case <-rel:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

var errBlocked = errors.New("test: the broker is blocked")

func (s *blockedSink) Send(ctx context.Context, evs []outboxevent.Event) sink.Delivery {
	if err := s.wait(ctx); err != nil {
		return failedDelivery{err}
	}
	d := s.Sink.Send(ctx, evs)
	if s.sticky {
		return stickyDelivery{d, s}
	}
	return d
}

// stickyDelivery ends a sticky blockedSink's outage once Kafka acknowledged.
type stickyDelivery struct {
	sink.Delivery
	s *blockedSink
}

func (d stickyDelivery) Wait(ctx context.Context) error {
	err := d.Delivery.Wait(ctx)
	if err == nil {
		d.s.wrote()
	}
	return err
}

func (s *blockedSink) Write(ctx context.Context, evs []outboxevent.Event) error {
	if err := s.wait(ctx); err != nil {
		return err
	}
	err := s.Sink.Write(ctx, evs)
	if err == nil {
		s.wrote()
	}
	return err
}

func (s *blockedSink) Ping(ctx context.Context) error {
	if s.blocked() {
		return errBlocked
	}
	return s.Sink.Ping(ctx)
}

func (s *blockedSink) Outage() (time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.release != nil || s.stale {
		return s.since, errBlocked
	}
	return s.Sink.Outage()
}

type failedDelivery struct{ err error }

func (d failedDelivery) Done() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}
func (d failedDelivery) Wait(context.Context) error { return d.err }

// walBuffered counts the events the WAL buffer holds for the fixture's slot.
func (f *fixture) walBuffered(t *testing.T) int {
	t.Helper()
	var held int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_relay_wal_buffer WHERE slot_name = $1`, f.slot).Scan(&held); err != nil {
		t.Fatal(err)
	}
	return held
}

// bufferedPast requires events in the WAL buffer once the slot is confirmed
// past confirmed with Kafka blocked, and returns how many.
func (f *fixture) bufferedPast(t *testing.T, confirmed pglogrepl.LSN) int {
	t.Helper()
	held := f.walBuffered(t)
	if held == 0 {
		t.Fatalf("the slot was confirmed past undelivered events, but the WAL buffer holds none of them")
	}
	t.Logf("confirmed past %s with Kafka blocked; %d events in the buffer", confirmed, held)
	return held
}

// blockedRelay builds a relay of cfg whose stream sink is a blockedSink
// around newSinks' own.
func blockedRelay(t *testing.T, cfg relay.Config) (*relay.Relay, *blockedSink) {
	t.Helper()
	sinks, err := newSinks(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	bs := &blockedSink{Sink: sinks.Stream}
	sinks.Stream = bs
	r, err := relay.New(cfg, sinks)
	if err != nil {
		t.Fatal(err)
	}
	return r, bs
}

// TestWALBuffer: with the broker unreachable and other tables writing WAL,
// a relay with postgres.max_retained_wal buffers what it reads in the WAL
// buffer table and confirms its slot past events Kafka never took; when
// the broker is back every event arrives in per-aggregate commit order,
// with the headers it had, the buffer empties, and the relay streams live
// again.
func TestWALBuffer(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MaxRetainedWAL = 4 << 20
	cfg.Metrics = metrics.New()
	ctx := context.Background()
	// The relay's role may log running-xacts records where the server has
	// the function (16+), as setup --print-sql grants.
	var version int
	if err := f.pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	if pc, err := pgx.ParseConfig(f.pg.DSN); err != nil {
		t.Fatal(err)
	} else if _, err := testenv.SuperuserConnIn(t, f.pg.DSN).Exec(ctx, outboxsql.GrantLogSnapshots(pc.User)); err != nil {
		t.Fatal(err)
	}
	r, bs := blockedRelay(t, cfg)
	runRelay(t, r)

	// Live first.
	f.insertTx(t, f.makeEvents(20))
	f.waitCount(t, 20, 30*time.Second)

	bs.block()
	for i := range 30 {
		f.insertTx(t, f.makeEvents(10))
		f.noiseWAL(t, 1)
		if i%10 == 9 {
			time.Sleep(time.Second)
		}
	}
	// An event the router refuses, buffered with its reason and the
	// reason's code: its retry row says both, as without the buffer.
	refused := event{ID: newUUID(), AggregateType: "Bad Type!", AggregateID: "r-1", EventType: "Changed", Payload: `{}`}
	f.insertRaw(t, refused)
	blockedLSN := f.commitEnds(t)
	last := blockedLSN[len(blockedLSN)-1]
	// The slot moves past events Kafka has not taken: they are in the buffer.
	f.waitConfirmed(t, last, 60*time.Second)
	var coded int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_wal_buffer WHERE slot_name = $1 AND get_byte(event, 0) = 2`, f.slot).Scan(&coded); err != nil || coded != 1 {
		t.Errorf("entries with a reason code (encoding version 2) in the buffer: %d, %v; want 1 (the refused event)", coded, err)
	}
	held := f.bufferedPast(t, last)
	// lag and status say so, and the metrics.
	lr, err := ops.Lag(ctx, f.pool, ops.Config{Slot: f.slot})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	if err := lr.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if lr.Buffer == nil || lr.Buffer.Events != int64(held) || !strings.Contains(text.String(), "BUFFERING") {
		t.Errorf("lag while buffering: wal_buffer %+v, text:\n%s\nwant %d events and a BUFFERING line", lr.Buffer, text.String(), held)
	}
	if sr, err := ops.Status(ctx, f.pool, ops.Config{Slot: f.slot}); err != nil || sr.Buffer == nil {
		t.Errorf("status while buffering: wal_buffer %+v, %v; want it", sr.Buffer, err)
	}
	if v := gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active"); v != 1 {
		t.Errorf("outbox_relay_wal_buffer_active = %v while buffering; want 1", v)
	}
	// Confirmed past a quarter of the bound: the relay logs running-xacts
	// records (every walbuffer.NudgeEvery) so that its slot follows, by
	// pg_log_standby_snapshot() on 16+ (granted above), else by a
	// temporary slot; none is left behind.
	for deadline := time.Now().Add(3 * walbuffer.NudgeEvery); counter(t, cfg.Metrics, "outbox_relay_wal_snapshots_logged_total") == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Postgres %d: outbox_relay_wal_snapshots_logged_total = 0 while buffering past a quarter of the bound; want records logged", version)
		}
	}
	var temporary int
	if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'outbox_relay_xacts_%' AND NOT active`).Scan(&temporary); err != nil || temporary != 0 {
		t.Errorf("inactive temporary slots of the relay's records: %d, %v; want none", temporary, err)
	}

	// Events keep coming while the buffer drains: the relay leaves
	// buffering with some of them still buffered, drains those before it
	// streams live, and none overtakes another.
	bs.unblock()
	more := 0
	for deadline := time.Now().Add(90 * time.Second); ; more++ {
		if held = f.walBuffered(t); (held == 0 && more >= 40) || time.Now().After(deadline) {
			break
		}
		f.insertTx(t, f.makeEvents(2))
		time.Sleep(50 * time.Millisecond)
	}
	f.insertTx(t, f.makeEvents(20))
	waitFor(t, 90*time.Second, "the refused event's retry row", func() (bool, string) {
		_, ok := f.retryRows(t)[refused.ID]
		return ok, fmt.Sprintf("%d retry rows", len(f.retryRows(t)))
	})
	if e := f.retryRows(t)[refused.ID]; e.Status != retry.StatusDead || e.ReasonCode != router.CodeTopicInvalid || !strings.Contains(e.LastError, "Kafka topic names may contain only") {
		t.Errorf("the refused event's retry row after the buffer: status %q, reason_code %q, last_error %q; want dead, %q, the reason",
			e.Status, e.ReasonCode, e.LastError, router.CodeTopicInvalid)
	}
	// Out of the outbox, so that the checks below count only the events
	// that go to Kafka (its retry row keeps it).
	if _, err := f.pool.Exec(ctx, `DELETE FROM outbox WHERE id = $1`, refused.ID); err != nil {
		t.Fatal(err)
	}
	// Every row, not a count: the relay leads again from its checkpoint on
	// each switch, and the duplicates that resends would make a count of
	// messages reach n before the last events are in.
	f.waitAll(t, 90*time.Second)
	rep := f.check(t, f.readAll(t))
	if rep.lost != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("lost %d, order violations %d, mismatches %d: %s", rep.lost, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	// The buffer empties and the relay streams live again.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if held = f.walBuffered(t); held == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the WAL buffer still holds %d events 60s after Kafka came back", held)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// It leaves buffering just after the slot moved (walbuffer.LeaveGate):
	// within MaxLeaveWait of the buffer emptying.
	for deadline := time.Now().Add(walbuffer.MaxLeaveWait + 30*time.Second); ; time.Sleep(200 * time.Millisecond) {
		if v := gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active"); v == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("outbox_relay_wal_buffer_active = %v %s after the buffer emptied; want 0 (live again)", v, walbuffer.MaxLeaveWait+30*time.Second)
		}
	}
	f.insertTx(t, f.makeEvents(5))
	f.waitAll(t, 30*time.Second)
	got := f.readAll(t)
	if v := gauge(t, cfg.Metrics, "outbox_relay_wal_buffer_active"); v != 0 {
		t.Errorf("outbox_relay_wal_buffer_active = %v once live again; want 0", v)
	}
	if lr, err := ops.Lag(ctx, f.pool, ops.Config{Slot: f.slot}); err != nil || lr.Buffer != nil {
		t.Errorf("lag once the buffer is empty: wal_buffer %+v, %v; want none", lr.Buffer, err)
	}
	if rep := f.check(t, got); rep.lost != 0 || rep.orderViolations != 0 {
		t.Fatalf("after the buffer emptied: lost %d, order violations %d: %s", rep.lost, rep.orderViolations, rep.firstProblem)
	}
	t.Logf("duplicates %d", rep.duplicates)
}

// TestWALBufferDrainRate measures how fast a buffer drains against how fast
// the relay delivers the same backlog live (docs/wal-buffer.md quotes it).
// RELAY_TEST_MEASURE=1 only: it writes 2 × 50,000 events.
func TestWALBufferDrainRate(t *testing.T) {
	if os.Getenv("RELAY_TEST_MEASURE") == "" {
		t.Skip("a measurement: RELAY_TEST_MEASURE=1")
	}
	const n = 50000
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MaxRetainedWAL = 64 << 20
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx := context.Background()
	r, bs := blockedRelay(t, cfg)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	insert := func() {
		for i := 0; i < n; i += 1000 {
			f.insertTx(t, f.makeEvents(1000))
		}
	}
	held := func() int {
		var c int
		if err := f.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_relay_wal_buffer WHERE slot_name = $1`, f.slot).Scan(&c); err != nil {
			return -1
		}
		return c
	}
	// Live: the backlog of n events, from the insert's end to the last
	// confirmed.
	f.insertTx(t, f.makeEvents(10))
	f.waitCount(t, 10, 30*time.Second)
	// Kafka blocked while the backlog is written, then back: the relay
	// delivers it live (nothing buffers: the slot retains less than half
	// the bound).
	bs.block()
	insert()
	ends := f.commitEnds(t)
	if held() > 0 {
		t.Fatalf("the live backlog went to the buffer")
	}
	bs.unblock()
	began := time.Now()
	f.waitConfirmed(t, ends[len(ends)-1], 5*time.Minute)
	live := time.Since(began)

	// Buffered: n events in the buffer (WAL of another table makes the slot
	// retain enough to switch), then Kafka back.
	bs.block()
	f.insertTx(t, f.makeEvents(10))
	f.pg.Exec(t, `CREATE TABLE rate_noise (b bytea)`)
	for held() <= 0 {
		f.pg.Exec(t, `INSERT INTO rate_noise SELECT decode(string_agg(md5(random()::text), ''), 'hex') FROM generate_series(1, 200000)`)
		f.insertTx(t, f.makeEvents(1))
		time.Sleep(200 * time.Millisecond)
	}
	insert()
	ends = f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], 5*time.Minute)
	h := held()
	bs.unblock()
	began = time.Now()
	for held() > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	drain := time.Since(began)
	t.Logf("live: %d events in %s (%.0f events/s); drain: %d buffered events in %s (%.0f events/s)",
		n, live.Round(time.Millisecond), n/live.Seconds(), h, drain.Round(time.Millisecond), float64(h)/drain.Seconds())
}

// gauge reads a gauge of m by name.
func gauge(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	return metric(t, m, name).GetGauge().GetValue()
}

// counter reads a counter of m by name.
func counter(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	return metric(t, m, name).GetCounter().GetValue()
}

// metric returns the first series of m's metric name.
func metric(t *testing.T, m *metrics.Metrics, name string) *dto.Metric {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0]
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestWALBufferDrainsFirst: a term that left buffering with events still in
// the buffer delivers them before anything it streams, and leads while it
// does (with HA, leading is holding the slot: a drain that waited for the
// lease before streaming waited for ever).
func TestWALBufferDrainsFirst(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MaxRetainedWAL = 64 << 20
	ctx := context.Background()
	tbl, err := walbuffer.TableFor("")
	if err != nil {
		t.Fatal(err)
	}
	store, err := walbuffer.NewStore(f.pool, tbl, f.slot)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	// The rest of a buffer: events of the first aggregates' sequences,
	// committed before the slot's position.
	var rest []walbuffer.Entry
	for i, e := range f.makeEvents(30) {
		rest = append(rest, walbuffer.Entry{Event: outboxevent.Event{
			ID: e.ID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Type: e.EventType,
			Topic: f.prefix + "." + e.AggregateType, Key: []byte(e.AggregateID), Value: []byte(e.Payload),
			Headers:   []outboxevent.Header{{Key: "id", Value: []byte(e.ID)}, {Key: "event_type", Value: []byte(e.EventType)}, {Key: "aggregate_type", Value: []byte(e.AggregateType)}},
			CommitLSN: 0x100, Pos: i + 1, Table: "public.outbox",
		}})
	}
	if err := store.Append(ctx, rest); err != nil {
		t.Fatal(err)
	}
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	relay.DrainFirstNext(r)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	f.insertTx(t, f.makeEvents(20)) // streamed after the rest
	got := waitRead(t, f.readAll, 50, 60*time.Second)
	// Per aggregate, the buffered events (earlier sequence numbers) come
	// first: check's order is the payloads' sequence per key, Kafka's order.
	sort.Slice(got, func(i, j int) bool {
		a, b := got[i], got[j]
		return a.Topic < b.Topic || a.Topic == b.Topic && (a.Partition < b.Partition || a.Partition == b.Partition && a.Offset < b.Offset)
	})
	seen := map[string]int{}
	for _, d := range got {
		var p struct {
			Agg string `json:"agg"`
			Seq int    `json:"seq"`
		}
		if err := json.Unmarshal([]byte(d.Value), &p); err != nil {
			t.Fatal(err)
		}
		if p.Seq <= seen[d.Topic+"/"+p.Agg] {
			t.Errorf("%s: seq %d after %d: a streamed event overtook a buffered one", p.Agg, p.Seq, seen[d.Topic+"/"+p.Agg])
		}
		seen[d.Topic+"/"+p.Agg] = p.Seq
	}
	if any, _ := store.Any(ctx); any {
		t.Errorf("rows left in the WAL buffer after the drain")
	}
}
