package relay

// Unit tests of the pipeline's failure logic, without Postgres or Kafka: the
// real route stage, writer, committer, gate and window, wired by newPipeline
// as lead wires them, with hand-written fakes at the boundaries (sink, retry
// table, the lease's fence and fenced save, the stream's Confirm, the
// checkpoint history). Integration tests against real servers are in
// relay_test.go and beside it.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sinkapi"
	"github.com/outbox-relay/outbox-relay/sql"
)

// ledger records, in order, what happened to each event (by position key)
// and every confirmation, and checks invariant 1 on each Confirm: every event
// of a transaction ending at or before the confirmed LSN is acknowledged or
// stored.
type ledger struct {
	mu        sync.Mutex
	handled   map[string]string // position key → "acked" or "parked"
	acked     []event.Event     // in acknowledgement order
	parked    []retry.Event     // in storage order
	confirmed []pglogrepl.LSN
	saved     []pglogrepl.LSN
	ends      map[pglogrepl.LSN][]string // txn end LSN → its events' position keys
	problems  []string
}

func newLedger() *ledger {
	return &ledger{handled: map[string]string{}, ends: map[pglogrepl.LSN][]string{}}
}

func (l *ledger) problem(format string, args ...any) {
	l.problems = append(l.problems, fmt.Sprintf(format, args...))
}

// Confirm is the stream's side.
func (l *ledger) Confirm(lsn pglogrepl.LSN) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.confirmed); n > 0 && lsn < l.confirmed[n-1] {
		l.problem("confirmed %s after %s: backwards", lsn, l.confirmed[n-1])
	}
	for end, keys := range l.ends {
		if end > lsn {
			continue
		}
		for _, k := range keys {
			if l.handled[k] == "" {
				l.problem("confirmed %s before event %s (txn ending %s) was acknowledged or stored", lsn, k, end)
			}
		}
	}
	l.confirmed = append(l.confirmed, lsn)
}

// Restart is the stream's side too: nothing to close here.
func (l *ledger) Restart() {}

// save is the lease's side: the fenced checkpoint save.
func (l *ledger) Save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := len(l.saved); n > 0 && lsn <= l.saved[n-1] {
		l.problem("checkpoint %s saved after %s: not forward", lsn, l.saved[n-1])
	}
	l.saved = append(l.saved, lsn)
	return nil
}

func (l *ledger) lastConfirmed() pglogrepl.LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.confirmed) == 0 {
		return 0
	}
	return l.confirmed[len(l.confirmed)-1]
}

// fakeSink is the in-memory sink of the contract (sinkapi.Memory): it
// acknowledges every event but those Refuse refuses, and keeps the lane
// rules (ErrBehind) as sink.Kafka does. startPipe points its Ack at the
// test's ledger.
type fakeSink = sinkapi.Memory

// ack records events a sink acknowledged.
func (l *ledger) ack(evs []event.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range evs {
		l.handled[e.PositionKey()] = "acked"
		l.acked = append(l.acked, e)
	}
}

// fakeRetry is an in-memory retry table.
type fakeRetry struct{ l *ledger }

func (t *fakeRetry) Insert(ctx context.Context, evs []retry.Event) error {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	for _, e := range evs {
		if t.l.handled[e.EventKey] == "parked" {
			continue
		}
		t.l.handled[e.EventKey] = "parked"
		t.l.parked = append(t.l.parked, e)
	}
	return nil
}

