package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// retryConfig is the fixture's config with a fast retry worker and client
// topic auto-creation off, so that a missing topic is a per-event failure.
func (f *fixture) retryConfig(t *testing.T) relay.Config {
	cfg := f.config(t)
	cfg.Sink.AllowAutoTopicCreation = false
	cfg.Retry = retry.WorkerConfig{BackoffMin: 200 * time.Millisecond, BackoffMax: time.Second, PollInterval: 200 * time.Millisecond}
	return cfg
}

func (f *fixture) retryStore(t *testing.T) *retry.Store {
	s, err := retry.NewStore(f.pool, "outbox_relay_retry", f.slot)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// retryRows returns the retry table's rows by event id (or event key).
func (f *fixture) retryRows(t *testing.T) map[string]retry.Entry {
	t.Helper()
	es, err := f.retryStore(t).List(context.Background(), retry.Filter{Limit: 10000})
	if err != nil {
		t.Fatalf("list retry rows: %v", err)
	}
	out := map[string]retry.Entry{}
	for _, e := range es {
		id := e.EventID
		if id == "" {
			id = e.EventKey
		}
		out[id] = e
	}
	return out
}

// insertRaw inserts one event with SQL NULL for fields given as "<nil>".
func (f *fixture) insertRaw(t *testing.T, e event) {
	t.Helper()
	_, err := f.pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers)
		VALUES ($1, nullif($2, '<nil>'), nullif($3, '<nil>'), $4, $5::jsonb, nullif($6, '')::jsonb)`,
		e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload, e.Headers)
	if err != nil {
		t.Fatalf("insert %+v: %v", e.ID, err)
	}
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s; last state: %s", timeout, what, state)
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// TestFailedEventsGoToRetryTable: each kind of per-event failure lands in the
// retry table with a readable reason (dead at once when retrying cannot help),
// while the other events keep flowing and the LSN keeps advancing; a missing
// topic is retried by the worker and delivered, in order with the event of the
// same aggregate that waited behind it, once the topic exists.
func TestFailedEventsGoToRetryTable(t *testing.T) {
	f := newFixture(t)
	// A user's outbox table may allow NULLs: the relay must cope.
	f.pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN aggregate_type DROP NOT NULL, ALTER COLUMN aggregate_id DROP NOT NULL`)
	run := f.start(t, f.retryConfig(t))

	mk := func(aggType, aggID, payload, headers string) event {
		return event{ID: newUUID(), AggregateType: aggType, AggregateID: aggID, EventType: "Changed", Payload: payload, Headers: headers}
	}
	missing := f.prefix + ".Missing"
	bad := map[string]struct {
		ev     event
		dead   bool
		reason string
	}{
		"invalid topic":  {mk("Bad Type!", "x-1", `{}`, ""), true, "Kafka topic names may contain only"},
		"null type":      {mk("<nil>", "x-2", `{}`, ""), true, "aggregate type"},
		"null id":        {mk("Order", "<nil>", `{}`, ""), true, "aggregate id"},
		"too large":      {mk("Order", "x-3", `{"blob": "`+strings.Repeat("x", 1_500_000)+`"}`, ""), true, "larger than"},
		"missing topic":  {mk("Missing", "m-1", `{"seq": 1}`, ""), false, "does not exist"},
		"waiting on m-1": {mk("Missing", "m-1", `{"seq": 2}`, ""), false, "waiting behind"},
	}
	// (A headers value that is not a JSON object is no failure: see
	// TestHeadersCannotOverrideIdentity.)
	order := []string{"invalid topic", "null type", "null id", "too large", "missing topic", "waiting on m-1"}
	codes := map[string]string{"invalid topic": router.CodeTopicInvalid, "null type": router.CodeAggregateTypeEmpty,
		"null id": router.CodeAggregateIDEmpty, "too large": sink.CodeMessageTooLarge, "waiting on m-1": ""}

	good := 0
	for _, name := range order {
		f.insertTx(t, f.makeEvents(20))
		good += 20
		f.insertRaw(t, bad[name].ev)
	}
	f.insertTx(t, f.makeEvents(20))
	good += 20

	// The good events all arrive, and the slot passes every transaction.
	f.waitCount(t, good, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	if rep := f.checkDelivered(t); rep.duplicates != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("good events: duplicates %d, order violations %d, mismatches %d: %s", rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}

	rows := f.retryRows(t)
	for _, name := range order {
		b := bad[name]
		e, ok := rows[b.ev.ID]
		if !ok {
			t.Errorf("%s: event %s is not in the retry table; rows: %d", name, b.ev.ID, len(rows))
			continue
		}
		if dead := e.Status == retry.StatusDead; dead != b.dead {
			t.Errorf("%s: status %q; want dead = %v", name, e.Status, b.dead)
		}
		if !strings.Contains(e.LastError, b.reason) {
			t.Errorf("%s: last_error %q; want it to say %q", name, e.LastError, b.reason)
		}
		// The reason's code is stored beside it, for the CLI to name the
		// settings (a missing topic's depends on the sink's auto-creation).
		if want, ok := codes[name]; ok && e.ReasonCode != want {
			t.Errorf("%s: reason_code %q; want %q", name, e.ReasonCode, want)
		}
	}
	if len(rows) != len(order) {
		t.Errorf("retry table holds %d rows; want %d", len(rows), len(order))
	}

	// The missing topic appears: the worker delivers m-1's two events in
	// order, without an operator, and the aggregate is unblocked.
	f.kafka.CreateTopic(t, missing, 2)
	waitFor(t, time.Minute, "m-1's events delivered from the retry table", func() (bool, string) {
		got := f.kafka.ReadAll(t, missing)
		return len(got) == 2, fmt.Sprintf("%d on %s, %d retry rows", len(got), missing, len(f.retryRows(t)))
	})
	got := f.kafka.ReadAll(t, missing)
	if string(got[0].Value) != `{"seq": 1}` || string(got[1].Value) != `{"seq": 2}` {
		t.Errorf("%s holds %q, %q; want seq 1 then seq 2", missing, got[0].Value, got[1].Value)
	}
	f.insertRaw(t, mk("Missing", "m-1", `{"seq": 3}`, ""))
	waitFor(t, time.Minute, "m-1's next event delivered directly", func() (bool, string) {
		got := f.kafka.ReadAll(t, missing)
		return len(got) == 3, fmt.Sprintf("%d on %s", len(got), missing)
	})
	if rows := f.retryRows(t); len(rows) != 4 {
		t.Errorf("after the topic appeared: %d retry rows; want the 4 dead ones", len(rows))
	}
	run.stop(t)
}

