package faults

import (
	"reflect"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	topic := func(at string) string { return "t." + at }
	row := func(id, agg string, seq int) Row {
		return Row{ID: id, AggregateType: "Order", AggregateID: agg, Payload: `{"seq": ` + string(rune('0'+seq)) + `}`, Seq: seq}
	}
	msg := func(r Row, offset int64) Delivery {
		return Delivery{Topic: "t.Order", Partition: 1, Offset: offset, Key: r.AggregateID, Value: r.Payload, ID: r.ID}
	}
	a1, a2, a3, b1 := row("a1", "a", 1), row("a2", "a", 2), row("a3", "a", 3), row("b1", "b", 1)
	poison := Row{ID: "p1", AggregateType: "Bad Type!", AggregateID: "poison-1", Payload: `{}`, Seq: 1, Poison: "may contain only"}
	deadPoison := RetryRow{EventID: "p1", Status: "dead", LastError: "topic: Kafka topic names may contain only [a-zA-Z0-9._-]"}

	tests := []struct {
		name string
		in   Input
		want Report // Problems ignored
	}{
		{"clean", Input{Rows: []Row{a1, a2, b1}, Delivered: []Delivery{msg(a1, 0), msg(b1, 1), msg(a2, 2)}},
			Report{Events: 3, Delivered: 3, Messages: 3}},
		{"lost", Input{Rows: []Row{a1, a2}, Delivered: []Delivery{msg(a1, 0)}},
			Report{Events: 2, Delivered: 1, Messages: 1, Lost: 1}},
		{"resend after the events that followed is not an order violation",
			Input{Rows: []Row{a1, a2, a3}, Delivered: []Delivery{msg(a1, 0), msg(a2, 1), msg(a3, 2), msg(a2, 3), msg(a3, 4)}},
			Report{Events: 3, Delivered: 3, Messages: 5, Duplicates: 2}},
		{"overtaken", Input{Rows: []Row{a1, a2, a3}, Delivered: []Delivery{msg(a1, 0), msg(a3, 1), msg(a2, 2)}},
			Report{Events: 3, Delivered: 3, Messages: 3, OrderViolations: 1}},
		{"order is read by offset, not by the order given", Input{Rows: []Row{a1, a2}, Delivered: []Delivery{msg(a2, 7), msg(a1, 3)}},
			Report{Events: 2, Delivered: 2, Messages: 2}},
		{"aggregate on two partitions", Input{Rows: []Row{a1, a2}, Delivered: []Delivery{msg(a1, 0), {Topic: "t.Order", Partition: 2, Key: "a", Value: a2.Payload, ID: "a2"}}},
			Report{Events: 2, Delivered: 2, Messages: 2, OrderViolations: 1}},
		{"wrong value", Input{Rows: []Row{a1}, Delivered: []Delivery{{Topic: "t.Order", Partition: 1, Key: "a", Value: "{}", ID: "a1"}}},
			Report{Events: 1, Delivered: 1, Messages: 1, Mismatches: 1}},
		{"unknown id", Input{Rows: []Row{a1}, Delivered: []Delivery{msg(a1, 0), {Topic: "t.Order", ID: "zz"}}},
			Report{Events: 1, Delivered: 1, Messages: 2, Mismatches: 1}},
		{"poison dead with reason", Input{Rows: []Row{a1, poison}, Delivered: []Delivery{msg(a1, 0)}, Retry: []RetryRow{deadPoison}, RetryInserted: []string{"p1"}},
			Report{Events: 2, Poison: 1, Delivered: 1, Messages: 1, DeadRows: 1}},
		{"poison pending", Input{Rows: []Row{poison}, Retry: []RetryRow{{EventID: "p1", Status: "pending", LastError: deadPoison.LastError}}},
			Report{Events: 1, Poison: 1, PoisonWrong: 1}},
		{"poison with another reason", Input{Rows: []Row{poison}, Retry: []RetryRow{{EventID: "p1", Status: "dead", LastError: "broker down"}}},
			Report{Events: 1, Poison: 1, PoisonWrong: 1}},
		{"poison nowhere", Input{Rows: []Row{poison}}, Report{Events: 1, Poison: 1, Lost: 1}},
		{"good event retried and delivered", Input{Rows: []Row{a1}, Delivered: []Delivery{msg(a1, 0)}, RetryInserted: []string{"a1"}},
			Report{Events: 1, Delivered: 1, Messages: 1, NonPoisonRetries: 1}},
		{"good event parked with a reason is not lost", Input{Rows: []Row{a1}, Retry: []RetryRow{{EventID: "a1", Status: "pending", LastError: "topic missing"}}},
			Report{Events: 1, NonPoisonRetries: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.in.Topic = topic
			got := Check(tt.in)
			problems := got.Problems
			got.Problems = nil
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Check() = %+v; want %+v (problems: %s)", got, tt.want, strings.Join(problems, "; "))
			}
			if got.Failed() != (len(problems) > 0) {
				t.Errorf("Failed() = %v with problems %q", got.Failed(), problems)
			}
		})
	}
}