func (t *fakeRetry) Aggregates(ctx context.Context, limit int) ([]string, error) {
	t.l.mu.Lock()
	defer t.l.mu.Unlock()
	var out []string
	for _, e := range t.l.parked {
		if !slices.Contains(out, e.Aggregate) {
			out = append(out, e.Aggregate)
		}
	}
	slices.Sort(out)
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

func (t *fakeRetry) Undelivered(ctx context.Context, aggs []string) (map[string]bool, error) {
	have, _ := t.Aggregates(ctx, 0)
	out := map[string]bool{}
	for _, a := range aggs {
		out[a] = slices.Contains(have, a)
	}
	return out, nil
}

// errTooLarge is a refusal of the fake sink's: permanent, as Kafka's refusal
// of a too-large message is.
var errTooLarge = errors.New("the message is larger than Kafka accepts")

var testOutbox = &replication.Relation{Namespace: "public", Name: "outbox", Columns: []replication.Column{
	{Name: "id"}, {Name: "aggregate_type"}, {Name: "aggregate_id"}, {Name: "event_type"}, {Name: "payload"}, {Name: "headers"},
}}

// txn is one transaction of the test stream: its events as (aggregate type,
// aggregate id, payload).
type txn [][3]string

// pipe is the pipeline under test.
type pipe struct {
	l      *ledger
	pl     *pipeline
	in     chan replication.Batch
	stop   chan struct{}
	done   chan error
	cancel context.CancelFunc
	lsn    pglogrepl.LSN
}

type pipeConfig struct {
	sink              *fakeSink
	fence             leader.Fence // nil: a fence that always lets the writer write
	maxInFlightEvents int
	batchSize         int
	history           historyRecorder // nil: a history that records nothing
}

// open is a fence that always lets the writer write: this relay leads.
type open struct{}

func (open) Check(context.Context) error { return nil }

// noHistory is a checkpoint history that records nothing.
type noHistory struct{}

func (noHistory) Record(context.Context, string, pglogrepl.LSN, time.Time) error { return nil }
func (noHistory) PruneHistory(context.Context, string, time.Duration, int) (int64, error) {
	return 0, nil
}

func startPipe(t *testing.T, pc pipeConfig) *pipe {
	t.Helper()
	l := newLedger()
	if pc.sink == nil {
		pc.sink = &fakeSink{}
	}
	pc.sink.Ack = l.ack
	if pc.fence == nil {
		pc.fence = open{}
	}
	if pc.history == nil {
		pc.history = noHistory{}
	}
	if pc.maxInFlightEvents == 0 {
		pc.maxInFlightEvents = 1000
	}
	if pc.batchSize == 0 {
		pc.batchSize = 100
	}
	log := slog.New(slog.DiscardHandler)
	cfg := Config{Replication: replication.Config{DSN: "unused", Slot: "s"}, MaxInFlightEvents: pc.maxInFlightEvents,
		CheckpointInterval: time.Millisecond, StallAfter: time.Minute, Router: router.Config{Topic: "t.{aggregate_type}"}, Logger: log}
	cfg.Sink.BatchSize = pc.batchSize
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	rt, err := router.New(cfg.Router)
	if err != nil {
		t.Fatal(err)
	}
	gt := newGate(&fakeRetry{l}, log)
	if err := gt.load(context.Background()); err != nil {
		t.Fatal(err)
	}
	pl := newPipeline(cfg, ends{
		routers: []*router.Router{rt}, placers: []*placement.Placer{placement.New(nil, placement.Config{Outbox: sql.Table{Schema: "public", Name: "outbox"}})},
		sink: pc.sink, gate: gt, fence: pc.fence, saver: l, stream: l, history: pc.history,
	}, 0)

	p := &pipe{l: l, pl: pl, in: make(chan replication.Batch), stop: make(chan struct{}), done: make(chan error, 1), lsn: 0x1000}
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	// As lead runs it: a stage's failure cancels the others.
	g, gctx := errgroup.WithContext(ctx)
	pl.run(gctx, g, p.stop, p.in, func(err error) error { return err }, func() {})
	go pl.hist.run(ctx)
	go func() {
		if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
			p.done <- err
			return
		}
		p.done <- nil
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			t.Error("pipeline did not stop within 5s of cancel")
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, pr := range l.problems {
			t.Error(pr)
		}
	})
	return p
}

