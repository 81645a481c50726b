package hostile

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
)

// Row is one row of the outbox table as stored (text forms, nil for SQL NULL),
// with what the generator knows of it.
type Row struct {
	N                                      int64 // generator's number: the row's identity in the test
	ID, AggregateType, AggregateID, EvType *string
	Payload                                *string
	Headers                                *string // headers column text; ignored unless ExtraHeaders
	// ExtraHeaders is false when the relay reads no headers column for this
	// row (the column was dropped before the row was inserted).
	ExtraHeaders bool
	Seq          int       // per-aggregate sequence number, 1.., commit order
	Committed    time.Time // when its transaction's COMMIT returned
}

// Header is a Kafka record header.
type Header struct {
	Key   string
	Value string
}

// Record is one Kafka record read back.
type Record struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	Value     []byte
	Headers   []Header
	Time      time.Time
}

// RetryRow is a row of the retry table, at the end or when the operator
// dropped it.
type RetryRow struct {
	Seq                                   int64
	EventKey, EventID                     string
	AggregateType, AggregateID, EventType string
	Value                                 []byte
	Status, LastError                     string
	DroppedAt                             time.Time // set for rows the operator dropped: when Drop was called
}

// Interval is a span of time during which the relay was not running.
type Interval struct{ From, To time.Time }

// Input is everything Check judges.
type Input struct {
	Rows    []Row
	Records []Record   // every record on every topic of the run's prefix
	Retry   []RetryRow // the retry table at the end
	Dropped []RetryRow // rows the operator dropped, DroppedAt set

	Topic func(aggregateType string) string // the template
	// Exists reports whether a topic exists at the end; EverMissing whether
	// it was missing at some time while events of it were inserted.
	Exists, EverMissing func(topic string) bool
	BatchBytes          int // the sink's kafka.batch_bytes

	MaxDuplicates int           // repeats allowed (restarts × window)
	StallBound    time.Duration // longest delivery latency of a clean aggregate, relay downtime excluded
	Down          []Interval    // relay not running

	LastEnd, SlotConfirmed, Checkpoint pglogrepl.LSN
}

// Report is what Check found. Everything but the informational counts must be 0.
type Report struct {
	Events, Delivered, InRetry, Dropped, Records, Duplicates int // informational

	Lost           int // neither delivered, nor in the retry table with a reason, nor dropped
	NoReason       int // in the retry table with an empty reason or an unknown status
	ParkedGood     int // in the retry table although neither it nor an earlier event of its aggregate is bad
	Stuck          int // in the retry table, not bad itself, nothing of its aggregate left before it
	DeliveredBad   int // delivered although it cannot be (no id, no topic, too large, …)
	Both           int // delivered and still in the retry table
	Mismatches     int // record differs from its row (topic, key, value, headers), or no row has it
	BadDuplicates  int // a repeat that is not an exact copy of the first delivery
	TooManyDups    int // 1 when Duplicates > MaxDuplicates
	Order          int // per (topic, key): sequence not increasing, or two partitions
	Overtaken      int // delivered while an earlier event of its aggregate was in the retry table
	Stalls         int // a clean aggregate's event delivered later than StallBound
	UnknownRetry   int // a retry row that matches no outbox row
	NotConfirmed   int // slot or checkpoint not past the last transaction
	MaxLatency     time.Duration
	Problems       []string
	problemsByKind map[string]int
}

const maxProblemsPerKind = 5

func (r *Report) problem(kind string, format string, args ...any) {
	if r.problemsByKind == nil {
		r.problemsByKind = map[string]int{}
	}
	r.problemsByKind[kind]++
	if r.problemsByKind[kind] <= maxProblemsPerKind {
		r.Problems = append(r.Problems, kind+": "+fmt.Sprintf(format, args...))
	}
}

