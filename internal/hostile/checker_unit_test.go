package hostile

import (
	"strings"
	"testing"
	"time"
)

func sp(s string) *string { return &s }

// TestCheck feeds Check fabricated end states that break each rule and
// requires it to report exactly that rule: the checker is proven able to fail.
func TestCheck(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	row := func(n int64, id, agg string, seq int) Row {
		return Row{N: n, ID: sp(id), AggregateType: sp("Order"), AggregateID: sp(agg), EvType: sp("Changed"),
			Payload: sp(`{"seq": 1}`), Headers: sp(`{"trace": "x", "id": "evil", "n": 1.50, "nul": null}`), ExtraHeaders: true,
			Seq: seq, Committed: t0}
	}
	rec := func(r Row, off int64, at time.Duration) Record {
		return Record{Topic: "p.Order", Partition: 0, Offset: off, Key: []byte(str(r.AggregateID)), Value: []byte(str(r.Payload)),
			Headers: ExpectedHeaders(&r), Time: t0.Add(at)}
	}
	a1, a2, a3 := row(1, "a1", "a", 1), row(2, "a2", "a", 2), row(3, "a3", "a", 3)
	b1 := row(4, "b1", "b", 1)
	big := row(5, "big", "a", 2) // a's second event, too large
	big.Payload = sp(strings.Repeat("x", 2<<20))
	a3b := row(6, "a3b", "a", 3)
	noID := row(7, "", "c", 1)
	noID.ID = nil
	c2 := row(8, "c2", "c", 2)
	late := row(9, "late1", "l", 1)
	late.AggregateType = sp("Late")
	lateRec := rec(late, 0, time.Second)
	lateRec.Topic = "p.Late"
	badTopic := row(10, "bt", "x", 1)
	badTopic.AggregateType = sp("Bad Type")
	arr := row(11, "arr", "d", 1)
	arr.Headers = sp(`[1, 2]`)

	pending := func(id string, why string) RetryRow {
		return RetryRow{Seq: 1, EventKey: id, EventID: id, AggregateType: "Order", Status: "pending", LastError: why}
	}
	dead := func(r Row) RetryRow {
		return RetryRow{Seq: 2, EventKey: str(r.ID), EventID: str(r.ID), AggregateType: str(r.AggregateType), AggregateID: str(r.AggregateID),
			Value: []byte(str(r.Payload)), Status: "dead", LastError: "bad"}
	}
	noIDRow := RetryRow{Seq: 3, EventKey: "lsn:0/1:1", AggregateType: "Order", AggregateID: "c", EventType: "Changed",
		Value: []byte(`{"seq": 1}`), Status: "dead", LastError: "no id"}

	// Two events of aggregate c without an id and identical in every field,
	// with c2 between them: the earlier one dropped by the operator, the
	// later one still in the table. The retry table's seq tells them apart.
	noID3 := row(12, "", "c", 3)
	noID3.ID = nil
	noIDDropped := noIDRow
	noIDDropped.DroppedAt = t0.Add(2 * time.Second)
	noIDLater := noIDRow
	noIDLater.Seq, noIDLater.EventKey = 5, "lsn:0/2:1"

	tests := []struct {
		name  string
		in    Input
		count func(Report) int // the rule that must fire; nil: clean
	}{
		{"clean", Input{Rows: []Row{a1, a2, b1}, Records: []Record{rec(a1, 0, time.Second), rec(b1, 1, time.Second), rec(a2, 2, time.Second)}}, nil},
		{"non-object headers: three relay headers only", Input{Rows: []Row{arr}, Records: []Record{{Topic: "p.Order", Key: []byte("d"), Value: []byte(`{"seq": 1}`),
			Headers: []Header{{"id", "arr"}, {"event_type", "Changed"}, {"aggregate_type", "Order"}}, Time: t0}}}, nil},
		{"bad event parked, later events wait", Input{Rows: []Row{a1, big, a3b}, Records: []Record{rec(a1, 0, time.Second)},
			Retry: []RetryRow{dead(big), pending("a3b", "waiting behind")}}, nil},
		{"dropped by the operator, later delivered after the drop", Input{Rows: []Row{a1, big, a3b}, Records: []Record{rec(a1, 0, time.Second), rec(a3b, 1, 5*time.Second)},
			Dropped: []RetryRow{func() RetryRow { d := dead(big); d.DroppedAt = t0.Add(4 * time.Second); return d }()}}, nil},
		{"identical events without an id: the earlier dropped, the later parked", Input{Rows: []Row{noID, c2, noID3}, Records: []Record{rec(c2, 0, 3*time.Second)},
			Retry: []RetryRow{noIDLater}, Dropped: []RetryRow{noIDDropped}}, nil},
		{"topic missing for a while, then delivered", Input{Rows: []Row{late}, Records: []Record{lateRec}}, nil},
		{"duplicate within bound", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second), rec(a1, 1, time.Second)}, MaxDuplicates: 1}, nil},

		{"lost", Input{Rows: []Row{a1, a2}, Records: []Record{rec(a1, 0, time.Second)}}, func(r Report) int { return r.Lost }},
		{"parked without a reason", Input{Rows: []Row{a1, big}, Records: []Record{rec(a1, 0, time.Second)},
			Retry: []RetryRow{func() RetryRow { d := dead(big); d.LastError = ""; return d }()}}, func(r Report) int { return r.NoReason }},
		{"good event parked", Input{Rows: []Row{a1, a2}, Records: []Record{rec(a1, 0, time.Second)}, Retry: []RetryRow{pending("a2", "topic missing")}},
			func(r Report) int { return r.ParkedGood }},
		{"waiting row left after its head was dropped", Input{Rows: []Row{a1, big, a3b}, Records: []Record{rec(a1, 0, time.Second)},
			Retry: []RetryRow{pending("a3b", "waiting behind")}, Dropped: []RetryRow{dead(big)}}, func(r Report) int { return r.Stuck }},
		{"too large delivered", Input{Rows: []Row{big}, Records: []Record{rec(big, 0, time.Second)}}, func(r Report) int { return r.DeliveredBad }},
		{"invalid topic delivered", Input{Rows: []Row{badTopic}, Records: []Record{func() Record { m := rec(badTopic, 0, time.Second); m.Topic = "p.Bad Type"; return m }()}},
			func(r Report) int { return r.DeliveredBad }},
		{"too large parked dead", Input{Rows: []Row{big}, Records: []Record{}, Retry: []RetryRow{dead(big)}}, nil},
		{"delivered and still parked (good)", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second)}, Retry: []RetryRow{pending("a1", "x")}},
			func(r Report) int { return r.Both }},
		{"wrong value", Input{Rows: []Row{a1}, Records: []Record{func() Record { m := rec(a1, 0, time.Second); m.Value = []byte("{}"); return m }()}},
			func(r Report) int { return r.Mismatches }},
		{"headers column overrides id", Input{Rows: []Row{a1}, Records: []Record{func() Record {
			m := rec(a1, 0, time.Second)
			m.Headers = append(m.Headers, Header{"id", "evil"})
			return m
		}()}}, func(r Report) int { return r.Mismatches }},
		{"headers out of stored order", Input{Rows: []Row{a1}, Records: []Record{func() Record {
			m := rec(a1, 0, time.Second)
			m.Headers[3], m.Headers[4] = m.Headers[4], m.Headers[3]
			return m
		}()}}, func(r Report) int { return r.Mismatches }},
		{"non-object headers stop delivery", Input{Rows: []Row{arr}, Retry: []RetryRow{pending("arr", "not a JSON object")}},
			func(r Report) int { return r.ParkedGood }},
		{"record of no row", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second), func() Record { m := rec(a1, 1, time.Second); m.Headers[0].Value = "zz"; return m }()}},
			func(r Report) int { return r.Mismatches }},
		{"duplicate that differs", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second), func() Record { m := rec(a1, 1, time.Second); m.Headers = m.Headers[:3]; return m }()}, MaxDuplicates: 5},
			func(r Report) int { return r.BadDuplicates }},
		{"too many duplicates", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second), rec(a1, 1, time.Second)}},
			func(r Report) int { return r.TooManyDups }},
		{"out of order", Input{Rows: []Row{a1, a2, a3}, Records: []Record{rec(a1, 0, time.Second), rec(a3, 1, time.Second), rec(a2, 2, time.Second)}},
			func(r Report) int { return r.Order }},
		{"two partitions", Input{Rows: []Row{a1, a2}, Records: []Record{rec(a1, 0, time.Second), func() Record { m := rec(a2, 0, time.Second); m.Partition = 1; return m }()}},
			func(r Report) int { return r.Order }},
		{"overtakes a parked event", Input{Rows: []Row{a1, big, a3b}, Records: []Record{rec(a1, 0, time.Second), rec(a3b, 1, time.Second)}, Retry: []RetryRow{dead(big)}},
			func(r Report) int { return r.Overtaken }},
		{"overtakes an event without an id", Input{Rows: []Row{noID, c2}, Records: []Record{rec(c2, 0, time.Second)}, Retry: []RetryRow{noIDRow}},
			func(r Report) int { return r.Overtaken }},
		{"identical events without an id: delivered before the earlier was dropped", Input{Rows: []Row{noID, c2, noID3}, Records: []Record{rec(c2, 0, time.Second)},
			Retry: []RetryRow{noIDLater}, Dropped: []RetryRow{noIDDropped}}, func(r Report) int { return r.Overtaken }},
		{"delivered before the operator dropped the head", Input{Rows: []Row{a1, big, a3b}, Records: []Record{rec(a1, 0, time.Second), rec(a3b, 1, 2*time.Second)},
			Dropped: []RetryRow{func() RetryRow { d := dead(big); d.DroppedAt = t0.Add(4 * time.Second); return d }()}}, func(r Report) int { return r.Overtaken }},
		{"collateral stall", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, 2*time.Minute)}}, func(r Report) int { return r.Stalls }},
		{"retry row of no event", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second)}, Retry: []RetryRow{pending("ghost", "x")}},
			func(r Report) int { return r.UnknownRetry }},
		{"slot behind the last transaction", Input{Rows: []Row{a1}, Records: []Record{rec(a1, 0, time.Second)}, LastEnd: 100, SlotConfirmed: 99, Checkpoint: 100},
			func(r Report) int { return r.NotConfirmed }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Topic = func(at string) string { return "p." + at }
			in.Exists = func(topic string) bool { return topic == "p.Order" || topic == "p.Late" }
			in.EverMissing = func(topic string) bool { return topic == "p.Late" }
			in.BatchBytes = 1 << 20
			if in.StallBound == 0 {
				in.StallBound = 30 * time.Second
			}
			rep := Check(in)
			if tt.count == nil {
				if rep.Failed() {
					t.Errorf("Check() failed on a clean run:\n%s", rep.String())
				}
				return
			}
			if n := tt.count(rep); n == 0 {
				t.Errorf("Check() did not report the broken rule:\n%s", rep.String())
			}
			if !rep.Failed() {
				t.Errorf("Failed() = false with:\n%s", rep.String())
			}
		})
	}
}

