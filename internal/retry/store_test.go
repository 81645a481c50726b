package retry_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	ev "github.com/outbox-relay/outbox-relay/event"

	"github.com/outbox-relay/outbox-relay/internal/retry"
)

// newStore returns a Store on a fresh retry table in a database of the
// test's own: the one place that knows where the test server is.
func newStore(t *testing.T) *retry.Store {
	t.Helper()
	s, _ := newStoreIn(t)
	return s
}

// event returns a pending event of aggregate agg (topic/key) with id id,
// and an extra header trace: what the pipeline stores.
func event(topic, key, id string) retry.Event {
	return retry.Event{
		EventKey:      id,
		EventID:       id,
		Aggregate:     ev.Lane{Topic: topic, Key: key}.String(),
		AggregateType: "Order",
		AggregateID:   key,
		EventType:     "Created",
		Topic:         topic,
		Key:           []byte(key),
		Value:         []byte(`{"id":"` + id + `"}`),
		Extra:         []retry.Header{{Key: "trace", Value: []byte(id)}},
		Reason:        "topic does not exist",
	}
}

func eventKeys(entries []retry.Entry) []string {
	var keys []string
	for _, e := range entries {
		keys = append(keys, e.EventKey)
	}
	return keys
}

func seqs(entries []retry.Entry) []int64 {
	var out []int64
	for _, e := range entries {
		out = append(out, e.Seq)
	}
	return out
}

func list(t *testing.T, s *retry.Store, f retry.Filter) []retry.Entry {
	t.Helper()
	entries, err := s.List(context.Background(), f)
	if err != nil {
		t.Fatalf("List(%+v): %v", f, err)
	}
	return entries
}

func TestInsertOrderAndIdempotence(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	// Keys that sort differently from insertion order: seq must follow the slice.
	ids := []string{"e5", "e1", "e4", "e2", "e3"}
	var events []retry.Event
	for i, id := range ids {
		e := event("orders", "A", id)
		e.Waiting = i > 0
		events = append(events, e)
	}
	events[4].Permanent = true
	if err := s.Insert(ctx, events); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	got := list(t, s, retry.Filter{})
	if keys := eventKeys(got); !slices.Equal(keys, ids) {
		t.Fatalf("List order = %q; want insertion order %q", keys, ids)
	}
	if !slices.IsSorted(seqs(got)) {
		t.Errorf("seqs = %v; want ascending", seqs(got))
	}
	for i, e := range got {
		wantStatus, wantWaiting := retry.StatusPending, i > 0
		if i == 4 {
			wantStatus, wantWaiting = retry.StatusDead, false
		}
		if e.Status != wantStatus || e.Waiting != wantWaiting || e.Attempts != 0 {
			t.Errorf("row %s: status %q waiting %v attempts %d; want %q %v 0", e.EventKey, e.Status, e.Waiting, e.Attempts, wantStatus, wantWaiting)
		}
		if e.LastError != "topic does not exist" {
			t.Errorf("row %s: last error %q; want the insert's reason", e.EventKey, e.LastError)
		}
	}

	// Again after a "crash", with one new event at the end: only that one is added.
	again := append(slices.Clone(events), event("orders", "A", "e6"))
	again[0].Reason = "changed"
	if err := s.Insert(ctx, again); err != nil {
		t.Fatalf("Insert again: %v", err)
	}
	got2 := list(t, s, retry.Filter{})
	if keys, want := eventKeys(got2), append(slices.Clone(ids), "e6"); !slices.Equal(keys, want) {
		t.Fatalf("after re-insert List = %q; want %q", keys, want)
	}
	if !slices.Equal(seqs(got2[:5]), seqs(got)) || got2[5].Seq <= got2[4].Seq {
		t.Errorf("after re-insert seqs = %v; want %v then a higher one", seqs(got2), seqs(got))
	}
	if got2[0].LastError != "topic does not exist" {
		t.Errorf("re-insert changed the existing row's last error to %q", got2[0].LastError)
	}
}