// Failed reports whether any rule was broken.
func (r *Report) Failed() bool {
	return r.Lost+r.NoReason+r.ParkedGood+r.Stuck+r.DeliveredBad+r.Both+r.Mismatches+r.BadDuplicates+
		r.TooManyDups+r.Order+r.Overtaken+r.Stalls+r.UnknownRetry+r.NotConfirmed != 0
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "events %d: delivered %d, in retry table %d, dropped by the operator %d; records %d (duplicates %d); max clean latency %s\n",
		r.Events, r.Delivered, r.InRetry, r.Dropped, r.Records, r.Duplicates, r.MaxLatency.Round(time.Millisecond))
	fmt.Fprintf(&b, "lost %d, no reason %d, parked good %d, stuck %d, delivered bad %d, both %d, mismatches %d, bad duplicates %d, too many duplicates %d, order %d, overtaken %d, stalls %d, unknown retry rows %d, not confirmed %d",
		r.Lost, r.NoReason, r.ParkedGood, r.Stuck, r.DeliveredBad, r.Both, r.Mismatches, r.BadDuplicates,
		r.TooManyDups, r.Order, r.Overtaken, r.Stalls, r.UnknownRetry, r.NotConfirmed)
	for _, p := range r.Problems {
		b.WriteString("\n  " + trunc(p, 600))
	}
	return b.String()
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + fmt.Sprintf("…(%d bytes)", len(s))
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// short quotes s for a message, cut to a readable length.
func short(s string) string {
	q := fmt.Sprintf("%q", s)
	if len(q) > 60 {
		q = q[:60] + fmt.Sprintf("…(%d bytes)", len(s))
	}
	return q
}

// badness of a row on its own.
type badness int

const (
	good     badness = iota
	mayFail          // may legitimately have gone to the retry table (topic missing for a while, size near the limit)
	mustFail         // cannot be delivered
)

// validTopic applies Kafka's rules for topic names.
func validTopic(t string) bool {
	if t == "" || len(t) > 249 || t == "." || t == ".." {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// ExpectedHeaders are the headers a delivered record of r must carry, in
// order: id, event_type, aggregate_type from their columns, then the headers
// column's entries in stored order, without the names the relay sets and
// without JSON null values; none at all when the column is NULL, JSON null, or
// not a JSON object (invalid JSON, an array, a string, a number). String values
// are their unescaped text, others their JSON text as stored.
func ExpectedHeaders(r *Row) []Header {
	hs := []Header{{"id", str(r.ID)}, {"event_type", str(r.EvType)}, {"aggregate_type", str(r.AggregateType)}}
	if !r.ExtraHeaders || r.Headers == nil {
		return hs
	}
	return append(hs, objectEntries([]byte(*r.Headers))...)
}

func objectEntries(b []byte) []Header {
	if !json.Valid(b) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if d, ok := tok.(json.Delim); err != nil || !ok || d != '{' {
		return nil
	}
	var out []Header
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil
		}
		key := kt.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil
		}
		switch {
		case string(raw) == "null":
		case key == "id" || key == "event_type" || key == "aggregate_type":
		case raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil
			}
			out = append(out, Header{key, s})
		default:
			out = append(out, Header{key, string(raw)})
		}
	}
	return out
}

// recordSize estimates a record's size as the sink counts it against
// kafka.batch_bytes.
func recordSize(r *Row, topic string) int {
	n := len(str(r.AggregateID)) + len(str(r.Payload)) + len(topic) + 70
	for _, h := range ExpectedHeaders(r) {
		n += len(h.Key) + len(h.Value) + 10
	}
	return n
}

// classify says whether r can be delivered on its own, and why not.
func (in *Input) classify(r *Row) (badness, string) {
	switch {
	case str(r.ID) == "":
		return mustFail, "NULL or empty id"
	case str(r.AggregateType) == "":
		return mustFail, "NULL or empty aggregate type"
	case str(r.AggregateID) == "":
		return mustFail, "NULL or empty aggregate id"
	}
	topic := in.Topic(*r.AggregateType)
	if !validTopic(topic) {
		return mustFail, "invalid topic " + short(topic)
	}
	if !in.Exists(topic) {
		return mustFail, "topic " + short(topic) + " does not exist"
	}
	size := recordSize(r, topic)
	switch {
	case size > in.BatchBytes+8192:
		return mustFail, fmt.Sprintf("too large (%d bytes)", size)
	case size > in.BatchBytes-8192:
		return mayFail, fmt.Sprintf("near the size limit (%d bytes)", size)
	}
	if in.EverMissing(topic) {
		return mayFail, "topic " + short(topic) + " was missing for a while"
	}
	return good, ""
}

// aggKey is a row's aggregate, "" when it has none (NULL or empty type or id).
func aggKey(r *Row) string {
	if str(r.AggregateType) == "" || str(r.AggregateID) == "" {
		return ""
	}
	return *r.AggregateType + "\x00" + *r.AggregateID
}

