package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// This file decodes pgoutput proto_version 1 messages. pglogrepl.Parse is not
// used on the hot path because it indexes without bounds checks (bad bytes
// panic) and allocates once per column; here every read is checked and a row's
// values share one allocation.

var errShort = errors.New("message truncated")

// reader reads big-endian protocol fields from a message, remembering the
// first error so that callers check once at the end.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b) < n {
		r.fail(errShort)
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) u8() byte {
	p := r.take(1)
	if p == nil {
		return 0
	}
	return p[0]
}

func (r *reader) u16() uint16 {
	p := r.take(2)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint16(p)
}

func (r *reader) u32() uint32 {
	p := r.take(4)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint32(p)
}

func (r *reader) u64() uint64 {
	p := r.take(8)
	if p == nil {
		return 0
	}
	return binary.BigEndian.Uint64(p)
}

func (r *reader) lsn() pglogrepl.LSN { return pglogrepl.LSN(r.u64()) }

// pgEpoch is 2000-01-01 UTC, the origin of Postgres timestamps.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func (r *reader) time() time.Time {
	us := int64(r.u64())
	return pgEpoch.Add(time.Duration(us) * time.Microsecond)
}

// str reads a NUL-terminated string.
func (r *reader) str() string {
	if r.err != nil {
		return ""
	}
	i := bytes.IndexByte(r.b, 0)
	if i < 0 {
		r.fail(errors.New("string not terminated"))
		return ""
	}
	s := string(r.b[:i])
	r.b = r.b[i+1:]
	return s
}

// pgoutput message bodies (after the type byte).

type beginMsg struct {
	FinalLSN   pglogrepl.LSN
	CommitTime time.Time
	Xid        uint32
}

func parseBegin(b []byte) (beginMsg, error) {
	r := reader{b: b}
	m := beginMsg{FinalLSN: r.lsn(), CommitTime: r.time(), Xid: r.u32()}
	return m, r.err
}

type commitMsg struct {
	Flags      byte
	CommitLSN  pglogrepl.LSN
	EndLSN     pglogrepl.LSN
	CommitTime time.Time
}

func parseCommit(b []byte) (commitMsg, error) {
	r := reader{b: b}
	m := commitMsg{Flags: r.u8(), CommitLSN: r.lsn(), EndLSN: r.lsn(), CommitTime: r.time()}
	return m, r.err
}

func parseRelation(b []byte) (*Relation, error) {
	r := reader{b: b}
	rel := &Relation{ID: r.u32(), Namespace: r.str(), Name: r.str()}
	r.u8() // replica identity: irrelevant for inserts
	n := int(r.u16())
	if r.err != nil {
		return nil, fmt.Errorf("relation: %w", r.err)
	}
	// Each column takes at least 10 bytes; checking first keeps a forged
	// count from allocating a huge slice.
	if n > len(r.b)/10 {
		return nil, fmt.Errorf("relation %s.%s: %d columns: %w", rel.Namespace, rel.Name, n, errShort)
	}
	rel.Columns = make([]Column, n)
	for i := range rel.Columns {
		r.u8() // flags: part of the key
		rel.Columns[i].Name = r.str()
		rel.Columns[i].TypeOID = r.u32()
		rel.Columns[i].TypeMod = int32(r.u32())
	}
	if r.err != nil {
		return nil, fmt.Errorf("relation %s.%s: %w", rel.Namespace, rel.Name, r.err)
	}
	return rel, nil
}

// parseInsertTuple decodes an Insert body into the relation ID and the row's
// values, copied into one allocation (the input is the connection's read
// buffer, which is reused). hdrs supplies the [][]byte headers (see slab).
func parseInsert(b []byte, hdrs *slab) (relID uint32, values [][]byte, size int, err error) {
	r := reader{b: b}
	relID = r.u32()
	if k := r.u8(); r.err == nil && k != 'N' {
		return relID, nil, 0, fmt.Errorf("insert: tuple kind %q; want 'N'", k)
	}
	n := int(r.u16())
	if r.err != nil {
		return relID, nil, 0, fmt.Errorf("insert: %w", r.err)
	}
	tuple := r.b
	// First pass: validate and size, so the copy is one exact allocation.
	for i := 0; i < n; i++ {
		switch kind := r.u8(); kind {
		case 'n':
		case 't':
			size += len(r.take(int(r.u32())))
		case 'u':
			return relID, nil, 0, fmt.Errorf("insert: column %d: unchanged TOAST value in an insert", i)
		case 'b':
			return relID, nil, 0, fmt.Errorf("insert: column %d: binary value (binary mode was not requested)", i)
		default:
			if r.err == nil {
				return relID, nil, 0, fmt.Errorf("insert: column %d: unknown value kind %q", i, kind)
			}
		}
		if r.err != nil {
			return relID, nil, 0, fmt.Errorf("insert: column %d: %w", i, r.err)
		}
	}
	data := make([]byte, 0, size)
	values = hdrs.take(n, size)
	r = reader{b: tuple}
	for i := 0; i < n; i++ {
		if r.u8() == 'n' {
			continue // values[i] stays nil: SQL NULL
		}
		v := r.take(int(r.u32()))
		start := len(data)
		data = append(data, v...)
		values[i] = data[start:len(data):len(data)]
	}
	return relID, values, size, nil
}

// parseRelID reads the relation ID that starts Update and Delete bodies; the
// tuples after it are not needed because those changes are ignored.
func parseRelID(b []byte) (uint32, error) {
	r := reader{b: b}
	id := r.u32()
	return id, r.err
}

func parseTruncate(b []byte) ([]uint32, error) {
	r := reader{b: b}
	n := int(r.u32())
	r.u8() // options
	if r.err != nil {
		return nil, fmt.Errorf("truncate: %w", r.err)
	}
	if n > len(r.b)/4 {
		return nil, fmt.Errorf("truncate: %d relations: %w", n, errShort)
	}
	ids := make([]uint32, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		ids = append(ids, r.u32())
	}
	return ids, r.err
}

// slab hands out [][]byte headers carved from shared chunks, so a row costs
// one allocation for its value bytes and (amortised) none for its headers.
// A carved slice has its capacity clipped, so appending to it cannot reach a
// neighbour's headers.
//
// A chunk stays alive while any row carved from it does, and with it every
// other row's values its headers point to: one row held (in the retry
// table's hands, in a Kafka write) must not pin a transaction's worth of
// large values. So a chunk is shared only by rows whose values total at
// most slabBytes, and a row larger than that gets headers of its own (one
// small allocation beside its large one). What a held row pins beyond
// itself is thus at most slabBytes.
type slab struct {
	buf   [][]byte
	bytes int // value bytes of the rows carved from buf
}

// slabBytes bounds the value bytes of the rows that share a chunk of
// headers: 1024 headers of ~300-byte rows (the common outbox event) fill a
// chunk before this does.
const slabBytes = 64 << 10

// take returns headers for a row of n values totalling size bytes.
func (s *slab) take(n, size int) [][]byte {
	if size > slabBytes {
		return make([][]byte, n)
	}
	if n > cap(s.buf)-len(s.buf) || s.bytes+size > slabBytes {
		s.buf = make([][]byte, 0, max(n, 1024))
		s.bytes = 0
	}
	s.bytes += size
	start := len(s.buf)
	s.buf = s.buf[:start+n]
	return s.buf[start : start+n : start+n]
}
