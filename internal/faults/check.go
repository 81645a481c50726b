package faults

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Row is one row of the outbox table: the truth of what was committed, whatever the
// producer believed.
type Row struct {
	ID, AggregateType, AggregateID string
	Payload                        string // payload::text, byte for byte what Kafka must hold
	Seq                            int    // per-aggregate sequence number, from the payload
	// Poison is "" for an event that must reach Kafka, else a phrase its retry row's
	// last_error must contain: the event must end in the retry table, dead.
	Poison string
}

// Delivery is one message read back from Kafka.
type Delivery struct {
	Topic     string
	Partition int
	Offset    int64
	Key       string
	Value     string
	ID        string // the id header
	// AtLeastOnce: the message carries the relay's at-least-once mark
	// (event.HeaderDelivery): the retry worker, replay or a refill sent it.
	AtLeastOnce bool
}

// RetryRow is one row of the retry table as it is at the end.
type RetryRow struct {
	EventID, Status, LastError string
}

// Input is everything Check compares.
type Input struct {
	Rows      []Row
	Delivered []Delivery
	Retry     []RetryRow
	// RetryInserted are the event ids of every row ever inserted into the retry table
	// (an audit trigger's record: delivered rows are deleted from the table itself).
	RetryInserted []string
	// Topic is the topic an aggregate type routes to.
	Topic func(aggregateType string) string
}

// Report is what Check found. The counts are of events (distinct ids) unless named
// messages.
type Report struct {
	Events    int // rows in the outbox table
	Poison    int // rows with Poison set
	Delivered int // distinct outbox events found in Kafka
	Messages  int // messages found in Kafka, repeats included
	DeadRows  int // poison events dead in the retry table with the expected reason

	Lost             int // neither in Kafka nor in the retry table with a reason
	Duplicates       int // messages beyond the first of their event, not marked at least once
	MarkedDuplicates int // messages beyond the first of their event marked at least once (sent outside the exactly-once stream)
	OrderViolations  int // per aggregate, after dropping repeats: a sequence number not above the previous one
	PoisonWrong      int // poison events in Kafka, not dead, or without the expected reason
	NonPoisonRetries int // retry rows ever written for events that are not poison
	Mismatches       int // messages whose topic, key or value differ from the row, or that no row has

	Problems []string // the first few problems, for the failure message
}

const maxProblems = 10

func (r *Report) problem(format string, args ...any) {
	if len(r.Problems) < maxProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Check compares Kafka and the retry table with the outbox table.
//
// Every row must be in Kafka (exactly its topic, key and value) or, for poison, dead in
// the retry table with its reason; a good row that is only in the retry table with a
// reason is not lost but is counted in NonPoisonRetries. Order is judged per aggregate
// (topic + key) in offset order after dropping every message whose id was seen
// before, against the sequence numbers the table holds, not the payloads' claims.
func Check(in Input) Report {
	rep := Report{Events: len(in.Rows), Messages: len(in.Delivered)}
	rows := make(map[string]*Row, len(in.Rows))
	for i := range in.Rows {
		r := &in.Rows[i]
		rows[r.ID] = r
		if r.Poison != "" {
			rep.Poison++
		}
	}

	seen := rep.checkDelivered(in, rows)
	rep.checkRetry(in, rows, seen)
	return rep
}

// checkDelivered counts what the messages in Kafka say (duplicates,
// mismatches, poison delivered, order per aggregate) and returns the ids
// they carry.
func (rep *Report) checkDelivered(in Input, rows map[string]*Row) map[string]bool {
	msgs := slices.Clone(in.Delivered)
	slices.SortStableFunc(msgs, func(a, b Delivery) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	type aggregate struct {
		partition int
		lastSeq   int
	}
	aggs := map[string]*aggregate{}
	seen := map[string]bool{}
	for _, m := range msgs {
		if seen[m.ID] {
			if m.AtLeastOnce {
				rep.MarkedDuplicates++
			} else {
				rep.Duplicates++
			}
			continue
		}
		seen[m.ID] = true
		r, ok := rows[m.ID]
		if !ok {
			rep.Mismatches++
			rep.problem("message %s/%d@%d has id %q, which no outbox row has", m.Topic, m.Partition, m.Offset, m.ID)
			continue
		}
		rep.Delivered++
		if r.Poison != "" {
			rep.PoisonWrong++
			rep.problem("poison event %s (%s) reached Kafka at %s/%d@%d", r.ID, r.Poison, m.Topic, m.Partition, m.Offset)
		}
		if want := in.Topic(r.AggregateType); m.Topic != want || m.Key != r.AggregateID || m.Value != r.Payload {
			rep.Mismatches++
			rep.problem("event %s: topic %q key %q value %.80q; want topic %q key %q value %.80q",
				r.ID, m.Topic, m.Key, m.Value, want, r.AggregateID, r.Payload)
		}
		k := m.Topic + "/" + m.Key
		a := aggs[k]
		if a == nil {
			a = &aggregate{partition: m.Partition}
			aggs[k] = a
		}
		if m.Partition != a.partition {
			rep.OrderViolations++
			rep.problem("aggregate %s: on partitions %d and %d, so it has no order", k, a.partition, m.Partition)
		}
		if r.Seq <= a.lastSeq {
			rep.OrderViolations++
			rep.problem("aggregate %s: seq %d (event %s) at %s/%d@%d after seq %d",
				k, r.Seq, r.ID, m.Topic, m.Partition, m.Offset, a.lastSeq)
		}
		a.lastSeq = max(a.lastSeq, r.Seq)
	}

	return seen
}

// checkRetry counts what the retry table says (retry rows of good events,
// poison not dead) and the events neither in Kafka nor in the retry table.
func (rep *Report) checkRetry(in Input, rows map[string]*Row, seen map[string]bool) {
	retried := map[string]RetryRow{}
	for _, rr := range in.Retry {
		retried[rr.EventID] = rr
	}
	ever := map[string]bool{}
	for _, id := range in.RetryInserted {
		ever[id] = true
	}
	for _, rr := range in.Retry {
		ever[rr.EventID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ever)) {
		if r, ok := rows[id]; !ok || r.Poison == "" {
			rep.NonPoisonRetries++
			rep.problem("retry row written for event %q, which is not poison", id)
		}
	}

	for i := range in.Rows {
		r := &in.Rows[i]
		rr, inRetry := retried[r.ID]
		if r.Poison != "" {
			switch {
			case !inRetry && !seen[r.ID]:
				rep.Lost++
				rep.problem("poison event %s (%s) is neither in Kafka nor in the retry table", r.ID, r.Poison)
			case !inRetry:
				// counted as PoisonWrong above
			case rr.Status != "dead" || !strings.Contains(rr.LastError, r.Poison):
				rep.PoisonWrong++
				rep.problem("poison event %s: retry row %s, last_error %q; want dead, saying %q", r.ID, rr.Status, rr.LastError, r.Poison)
			default:
				rep.DeadRows++
			}
			continue
		}
		if !seen[r.ID] && !(inRetry && rr.LastError != "") {
			rep.Lost++
			rep.problem("event %s (%s seq %d) is neither in Kafka nor in the retry table", r.ID, r.AggregateID, r.Seq)
		}
	}
}

// Failed reports whether any count that must be zero is not.
func (r Report) Failed() bool {
	return r.Lost != 0 || r.OrderViolations != 0 || r.PoisonWrong != 0 || r.NonPoisonRetries != 0 || r.Mismatches != 0
}