// send feeds one transaction, in batches of at most per rows, and returns
// its end LSN.
func (p *pipe) send(t *testing.T, tx txn, per int) pglogrepl.LSN {
	t.Helper()
	commit := p.lsn + pglogrepl.LSN(len(tx))*0x10
	end := commit + 8
	p.lsn = end + 0x10
	var keys []string
	for i := range tx {
		keys = append(keys, event.PositionKey(commit, i+1))
	}
	p.l.mu.Lock()
	p.l.ends[end] = keys
	p.l.mu.Unlock()
	for i := 0; i < len(tx) || i == 0; i += per {
		b := replication.Batch{Xid: uint32(commit), CommitLSN: commit, CommitTime: time.Now()}
		for _, e := range tx[i:min(i+per, len(tx))] {
			vals := [][]byte{[]byte("id-" + e[2]), []byte(e[0]), []byte(e[1]), []byte("Changed"), []byte(e[2]), nil}
			if e[0] == "<nil>" {
				vals[1] = nil
			}
			b.Rows = append(b.Rows, replication.Row{Relation: testOutbox, Values: vals})
			b.Bytes += len(e[2]) + 40
		}
		if i+per >= len(tx) {
			b.Last, b.EndLSN = true, end
		}
		select {
		case p.in <- b:
		case <-time.After(5 * time.Second):
			t.Fatalf("the pipeline did not take a batch within 5s (deadlock?); confirmed %s", p.l.lastConfirmed())
		}
		if len(tx) == 0 {
			break
		}
	}
	return end
}

func (p *pipe) waitConfirmed(t *testing.T, lsn pglogrepl.LSN) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for p.l.lastConfirmed() < lsn {
		if time.Now().After(deadline) {
			t.Fatalf("confirmed %s after 5s; want %s", p.l.lastConfirmed(), lsn)
		}
		time.Sleep(time.Millisecond)
	}
}

// lanes returns the payloads acknowledged per aggregate id, in order.
func (l *ledger) lanes() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for _, e := range l.acked {
		out[e.AggregateID] = append(out[e.AggregateID], string(e.Value))
	}
	return out
}

// dropParked removes agg's rows from the retry table: delivered by the
// worker (their events stay handled).
func (l *ledger) dropParked(agg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.parked = slices.DeleteFunc(l.parked, func(e retry.Event) bool { return e.Aggregate == agg })
}

func (l *ledger) parkedLanes() map[string][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string][]string{}
	for _, e := range l.parked {
		out[e.AggregateID] = append(out[e.AggregateID], string(e.Value)+map[bool]string{true: " (waiting)", false: ""}[e.Waiting])
	}
	return out
}

func TestPipelineConfirmsOnlyHandled(t *testing.T) {
	tests := []struct {
		name string
		sink *fakeSink
		txns []txn
		per  int
	}{
		{"clean", &fakeSink{}, []txn{{{"Order", "a", "1"}, {"Order", "b", "1"}}, {{"Order", "a", "2"}}}, 1},
		{"one refused", &fakeSink{Refuse: func(e *event.Event) error {
			if string(e.Value) == "2" {
				return errTooLarge
			}
			return nil
		}}, []txn{{{"Order", "a", "1"}, {"Order", "a", "2"}, {"Order", "a", "3"}, {"Order", "b", "1"}}, {{"Order", "a", "4"}, {"Order", "b", "2"}}}, 2},
		{"unroutable", &fakeSink{}, []txn{{{"Bad Type!", "a", "1"}, {"Order", "a", "2"}}, {{"<nil>", "c", "1"}}, {{"Order", "b", "1"}}}, 3},
		{"empty transaction", &fakeSink{}, []txn{{}, {{"Order", "a", "1"}}, {}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startPipe(t, pipeConfig{sink: tt.sink})
			var last pglogrepl.LSN
			for _, tx := range tt.txns {
				last = p.send(t, tx, tt.per)
			}
			p.waitConfirmed(t, last)
			// Every event of every transaction is handled, once.
			p.l.mu.Lock()
			for end, keys := range p.l.ends {
				for _, k := range keys {
					if p.l.handled[k] == "" {
						t.Errorf("event %s of txn ending %s neither acknowledged nor stored", k, end)
					}
				}
			}
			p.l.mu.Unlock()
		})
	}
}