func describe(r *Row) string {
	return fmt.Sprintf("row %d (id %s, aggregate %s/%s seq %d)", r.N, short(str(r.ID)), short(str(r.AggregateType)), short(str(r.AggregateID)), r.Seq)
}

// Check judges the end state of a run against the rules in the package doc:
// every row delivered exactly as the router's contract says, or in the retry
// table with a reason when it or an earlier event of its aggregate is bad, or
// dropped by the operator; per-aggregate order in Kafka and around the retry
// table; duplicates only as exact repeats, bounded; clean aggregates delivered
// within StallBound; the slot and checkpoint past the last transaction.
func Check(in Input) Report {
	rep := Report{Events: len(in.Rows), Records: len(in.Records)}
	byN := make(map[int64]*Row, len(in.Rows))
	byID := map[string]*Row{}
	bad := make(map[int64]badness, len(in.Rows))
	why := map[int64]string{}
	aggs := map[string][]*Row{} // by seq
	for i := range in.Rows {
		r := &in.Rows[i]
		byN[r.N] = r
		if id := str(r.ID); id != "" {
			byID[id] = r
		}
		bad[r.N], why[r.N] = in.classify(r)
		if k := aggKey(r); k != "" {
			aggs[k] = append(aggs[k], r)
		}
	}
	for _, rs := range aggs {
		slices.SortFunc(rs, func(a, b *Row) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	// tainted: an earlier (or this) event of the aggregate is bad.
	tainted := map[int64]bool{}
	dirtyAgg := map[string]bool{}
	for k, rs := range aggs {
		t := false
		for _, r := range rs {
			t = t || bad[r.N] != good
			tainted[r.N] = t
		}
		dirtyAgg[k] = t
	}
	for i := range in.Rows {
		if r := &in.Rows[i]; bad[r.N] != good {
			tainted[r.N] = true
		}
	}

	// Retry rows → outbox rows: by event id, else by their fields among the
	// rows without an id. Rows without an id can be identical in every
	// field (same aggregate, type and payload); their retry rows are then
	// matched in seq order, which is the order the writer stored them in and
	// so their order in the outbox, whether still in the table or dropped.
	// (Matching the table's rows first would give a dropped earlier row's
	// identity to a later one still there, and report as overtaken the
	// events rightly delivered after the drop.)
	type fields struct{ at, aid, et, v string }
	noID := map[fields][]*Row{}
	for i := range in.Rows {
		r := &in.Rows[i]
		if str(r.ID) == "" {
			f := fields{str(r.AggregateType), str(r.AggregateID), str(r.EvType), str(r.Payload)}
			noID[f] = append(noID[f], r)
		}
	}
	match := func(rr *RetryRow) *Row {
		if rr.EventID != "" {
			return byID[rr.EventID]
		}
		f := fields{rr.AggregateType, rr.AggregateID, rr.EventType, string(rr.Value)}
		if c := noID[f]; len(c) > 0 {
			noID[f] = c[1:]
			return c[0]
		}
		return nil
	}
	type stored struct {
		rr      *RetryRow
		dropped bool
	}
	all := make([]stored, 0, len(in.Retry)+len(in.Dropped))
	for i := range in.Retry {
		all = append(all, stored{&in.Retry[i], false})
	}
	for i := range in.Dropped {
		all = append(all, stored{&in.Dropped[i], true})
	}
	slices.SortStableFunc(all, func(a, b stored) int { return cmp.Compare(a.rr.Seq, b.rr.Seq) })
	inRetry := map[int64]*RetryRow{}
	dropped := map[int64]*RetryRow{}
	for _, s := range all {
		rr := s.rr
		r := match(rr)
		switch {
		case r == nil && s.dropped:
			rep.UnknownRetry++
			rep.problem("unknown retry row", "dropped seq %d key %s matches no outbox row", rr.Seq, short(rr.EventKey))
		case r == nil:
			rep.UnknownRetry++
			rep.problem("unknown retry row", "seq %d key %s id %s aggregate %s/%s matches no outbox row", rr.Seq, short(rr.EventKey), short(rr.EventID), short(rr.AggregateType), short(rr.AggregateID))
		case s.dropped:
			dropped[r.N] = rr
		default:
			inRetry[r.N] = rr
		}
	}

	// Records, in offset order per partition.
	recs := slices.Clone(in.Records)
	slices.SortStableFunc(recs, func(a, b Record) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
	})
	first := map[int64]*Record{}
	type aggState struct {
		partition int
		last      *Row
	}
	order := map[string]*aggState{}
	for i := range recs {
		m := &recs[i]
		var ids []string
		for _, h := range m.Headers {
			if h.Key == "id" {
				ids = append(ids, h.Value)
			}
		}
		where := fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)
		if len(ids) != 1 {
			rep.Mismatches++
			rep.problem("mismatch", "record %s has %d id headers (%v)", where, len(ids), headerKeys(m.Headers))
			continue
		}
		r := byID[ids[0]]
		if r == nil {
			rep.Mismatches++
			rep.problem("mismatch", "record %s has id %s, which no outbox row has", where, short(ids[0]))
			continue
		}
		if f := first[r.N]; f != nil {
			rep.Duplicates++
			if f.Topic != m.Topic || !bytes.Equal(f.Key, m.Key) || !bytes.Equal(f.Value, m.Value) || !slices.Equal(f.Headers, m.Headers) {
				rep.BadDuplicates++
				rep.problem("bad duplicate", "%s: record %s repeats %s/%d@%d but differs (headers %v vs %v)",
					describe(r), where, f.Topic, f.Partition, f.Offset, headerKeys(m.Headers), headerKeys(f.Headers))
			}
			continue
		}
		first[r.N] = m
		if b := bad[r.N]; b == mustFail {
			rep.DeliveredBad++
			rep.problem("delivered bad", "%s is %s but was delivered at %s", describe(r), why[r.N], where)
		}
		wantTopic := in.Topic(str(r.AggregateType))
		wantH := ExpectedHeaders(r)
		var diff []string
		if m.Topic != wantTopic {
			diff = append(diff, fmt.Sprintf("topic %s, want %s", short(m.Topic), short(wantTopic)))
		}
		if string(m.Key) != str(r.AggregateID) {
			diff = append(diff, fmt.Sprintf("key %s, want %s", short(string(m.Key)), short(str(r.AggregateID))))
		}
		// The reader gives nil for both a null and an empty value.
		if string(m.Value) != str(r.Payload) || (r.Payload != nil && len(*r.Payload) > 0) != (len(m.Value) > 0) {
			diff = append(diff, fmt.Sprintf("value %s, want %s", short(string(m.Value)), short(str(r.Payload))))
		}
		if !slices.Equal(m.Headers, wantH) {
			diff = append(diff, fmt.Sprintf("headers %s, want %s (column %s)", fmtHeaders(m.Headers), fmtHeaders(wantH), short(str(r.Headers))))
		}
		if len(diff) > 0 {
			rep.Mismatches++
			rep.problem("mismatch", "%s at %s: %s", describe(r), where, strings.Join(diff, "; "))
		}
		k := aggKey(r)
		if k == "" {
			continue
		}
		st := order[k]
		if st == nil {
			st = &aggState{partition: m.Partition}
			order[k] = st
		}
		if m.Partition != st.partition {
			rep.Order++
			rep.problem("order", "aggregate %s/%s on partitions %d and %d", short(str(r.AggregateType)), short(str(r.AggregateID)), st.partition, m.Partition)
		}
		if st.last != nil && r.Seq <= st.last.Seq {
			rep.Order++
			rep.problem("order", "%s at %s after seq %d (row %d)", describe(r), where, st.last.Seq, st.last.N)
		}
		if st.last == nil || r.Seq > st.last.Seq {
			st.last = r
		}
	}
	rep.Delivered = len(first)
	rep.InRetry = len(inRetry)
	rep.Dropped = len(dropped)
	if rep.Duplicates > in.MaxDuplicates {
		rep.TooManyDups = 1
		rep.problem("too many duplicates", "%d repeated records; at most %d allowed", rep.Duplicates, in.MaxDuplicates)
	}

	for _, n := range slices.Sorted(maps.Keys(byN)) {
		r := byN[n]
		rr, parked := inRetry[n]
		_, done := first[n]
		_, gone := dropped[n]
		switch {
		case done && parked:
			rep.Both++
			rep.problem("both", "%s is delivered and still in the retry table (seq %d, %s)", describe(r), rr.Seq, rr.Status)
		case done || gone:
		case !parked:
			rep.Lost++
			rep.problem("lost", "%s (%s) is neither in Kafka nor in the retry table nor dropped", describe(r), cmp.Or(why[n], "good"))
		}
		if !parked || done {
			continue
		}
		if rr.LastError == "" || (rr.Status != "pending" && rr.Status != "dead") {
			rep.NoReason++
			rep.problem("no reason", "%s: retry row %d status %q, last_error %q", describe(r), rr.Seq, rr.Status, rr.LastError)
		}
		if !tainted[n] {
			rep.ParkedGood++
			rep.problem("parked good", "%s is in the retry table (%s: %s) but neither it nor an earlier event of its aggregate is bad",
				describe(r), rr.Status, trunc(rr.LastError, 200))
			continue
		}
		if bad[n] == mustFail {
			continue
		}
		// Not bad itself (or only for a while): it may wait only behind an
		// earlier event of its aggregate that is still in the table.
		behind := false
		for _, o := range aggs[aggKey(r)] {
			if o.Seq < r.Seq && inRetry[o.N] != nil {
				behind = true
				break
			}
		}
		if !behind {
			rep.Stuck++
			rep.problem("stuck", "%s (%s) is still in the retry table (%s: %s) with nothing of its aggregate before it",
				describe(r), cmp.Or(why[n], "good"), rr.Status, trunc(rr.LastError, 200))
		}
	}

	// Overtaking around the retry table: an event of an aggregate must not be
	// delivered while an earlier event of it is in the table — at all, when it
	// is still there; before the drop, when the operator dropped it.
	for k, rs := range aggs {
		for i, r := range rs {
			rr, parked := inRetry[r.N]
			dr, gone := dropped[r.N]
			if _, done := first[r.N]; done || (!parked && !gone) {
				continue
			}
			for _, later := range rs[i+1:] {
				m := first[later.N]
				if m == nil {
					continue
				}
				if parked {
					rep.Overtaken++
					rep.problem("overtaken", "%s delivered at %s/%d@%d while %s is in the retry table (%s: %s)",
						describe(later), m.Topic, m.Partition, m.Offset, describe(r), rr.Status, trunc(rr.LastError, 160))
				} else if m.Time.Add(2 * time.Millisecond).Before(dr.DroppedAt) {
					rep.Overtaken++
					rep.problem("overtaken", "%s delivered at %s, before %s was dropped by the operator at %s",
						describe(later), m.Time.Format(time.StampMilli), describe(r), dr.DroppedAt.Format(time.StampMilli))
				}
			}
			_ = k
		}
	}

	// No collateral stall: clean aggregates delivered within the bound.
	for k, rs := range aggs {
		if dirtyAgg[k] {
			continue
		}
		for _, r := range rs {
			m := first[r.N]
			if m == nil {
				continue // lost: counted above
			}
			lat := m.Time.Sub(r.Committed) - downtime(in.Down, r.Committed, m.Time)
			rep.MaxLatency = max(rep.MaxLatency, lat)
			if lat > in.StallBound {
				rep.Stalls++
				rep.problem("stall", "%s of a clean aggregate delivered %s after its commit (relay downtime excluded); bound %s",
					describe(r), lat.Round(time.Millisecond), in.StallBound)
			}
		}
	}

	if in.LastEnd != 0 && (in.SlotConfirmed < in.LastEnd || in.Checkpoint < in.LastEnd) {
		rep.NotConfirmed++
		rep.problem("not confirmed", "slot confirmed_flush_lsn %s, checkpoint %s; the last transaction ends at %s",
			in.SlotConfirmed, in.Checkpoint, in.LastEnd)
	}
	return rep
}

// downtime is how much of [from, to] the relay was down.
func downtime(down []Interval, from, to time.Time) time.Duration {
	var d time.Duration
	for _, iv := range down {
		a, b := iv.From, iv.To
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			d += b.Sub(a)
		}
	}
	return d
}

func headerKeys(hs []Header) []string {
	ks := make([]string, len(hs))
	for i, h := range hs {
		ks[i] = h.Key
	}
	return ks
}

func fmtHeaders(hs []Header) string {
	parts := make([]string, len(hs))
	for i, h := range hs {
		parts[i] = short(h.Key) + "=" + short(h.Value)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