// TestCheckStallExcludesDowntime: a clean event delivered late because the
// relay was stopped is no stall.
func TestCheckStallExcludesDowntime(t *testing.T) {
	t0 := time.Now()
	r := Row{N: 1, ID: sp("a1"), AggregateType: sp("Order"), AggregateID: sp("a"), EvType: sp("E"), Payload: sp("1"), Seq: 1, Committed: t0}
	in := Input{Rows: []Row{r}, Records: []Record{{Topic: "p.Order", Key: []byte("a"), Value: []byte("1"), Headers: ExpectedHeaders(&r), Time: t0.Add(100 * time.Second)}},
		Topic: func(at string) string { return "p." + at }, Exists: func(string) bool { return true }, EverMissing: func(string) bool { return false },
		BatchBytes: 1 << 20, StallBound: 30 * time.Second, Down: []Interval{{t0.Add(time.Second), t0.Add(95 * time.Second)}}}
	if rep := Check(in); rep.Failed() {
		t.Errorf("Check() = %s; want no stall (94s of downtime)", rep.String())
	}
	in.Down = nil
	if rep := Check(in); rep.Stalls != 1 {
		t.Errorf("Check() without downtime: stalls %d; want 1", rep.Stalls)
	}
}

// TestExpectedHeaders pins the header rules the checker enforces.
func TestExpectedHeaders(t *testing.T) {
	base := []Header{{"id", "i"}, {"event_type", "e"}, {"aggregate_type", "Order"}}
	tests := []struct {
		column *string
		want   []Header
	}{
		{nil, base},
		{sp(`null`), base},
		{sp(`[1]`), base},
		{sp(`"s"`), base},
		{sp(`42`), base},
		{sp(`{"a":`), base},
		{sp(`{}`), base},
		{sp(`{"b": "x\ty", "a": 1.50, "id": "evil", "ID": "up", "": "empty", "n": null, "o": {"k": [1, "2"]}, "a": true, "event_type": 1, "aggregate_type": "z"}`),
			append(base[:3:3], Header{"b", "x\ty"}, Header{"a", "1.50"}, Header{"ID", "up"}, Header{"", "empty"}, Header{"o", `{"k": [1, "2"]}`}, Header{"a", "true"})},
		{sp(`{"z": "\u0000é"}`), append(base[:3:3], Header{"z", "\x00é"})},
	}
	for _, tt := range tests {
		r := Row{ID: sp("i"), EvType: sp("e"), AggregateType: sp("Order"), Headers: tt.column, ExtraHeaders: true}
		got := ExpectedHeaders(&r)
		if fmtHeaders(got) != fmtHeaders(tt.want) {
			t.Errorf("ExpectedHeaders(%s) = %s; want %s", str(tt.column), fmtHeaders(got), fmtHeaders(tt.want))
		}
	}
}