// Events of a MiB or more are stored on their own (their bytes as raw
// parameters, one copy fewer): among small ones, in order, each byte back as
// given, a nil key as NULL, and a second insert after a "crash" changes
// nothing, big or small.
func TestInsertBigEvents(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	big := func(id string, n int) retry.Event {
		e := event("orders", "A", id)
		e.Value = make([]byte, n)
		for i := range e.Value {
			e.Value[i] = byte(i * 7)
		}
		e.Waiting = true
		return e
	}
	events := []retry.Event{event("orders", "A", "s1"), big("b1", 3<<20), big("b2", 1<<20), event("orders", "A", "s2"), event("orders", "A", "s3"), big("b3", 2<<20)}
	events[0].Permanent = true
	events[5].Key = nil
	if err := s.Insert(ctx, events); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	check := func(when string) {
		t.Helper()
		got := list(t, s, retry.Filter{})
		if keys, want := eventKeys(got), []string{"s1", "b1", "b2", "s2", "s3", "b3"}; !slices.Equal(keys, want) {
			t.Fatalf("%s: List = %q; want %q (insertion order)", when, keys, want)
		}
		for i, e := range events {
			g, err := s.Get(ctx, fmt.Sprint(got[i].Seq))
			if err != nil {
				t.Fatalf("%s: Get(%d): %v", when, got[i].Seq, err)
			}
			if !slices.Equal(g.Value, e.Value) || !slices.Equal(g.Key, e.Key) || (g.Key == nil) != (e.Key == nil) ||
				g.Waiting != (e.Waiting && !e.Permanent) || g.EventID != e.EventID || g.LastError != e.Reason {
				t.Errorf("%s: row %s = key %q, %d value bytes, waiting %t, id %q; want key %q, the %d bytes inserted, waiting %t, id %q",
					when, e.EventKey, g.Key, len(g.Value), g.Waiting, g.EventID, e.Key, len(e.Value), e.Waiting, e.EventID)
			}
		}
	}
	check("after insert")
	if err := s.Insert(ctx, append(slices.Clone(events[1:]), events[0])); err != nil {
		t.Fatalf("Insert again: %v", err)
	}
	check("after inserting them again")
}

func TestGetRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	commit := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	e := event("orders", "A", "11111111-2222-3333-4444-555555555555")
	e.Value = []byte{0x00, 0xff, 'x'}
	e.SourceLSN = 0x16B3748
	e.CommitTime = commit
	e.Code = "topic_missing"
	noID := retry.Event{EventKey: ev.PositionKey(0x16B3748, 1), Aggregate: ev.UnroutableLane("", "9").String(),
		AggregateID: "9", Reason: "the aggregate type is NULL", Permanent: true}
	if err := s.Insert(ctx, []retry.Event{e, noID}); err != nil {
		t.Fatal(err)
	}
	all := list(t, s, retry.Filter{})
	for _, id := range []string{e.EventID, fmt.Sprint(all[0].Seq)} {
		got, err := s.Get(ctx, id)
		if err != nil {
			t.Fatalf("Get(%q): %v", id, err)
		}
		if got.EventID != e.EventID || string(got.Value) != string(e.Value) || string(got.Key) != "A" ||
			got.Topic != "orders" || got.SourceLSN != e.SourceLSN || !got.CommitTime.Equal(commit) ||
			len(got.Extra) != 1 || got.Extra[0].Key != "trace" || string(got.Extra[0].Value) != e.EventID ||
			got.ReasonCode != e.Code {
			t.Errorf("Get(%q) = %+v; want the inserted event back", id, got)
		}
	}
	got, err := s.Get(ctx, "lsn:0/16B3748:1")
	if err != nil {
		t.Fatalf("Get(%q): %v", "lsn:0/16B3748:1", err)
	}
	if got.EventID != "" || got.Topic != "" || got.AggregateType != "" || got.Status != retry.StatusDead || got.Value != nil || got.ReasonCode != "" {
		t.Errorf("Get(%q) = %+v; want NULL id, topic, type and reason code, dead", "lsn:0/16B3748:1", got)
	}
	for _, id := range []string{"nope", "999", "-1", "99999999999999999999"} {
		if _, err := s.Get(ctx, id); !errors.Is(err, retry.ErrNotFound) {
			t.Errorf("Get(%q) error = %v; want ErrNotFound", id, err)
		}
	}
	// List leaves out values.
	for _, e := range list(t, s, retry.Filter{}) {
		if e.Value != nil {
			t.Errorf("List row %d has a value of %d bytes; want none", e.Seq, len(e.Value))
		}
	}
}