// TestRetryOrderAcrossRequeue: event 1 of aggregate A fails until an operator
// fixes the cause and requeues it; A's events 2-5 wait in the retry table
// while B's are delivered; after the requeue A's 1-5 arrive in order and A's
// next event goes straight to Kafka.
func TestRetryOrderAcrossRequeue(t *testing.T) {
	f := newFixture(t)
	cfg := f.retryConfig(t)
	cfg.Retry.MaxAttempts = 1 // A1 goes dead after one attempt of the worker
	run := f.start(t, cfg)

	late := f.prefix + ".Late"
	var aIDs []string
	for i := 1; i <= 5; i++ {
		e := event{ID: newUUID(), AggregateType: "Late", AggregateID: "a", EventType: "Changed", Payload: fmt.Sprintf(`{"seq": %d}`, i)}
		aIDs = append(aIDs, e.ID)
		f.insertTx(t, append(f.makeEvents(10), e))
	}
	f.waitCount(t, 50, time.Minute) // B: the other aggregates
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)

	store := f.retryStore(t)
	waitFor(t, 30*time.Second, "A1 dead after one attempt, A2-A5 waiting", func() (bool, string) {
		rows := f.retryRows(t)
		if len(rows) != 5 {
			return false, fmt.Sprintf("%d rows", len(rows))
		}
		a1 := rows[aIDs[0]]
		return a1.Status == retry.StatusDead && a1.Attempts == 1, fmt.Sprintf("A1 %s after %d attempts: %s", a1.Status, a1.Attempts, a1.LastError)
	})
	rows := f.retryRows(t)
	for i, id := range aIDs[1:] {
		if e := rows[id]; !e.Waiting || e.Status != retry.StatusPending || e.Attempts != 0 {
			t.Errorf("A%d: status %s, waiting %v, attempts %d; want pending, waiting, 0 attempts", i+2, e.Status, e.Waiting, e.Attempts)
		}
	}

	// The operator creates the topic and requeues A1 (after the sink's 1s
	// metadata TTL, as an operator would take longer anyway).
	f.kafka.CreateTopic(t, late, 1)
	time.Sleep(1500 * time.Millisecond)
	if _, err := store.Requeue(context.Background(), []string{aIDs[0]}); err != nil {
		t.Fatalf("Requeue(A1): %v", err)
	}
	waitFor(t, time.Minute, "A1-A5 delivered after the requeue", func() (bool, string) {
		got := f.kafka.ReadAll(t, late)
		return len(got) == 5, fmt.Sprintf("%d on %s", len(got), late)
	})
	for i, m := range f.kafka.ReadAll(t, late) {
		var p struct{ Seq int }
		json.Unmarshal(m.Value, &p)
		if p.Seq != i+1 {
			t.Errorf("%s[%d] = %s; want seq %d (A's commit order)", late, i, m.Value, i+1)
		}
	}
	waitFor(t, 10*time.Second, "retry table empty", func() (bool, string) {
		n := len(f.retryRows(t))
		return n == 0, fmt.Sprintf("%d rows", n)
	})

	// A is unblocked: its next event goes to Kafka directly.
	f.insertTx(t, []event{{ID: newUUID(), AggregateType: "Late", AggregateID: "a", EventType: "Changed", Payload: `{"seq": 6}`}})
	waitFor(t, 30*time.Second, "A6 delivered", func() (bool, string) {
		got := f.kafka.ReadAll(t, late)
		return len(got) == 6, fmt.Sprintf("%d on %s", len(got), late)
	})
	if n := len(f.retryRows(t)); n != 0 {
		t.Errorf("A6 went through the retry table (%d rows); want A unblocked", n)
	}
	run.stop(t)
}

// checkDelivered checks the events on the fixture's topics, without requiring
// every outbox row to be there (some are in the retry table).
func (f *fixture) checkDelivered(t *testing.T) report {
	rep := f.check(t, f.readAll(t))
	rep.lost = 0
	return rep
}