// TestCheckBufferedEOS: the exactly-once checks of the WAL buffer runs fail
// on each way the contract can break.
func TestCheckBufferedEOS(t *testing.T) {
	row := func(id string, seq int) Row { return Row{ID: id, AggregateType: "Order", AggregateID: "a", Seq: seq} }
	msg := func(id string, offset int64, marked bool) Delivery {
		return Delivery{Topic: "t.Order", Partition: 1, Offset: offset, Key: "a", ID: id, AtLeastOnce: marked}
	}
	l1, b1, b2, l2 := row("l1", 1), row("b1", 2), row("b2", 3), row("l2", 4)
	poison := Row{ID: "p1", AggregateID: "poison-1", Poison: "too large"}
	rows := []Row{l1, b1, b2, l2, poison}
	buffered := map[string]bool{"b1": true, "b2": true}
	type counts struct{ unmarkedRepeats, bufferedUnmarked, unmarkedAfterMarked, liveWrong int }
	tests := []struct {
		name string
		msgs []Delivery
		want counts
	}{
		{"clean", []Delivery{msg("l1", 0, false), msg("b1", 1, true), msg("b2", 2, true), msg("l2", 3, false)}, counts{}},
		{"marked repeats and the blocked term's unmarked copy first are allowed",
			[]Delivery{msg("l1", 0, false), msg("b1", 1, false), msg("b1", 2, true), msg("b2", 3, true), msg("b1", 4, true), msg("b2", 5, true), msg("l2", 6, false)}, counts{}},
		{"unmarked repeat", []Delivery{msg("l1", 0, false), msg("l1", 1, false), msg("b1", 2, true), msg("b2", 3, true), msg("l2", 4, false)},
			counts{unmarkedRepeats: 1, liveWrong: 1}},
		{"buffered event read unmarked only", []Delivery{msg("l1", 0, false), msg("b1", 1, false), msg("b2", 2, true), msg("l2", 3, false)},
			counts{bufferedUnmarked: 1}},
		{"buffered range streamed again after the drain", []Delivery{msg("l1", 0, false), msg("b1", 1, true), msg("b2", 2, true), msg("b1", 3, false), msg("l2", 4, false)},
			counts{unmarkedAfterMarked: 1}},
		{"live event marked", []Delivery{msg("l1", 0, false), msg("b1", 1, true), msg("b2", 2, true), msg("l2", 3, true)},
			counts{liveWrong: 1}},
		{"live event also marked", []Delivery{msg("l1", 0, false), msg("b1", 1, true), msg("b2", 2, true), msg("l2", 3, false), msg("l2", 4, true)},
			counts{liveWrong: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := checkBufferedEOS(Input{Rows: rows, Delivered: tt.msgs}, buffered)
			got := counts{e.unmarkedRepeats, e.bufferedUnmarked, e.unmarkedAfterMarked, e.liveWrong}
			if got != tt.want {
				t.Errorf("checkBufferedEOS() = %+v; want %+v (problems: %s)", got, tt.want, strings.Join(e.problems, "; "))
			}
			if e.buffered != 2 || e.live != 2 {
				t.Errorf("checkBufferedEOS() counted %d buffered, %d live events; want 2, 2", e.buffered, e.live)
			}
		})
	}
}