func TestAggregatesUndelivered(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a, b := event("orders", "A", "a1"), event("orders", "B", "b1")
	b.Permanent = true // a dead row blocks too
	if err := s.Insert(ctx, []retry.Event{a, b, event("orders", "A", "a2")}); err != nil {
		t.Fatal(err)
	}
	aggs, err := s.Aggregates(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"orders/A", "orders/B"}; !slices.Equal(aggs, want) {
		t.Errorf("Aggregates() = %q; want %q", aggs, want)
	}
	if aggs, err := s.Aggregates(ctx, 1); err != nil || !slices.Equal(aggs, []string{"orders/A"}) {
		t.Errorf("Aggregates(limit 1) = %q, %v; want the first only", aggs, err)
	}
	und, err := s.Undelivered(ctx, []string{"orders/A", "orders/B", "orders/C"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"orders/A": true, "orders/B": true, "orders/C": false}
	if fmt.Sprint(und) != fmt.Sprint(want) {
		t.Errorf("Undelivered() = %v; want %v", und, want)
	}
	if _, err := s.Drop(ctx, []string{"b1"}); err != nil {
		t.Fatal(err)
	}
	und, err = s.Undelivered(ctx, []string{"orders/B"})
	if err != nil || und["orders/B"] {
		t.Errorf("Undelivered(orders/B) after drop = %v, %v; want false", und, err)
	}
}

func TestRequeueAndDrop(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	var events []retry.Event
	for _, id := range []string{"d1", "d2", "d3", "p1"} {
		e := event("orders", id, id)
		e.Permanent = id[0] == 'd'
		e.Reason = "too large"
		events = append(events, e)
	}
	if err := s.Insert(ctx, events); err != nil {
		t.Fatal(err)
	}
	rows := list(t, s, retry.Filter{})
	seq := func(i int) string { return fmt.Sprint(rows[i].Seq) }

	// A missing id changes nothing.
	_, err := s.Requeue(ctx, []string{"d1", "nope", "424242"})
	var nf *retry.NotFoundError
	if !errors.As(err, &nf) || !slices.Equal(nf.IDs, []string{"nope", "424242"}) {
		t.Fatalf("Requeue with missing ids error = %v; want NotFoundError for nope, 424242", err)
	}
	if dead := list(t, s, retry.Filter{Status: retry.StatusDead}); len(dead) != 3 {
		t.Fatalf("after failed Requeue %d dead rows; want 3 unchanged", len(dead))
	}

	// By seq and by event id.
	got, err := s.Requeue(ctx, []string{seq(1), "d1"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{rows[0].Seq, rows[1].Seq}; !slices.Equal(got, want) {
		t.Errorf("Requeue(%s, d1) = %v; want %v", seq(1), got, want)
	}
	d1, _ := s.Get(ctx, "d1")
	if d1.Status != retry.StatusPending || d1.Attempts != 0 || d1.LastError != "too large" || time.Since(d1.NextAttemptAt) > time.Minute {
		t.Errorf("requeued row = status %q attempts %d last error %q next %s; want pending, 0, kept, now",
			d1.Status, d1.Attempts, d1.LastError, d1.NextAttemptAt)
	}
	got, err = s.RequeueAllDead(ctx)
	if err != nil || !slices.Equal(got, []int64{rows[2].Seq}) {
		t.Errorf("RequeueAllDead() = %v, %v; want [%s]", got, err, seq(2))
	}
	if dead := list(t, s, retry.Filter{Status: retry.StatusDead}); len(dead) != 0 {
		t.Errorf("after RequeueAllDead %d dead rows; want 0", len(dead))
	}

	if _, err := s.Drop(ctx, []string{"p1", "gone"}); !errors.Is(err, retry.ErrNotFound) {
		t.Errorf("Drop with a missing id error = %v; want ErrNotFound", err)
	}
	got, err = s.Drop(ctx, []string{"p1", seq(0)})
	if err != nil || !slices.Equal(got, []int64{rows[0].Seq, rows[3].Seq}) {
		t.Errorf("Drop(p1, %s) = %v, %v; want [%s %s]", seq(0), got, err, seq(0), seq(3))
	}
	if keys := eventKeys(list(t, s, retry.Filter{})); !slices.Equal(keys, []string{"d2", "d3"}) {
		t.Errorf("after Drop rows %q; want d2, d3", keys)
	}
}

func TestListFilter(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	a, b, c := event("orders", "A", "a1"), event("pay", "B", "b1"), event("pay", "C", "c1")
	b.AggregateType, c.AggregateType = "Payment", "Payment"
	c.Permanent = true
	if err := s.Insert(ctx, []retry.Event{a, b, c}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		f    retry.Filter
		want []string
	}{
		{retry.Filter{}, []string{"a1", "b1", "c1"}},
		{retry.Filter{Status: retry.StatusPending}, []string{"a1", "b1"}},
		{retry.Filter{Status: retry.StatusDead}, []string{"c1"}},
		{retry.Filter{AggregateType: "Payment"}, []string{"b1", "c1"}},
		{retry.Filter{AggregateType: "Payment", Status: retry.StatusPending}, []string{"b1"}},
		{retry.Filter{Limit: 2}, []string{"a1", "b1"}},
	}
	for _, tt := range tests {
		if got := eventKeys(list(t, s, tt.f)); !slices.Equal(got, tt.want) {
			t.Errorf("List(%+v) = %q; want %q", tt.f, got, tt.want)
		}
	}
}
