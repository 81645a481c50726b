package router

import (
	"fmt"
	"slices"
	"strings"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/router/connect"
)

// A Header is a Kafka record header: the envelope's.
type Header = event.Header

// Header names set on every message; the names Debezium's outbox router uses
// for the event id, so consumers' dedup logic carries over.
const (
	HeaderID            = "id"
	HeaderEventType     = "event_type"
	HeaderAggregateType = "aggregate_type"
)

// A HeaderSet is the relay's own headers sent on every message, in the
// order id, event_type, aggregate_type. Its zero value is all three (the
// relay layout's default); Debezium sends only id.
type HeaderSet struct {
	set  bool
	mask uint8
}

const (
	hID uint8 = 1 << iota
	hEventType
	hAggregateType
)

// DefaultHeaders are the relay's own headers unless configured otherwise.
var DefaultHeaders = []string{HeaderID, HeaderEventType, HeaderAggregateType}

// NewHeaderSet returns the set of the given names; nil means
// DefaultHeaders, an empty non-nil slice none.
func NewHeaderSet(names []string) (HeaderSet, error) {
	if names == nil {
		return HeaderSet{}, nil
	}
	s := HeaderSet{set: true}
	for _, n := range names {
		switch n {
		case HeaderID:
			s.mask |= hID
		case HeaderEventType:
			s.mask |= hEventType
		case HeaderAggregateType:
			s.mask |= hAggregateType
		default:
			return HeaderSet{}, field.Errorf("Headers", "%q is not one of the relay's headers (%s); send other columns as headers with {Fields}", n, strings.Join(DefaultHeaders, ", "))
		}
	}
	return s, nil
}

func (s HeaderSet) has(bit uint8) bool { return !s.set || s.mask&bit != 0 }

// Names returns the set's header names in order.
func (s HeaderSet) Names() []string {
	names := make([]string, 0, 3)
	for i, bit := range []uint8{hID, hEventType, hAggregateType} {
		if s.has(bit) {
			names = append(names, DefaultHeaders[i])
		}
	}
	return names
}

// Reserved reports whether name is one of the set's headers, which no other
// header may duplicate or override.
func (s HeaderSet) Reserved(name string) bool {
	switch name {
	case HeaderID:
		return s.has(hID)
	case HeaderEventType:
		return s.has(hEventType)
	case HeaderAggregateType:
		return s.has(hAggregateType)
	}
	return false
}

// Build returns an event's Kafka headers: the set's own, then the entries of
// extra whose names are not the set's, in order; dropped counts those left
// out. The pipeline and the retry worker both build headers here, so an event
// carries the same headers whichever path delivers it.
func (s HeaderSet) Build(id, eventType, aggregateType []byte, extra []Header) (hs []Header, dropped int) {
	hs = s.appendOwn(make([]Header, 0, 3+len(extra)), id, eventType, aggregateType)
	for _, h := range extra {
		if s.Reserved(h.Key) {
			dropped++
			continue
		}
		hs = append(hs, h)
	}
	return hs, dropped
}

// appendOwn appends the set's own headers to hs: the router's part of
// Build, appending to its slab.
func (s HeaderSet) appendOwn(hs []Header, id, eventType, aggregateType []byte) []Header {
	mask := s.mask
	if !s.set {
		mask = hID | hEventType | hAggregateType
	}
	if mask&hID != 0 {
		hs = append(hs, Header{Key: HeaderID, Value: id})
	}
	if mask&hEventType != 0 {
		hs = append(hs, Header{Key: HeaderEventType, Value: eventType})
	}
	if mask&hAggregateType != 0 {
		hs = append(hs, Header{Key: HeaderAggregateType, Value: aggregateType})
	}
	return hs
}

// Headers returns the relay's own headers the Router sends: the retry
// worker sends the same.
func (r *Router) Headers() HeaderSet { return r.rt.headers }

// fieldHeaders appends the header fields to m.Extra, in their order, as
// Debezium's router adds them after id. A NULL column gives a header with a
// null value, as Debezium's does.
func (r *Router) fieldHeaders(m *Message, pos *positions, row [][]byte) {
	for i, f := range r.fields {
		if f.Placement != PlaceHeader {
			continue
		}
		v := connect.HeaderValue(pos.fields[i].typ, row[pos.fields[i].pos])
		m.Extra = append(m.Extra, Header{Key: f.Alias, Value: v})
	}
}

// extraHeaders reads the headers column into m.Extra, leaving out reserved
// names (counted in m.DroppedHeaders). A value that is not a JSON object is
// ignored with m.BadHeaders saying why: an optional header is not worth an
// event.
func (r *Router) extraHeaders(m *Message, b []byte) {
	if b == nil || string(b) == "null" { // SQL NULL, or JSON null: no extra headers
		return
	}
	n := len(m.Extra) // the header fields come first
	hs, err := appendJSONHeaders(slices.Grow(m.Extra, estimateHeaders(b)), b)
	if err != nil {
		m.Extra = m.Extra[:n]
		m.BadHeaders = fmt.Sprintf("the headers column %q is not a JSON object of header names to values (%v): the event is delivered without its extra headers", r.cols.Headers, err)
		return
	}
	kept := slices.DeleteFunc(hs[n:], func(h Header) bool { return r.rt.reserved[h.Key] })
	m.DroppedHeaders = len(hs) - n - len(kept)
	m.Extra = hs[:n+len(kept)]
}
