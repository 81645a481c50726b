// Package event defines the envelope that every stage of outbox-relay passes
// on: one outbox event, from the router through the sink and the retry table
// to the checkpoint.
//
// Invariants:
//
//   - An event's identity is its row's id column and its place in the WAL
//     (the commit LSN of its transaction and its position in it): PositionKey.
//     Nothing in its data (headers, payload) can change either.
//   - Its ordering lane (Lane) is its topic and Kafka key: the events of one
//     lane must reach Kafka in commit order, and a failed event holds back
//     the later events of its lane, never of another. An event that has no
//     topic or no key has a lane of its own kind (UnroutableLane) that cannot
//     be equal to a routed one's.
//
// The package does no I/O and has no dependency on Kafka or Postgres
// clients: the sink turns events into Kafka records, the retry table into
// rows.
package event

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
)

// HeaderDelivery is the header of every message a relay that delivers
// exactly once sends outside its stream's transactions (by the retry worker,
// replay or a refill), with the value DeliveryAtLeastOnce: a consumer may see
// that event again.
const (
	HeaderDelivery      = "outbox-relay-delivery"
	DeliveryAtLeastOnce = "at-least-once"
)

// AtLeastOnce is the HeaderDelivery header of a message sent at least once.
func AtLeastOnce() Header { return Header{Key: HeaderDelivery, Value: []byte(DeliveryAtLeastOnce)} }

// A Header is a Kafka record header.
type Header struct {
	Key   string
	Value []byte
}

// An Event is one outbox event.
type Event struct {
	ID            string // the row's id column; "" when it was NULL or empty
	AggregateType string
	AggregateID   string
	Type          string // the event_type column

	Topic string // "" when it could not be routed
	Key   []byte // the aggregate id's bytes: the Kafka key
	Value []byte // the payload as stored; nil when NULL
	// Headers are what Kafka gets: the relay's own (id, event_type,
	// aggregate_type, as configured), then Extra. Extra are the others:
	// the header fields, the headers column's entries the relay kept, the
	// trace context and CloudEvents attributes. Every stage and the retry
	// table (retry.Event.Extra) use these two names in these meanings.
	Headers []Header
	Extra   []Header

	// Time is the message's timestamp, from the outbox.columns.timestamp
	// column; zero means the time Kafka receives it (the producer's now).
	Time time.Time

	CommitLSN  pglogrepl.LSN // commit LSN of its transaction
	CommitTime time.Time
	Pos        int // its position in the transaction, from 1

	// Span, when the relay exports spans and the row carried a trace
	// context, is the relay's span for the event: its traceparent header
	// names it, and it is exported once Kafka acknowledged the event.
	Span *Span

	// Table is the outbox table the event was read from (schema.name), ""
	// for an event of a logical decoding message. With several outbox
	// tables it says whose routing the retry worker applies.
	Table string

	// Refill is the id of the refill that read the event from the outbox
	// table rather than from the WAL (relay.Refill), "" for the stream's.
	// Its commit LSN is then unknown: Pos is its place in the refill.
	Refill string
}

// A Span is the identity of the relay's span of one event: a child of the
// row's context (Parent) in the row's trace.
type Span struct {
	TraceID        [16]byte
	SpanID, Parent [8]byte
	Flags          byte   // the row's trace flags (sampled)
	State          string // the row's tracestate
}

// PositionKey is the event's unique, bounded identity in the retry table:
// "lsn:<commit LSN>:<position>", which a resend after a crash reproduces; for
// a refilled event "refill:<refill id>:<position in the refill>", which can
// never equal a streamed event's.
func (e *Event) PositionKey() string {
	if e.Refill != "" {
		return fmt.Sprintf("refill:%s:%d", e.Refill, e.Pos)
	}
	return PositionKey(e.CommitLSN, e.Pos)
}

// PositionKey formats the position of an event in the WAL.
func PositionKey(commitLSN pglogrepl.LSN, pos int) string {
	return fmt.Sprintf("lsn:%s:%d", commitLSN, pos)
}

// Lane returns the event's ordering lane: its topic and key, or, when it has
// no topic or no aggregate id, UnroutableLane.
func (e *Event) Lane() Lane {
	if e.Topic == "" || len(e.Key) == 0 {
		return UnroutableLane(e.AggregateType, e.AggregateID)
	}
	return Lane{Topic: e.Topic, Key: string(e.Key)}
}

// A Lane is an ordering lane: the events of one aggregate on one topic. It is
// comparable, for use as a map key.
type Lane struct {
	Topic string // "" for an unroutable lane, which Key then names
	Key   string
}

// UnroutableLane is the lane of events of an aggregate that have no topic or
// no aggregate id. Its String cannot be equal to a routed lane's (':' is not
// legal in a topic name).
func UnroutableLane(aggregateType, aggregateID string) Lane {
	return Lane{Key: "unroutable:" + PlainText(aggregateType) + "/" + PlainText(aggregateID)}
}

// IsPlainText reports whether a Postgres text column (or a jsonb string) can
// hold s unchanged: valid UTF-8 without NUL bytes.
func IsPlainText(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }

// PlainText returns s with invalid UTF-8 and NUL bytes replaced by U+FFFD:
// text that any Postgres text column holds.
func PlainText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// String is the lane as the retry table's aggregate column stores it:
// topic/key, topic#<hex key> for a key that is not text Postgres can hold
// (invalid UTF-8 or NUL), or the unroutable lane's name. Topic names cannot
// hold '/', '#' or ':', so it is unambiguous.
func (l Lane) String() string {
	if l.Topic == "" {
		return l.Key
	}
	if IsPlainText(l.Key) {
		return l.Topic + "/" + l.Key
	}
	return l.Topic + "#" + hex.EncodeToString([]byte(l.Key))
}
