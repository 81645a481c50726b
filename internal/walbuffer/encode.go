package walbuffer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
)

// A row's event column is the entry in a compact binary form: a version
// byte, then each field in a fixed order. Byte strings are a uvarint of their
// length plus one (0: nil) and their bytes, so any bytes survive (NUL, invalid
// UTF-8: the retry table needs a last-resort record for those, this table
// does not); times are Unix nanoseconds as a varint (0: zero). Not meant to
// be read by hand: `lag` and `status` report the buffer.
//
// Version 2 is version 1 plus, last, the router's reason code of a refused
// event (Entry.FailureCode). An entry without a code is still written as
// version 1, so that a binary that reads only version 1 (before the code)
// reads every entry but those, and stops on those with an error naming the
// version rather than losing them.
const (
	version1 = 1
	version2 = 2 // + FailureCode
)

func encode(e *Entry) []byte {
	ev := &e.Event
	b := make([]byte, 0, 64+len(ev.Key)+len(ev.Value)+len(ev.ID)+len(ev.AggregateID)+len(ev.Topic))
	v := byte(version1)
	if e.FailureCode != "" {
		v = version2
	}
	b = append(b, v)
	for _, s := range []string{ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, ev.Topic, ev.Table, ev.Refill, e.Failure} {
		b = appendBytes(b, []byte(s), true)
	}
	b = appendBytes(b, ev.Key, ev.Key != nil)
	b = appendBytes(b, ev.Value, ev.Value != nil)
	b = appendHeaders(b, ev.Headers)
	b = appendHeaders(b, ev.Extra)
	b = binary.AppendVarint(b, unixNano(ev.Time))
	b = binary.AppendVarint(b, unixNano(ev.CommitTime))
	b = binary.AppendUvarint(b, uint64(ev.CommitLSN))
	b = binary.AppendUvarint(b, uint64(ev.Pos))
	if v == version2 {
		b = appendBytes(b, []byte(e.FailureCode), true)
	}
	return b
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func appendBytes(b, s []byte, present bool) []byte {
	if !present {
		return binary.AppendUvarint(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(s))+1)
	return append(b, s...)
}

func appendHeaders(b []byte, hs []event.Header) []byte {
	b = binary.AppendUvarint(b, uint64(len(hs)))
	for _, h := range hs {
		b = appendBytes(b, []byte(h.Key), true)
		b = appendBytes(b, h.Value, h.Value != nil)
	}
	return b
}

var errShort = errors.New("truncated")

type reader struct {
	b   []byte
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil || n == 0 {
		return nil
	}
	n--
	if uint64(len(r.b)) < n {
		r.err = errShort
		return nil
	}
	out := r.b[:n:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) time() time.Time {
	if ns := r.varint(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

func (r *reader) headers() []event.Header {
	n := r.uvarint()
	if r.err != nil || n == 0 {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShort
		return nil
	}
	hs := make([]event.Header, n)
	for i := range hs {
		hs[i] = event.Header{Key: string(r.bytes()), Value: r.bytes()}
	}
	return hs
}

func decode(b []byte) (Entry, error) {
	if len(b) == 0 {
		return Entry{}, errShort
	}
	v := b[0]
	if v != version1 && v != version2 {
		return Entry{}, fmt.Errorf("unknown encoding version %d (this binary reads %d and %d: a newer outbox-relay wrote it? run that one until the buffer is drained)", v, version1, version2)
	}
	r := &reader{b: b[1:]}
	var e Entry
	ev := &e.Event
	for _, s := range []*string{&ev.ID, &ev.AggregateType, &ev.AggregateID, &ev.Type, &ev.Topic, &ev.Table, &ev.Refill, &e.Failure} {
		*s = string(r.bytes())
	}
	ev.Key, ev.Value = r.bytes(), r.bytes()
	ev.Headers, ev.Extra = r.headers(), r.headers()
	ev.Time, ev.CommitTime = r.time(), r.time()
	ev.CommitLSN = pglogrepl.LSN(r.uvarint())
	ev.Pos = int(r.uvarint())
	if v == version2 {
		e.FailureCode = string(r.bytes())
	}
	if r.err == nil && len(r.b) != 0 {
		r.err = errors.New("trailing bytes")
	}
	if r.err != nil {
		return Entry{}, r.err
	}
	return e, nil
}