// A refused event holds back the later events of its lane, in the retry
// table behind it, and no other lane.
func TestPipelineFailureHoldsItsLaneOnly(t *testing.T) {
	s := &fakeSink{Refuse: func(e *event.Event) error {
		if e.AggregateID == "a" && string(e.Value) == "2" {
			return errTooLarge
		}
		return nil
	}}
	p := startPipe(t, pipeConfig{sink: s})
	p.send(t, txn{{"Order", "a", "1"}, {"Order", "a", "2"}, {"Order", "b", "1"}, {"Order", "a", "3"}}, 4)
	p.send(t, txn{{"Order", "a", "4"}, {"Order", "b", "2"}, {"Customer", "a", "1"}}, 1)
	last := p.send(t, txn{{"Order", "a", "5"}, {"Order", "b", "3"}}, 2)
	p.waitConfirmed(t, last)

	if got, want := p.l.lanes(), map[string][]string{"a": {"1", "1"}, "b": {"1", "2", "3"}}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("acknowledged per aggregate id = %v; want %v (Order/a stops at its refused event 2; Customer/a is another lane)", got, want)
	}
	if got, want := p.l.parkedLanes()["a"], []string{"2", "3 (waiting)", "4 (waiting)", "5 (waiting)"}; !slices.Equal(got, want) {
		t.Errorf("retry table rows of a = %q; want %q", got, want)
	}
	for _, e := range p.l.parked {
		if e.EventKey == "" || !strings.HasPrefix(e.EventKey, "lsn:") || e.EventID != "id-"+string(e.Value) {
			t.Errorf("retry row %+v: want its key from its WAL position and its id from its row", e)
		}
	}
}

// A route failure blocks its lane too, even without an id: the event is
// placed in its aggregate's lane, so the aggregate's next event waits.
func TestPipelineRouteFailureBlocksItsLane(t *testing.T) {
	p := startPipe(t, pipeConfig{})
	commit := p.lsn + 0x20
	b := replication.Batch{CommitLSN: commit, CommitTime: time.Now(), Last: true, EndLSN: commit + 8, Rows: []replication.Row{
		{Relation: testOutbox, Values: [][]byte{nil, []byte("Order"), []byte("a"), []byte("X"), []byte("1"), nil}},
		{Relation: testOutbox, Values: [][]byte{[]byte("id-2"), []byte("Order"), []byte("a"), []byte("X"), []byte("2"), nil}},
		{Relation: testOutbox, Values: [][]byte{[]byte("id-3"), []byte("Order"), []byte("b"), []byte("X"), []byte("3"), nil}},
	}}
	p.l.mu.Lock()
	p.l.ends[commit+8] = []string{event.PositionKey(commit, 1), event.PositionKey(commit, 2), event.PositionKey(commit, 3)}
	p.l.mu.Unlock()
	p.in <- b
	p.waitConfirmed(t, commit+8)
	if got := p.l.lanes(); fmt.Sprint(got) != fmt.Sprint(map[string][]string{"b": {"3"}}) {
		t.Errorf("acknowledged = %v; want only b's event (a's second waits behind its id-less first)", got)
	}
	if got := p.l.parkedLanes()["a"]; !slices.Equal(got, []string{"1", "2 (waiting)"}) {
		t.Errorf("retry rows of a = %q; want the id-less event, then the one waiting behind it", got)
	}
}

// Nothing is confirmed while Kafka holds the writes; everything after.
func TestPipelineHoldsWhileKafkaBlocks(t *testing.T) {
	s := &fakeSink{Block: make(chan struct{})}
	p := startPipe(t, pipeConfig{sink: s})
	last := p.send(t, txn{{"Order", "a", "1"}}, 1)
	time.Sleep(50 * time.Millisecond) // the behaviour under test: nothing moves meanwhile
	if got := p.l.lastConfirmed(); got != 0 {
		t.Fatalf("confirmed %s while Kafka had acknowledged nothing", got)
	}
	close(s.Block)
	p.waitConfirmed(t, last)
}

// A transaction larger than the window goes through (the event limit
// applies at transaction boundaries), and is confirmed whole.
func TestPipelineTransactionLargerThanWindow(t *testing.T) {
	p := startPipe(t, pipeConfig{maxInFlightEvents: 10, batchSize: 5})
	var big txn
	for i := range 100 {
		big = append(big, [3]string{"Order", fmt.Sprint(i % 7), fmt.Sprint(i)})
	}
	p.send(t, txn{{"Order", "x", "first"}}, 1)
	last := p.send(t, big, 3)
	last = max(last, p.send(t, txn{{"Order", "x", "after"}}, 1))
	p.waitConfirmed(t, last)
	if n := len(p.l.acked); n != 102 {
		t.Errorf("acknowledged %d events; want 102", n)
	}
}

// Shutdown stops reading at a transaction boundary: a transaction being
// read is finished, and the final confirmation is its end.
func TestPipelineShutdownAtTransactionBoundary(t *testing.T) {
	p := startPipe(t, pipeConfig{})
	first := p.send(t, txn{{"Order", "a", "1"}}, 1)
	p.waitConfirmed(t, first)

	commit := p.lsn + 0x20
	end := commit + 8
	p.l.mu.Lock()
	p.l.ends[end] = []string{event.PositionKey(commit, 1), event.PositionKey(commit, 2)}
	p.l.mu.Unlock()
	row := func(v string) replication.Row {
		return replication.Row{Relation: testOutbox, Values: [][]byte{[]byte("id-" + v), []byte("Order"), []byte("a"), []byte("X"), []byte(v), nil}}
	}
	p.in <- replication.Batch{CommitLSN: commit, Rows: []replication.Row{row("2")}}
	close(p.stop) // mid-transaction
	select {
	case p.in <- replication.Batch{CommitLSN: commit, Last: true, EndLSN: end, Rows: []replication.Row{row("3")}}:
	case <-time.After(5 * time.Second):
		t.Fatal("the route stage stopped reading in the middle of a transaction")
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("pipeline stopped with %v", err)
		}
		p.done <- nil // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not stop after the transaction ended")
	}
	if got := p.l.lastConfirmed(); got != end {
		t.Errorf("final confirmation %s; want the transaction's end %s", got, end)
	}
	select {
	case p.in <- replication.Batch{CommitLSN: end + 0x10}:
		t.Error("the route stage read a batch after the transaction boundary it stopped at")
	case <-time.After(50 * time.Millisecond):
	}
}

// A schema change (a mapped column gone) stops the pipeline before anything
// from the affected event on is confirmed.
func TestPipelineSchemaChangeStops(t *testing.T) {
	p := startPipe(t, pipeConfig{})
	first := p.send(t, txn{{"Order", "a", "1"}}, 1)
	p.waitConfirmed(t, first)
	noHeaders := &replication.Relation{Namespace: "public", Name: "outbox", Columns: testOutbox.Columns[:5]}
	p.in <- replication.Batch{CommitLSN: p.lsn, Last: true, EndLSN: p.lsn + 8, Rows: []replication.Row{
		{Relation: noHeaders, Values: [][]byte{[]byte("id"), []byte("Order"), []byte("a"), []byte("X"), []byte("2")}}}}
	select {
	case err := <-p.done:
		var se *router.SchemaError
		if !errors.As(err, &se) || se.Column != "headers" {
			t.Fatalf("pipeline stopped with %v; want a *router.SchemaError for column headers", err)
		}
		p.done <- nil
	case <-time.After(5 * time.Second):
		t.Fatal("the pipeline did not stop on a schema change")
	}
	if got := p.l.lastConfirmed(); got != first {
		t.Errorf("confirmed %s; want nothing past %s", got, first)
	}
}
