package sink

import (
	"encoding/binary"
	"hash/crc32"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
)

// appendRecordBatch appends msgs[idx...] to dst as one uncompressed Kafka
// record batch (message format v2, magic 2) after its int32 size: a record
// set as kafka-go's RawProduce sends it (protocol.RawRecordSet). It
// writes what kafka-go's own encoder (protocol.RecordSet.writeToVersion2)
// writes for the same records, field by field: a record without a time gets
// the batch's encoding time, as there. Encoding here, in one pass over the
// messages into a reused buffer, costs a fraction of kafka-go's encoder,
// which writes each varint and each key, value and header through an
// io.Writer into pages.
func appendRecordBatch(dst []byte, msgs []kafka.Message, idx []int32, now time.Time) []byte {
	// One growth, to a bound: varints take at most 10 bytes (36 a record
	// besides its headers' two).
	bound := 4 + 61
	for _, j := range idx {
		m := &msgs[j]
		bound += 36 + len(m.Key) + len(m.Value)
		for _, h := range m.Headers {
			bound += 20 + len(h.Key) + len(h.Value)
		}
	}
	dst = slices.Grow(dst, bound)
	sizeAt := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, 0) // record set size, below
	start := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)                  // base offset
	dst = binary.BigEndian.AppendUint32(dst, 0)                  // batch length, below
	dst = binary.BigEndian.AppendUint32(dst, 0xFFFFFFFF)         // partition leader epoch: -1
	dst = append(dst, 2)                                         // magic
	dst = binary.BigEndian.AppendUint32(dst, 0)                  // CRC-32C, below
	dst = binary.BigEndian.AppendUint16(dst, 0)                  // attributes: no compression, create time
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)-1)) // last offset delta
	tsAt := len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)                  // first timestamp, below
	dst = binary.BigEndian.AppendUint64(dst, 0)                  // max timestamp, below
	dst = binary.BigEndian.AppendUint64(dst, 0xFFFFFFFFFFFFFFFF) // producer id: -1
	dst = binary.BigEndian.AppendUint16(dst, 0xFFFF)             // producer epoch: -1
	dst = binary.BigEndian.AppendUint32(dst, 0xFFFFFFFF)         // base sequence: -1
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(idx)))   // records

	current := millis(now)
	var first, maxTS int64
	for i, j := range idx {
		m := &msgs[j]
		t := millis(m.Time)
		if t == 0 {
			t = current
		}
		if i == 0 {
			first = t
		}
		maxTS = max(maxTS, t)
		delta := t - first
		length := 1 + varintSize(delta) + varintSize(int64(i)) +
			nullBytesSize(m.Key) + nullBytesSize(m.Value) + varintSize(int64(len(m.Headers)))
		for _, h := range m.Headers {
			length += varintSize(int64(len(h.Key))) + len(h.Key) + nullBytesSize(h.Value)
		}
		dst = binary.AppendVarint(dst, int64(length))
		dst = append(dst, 0) // record attributes
		dst = binary.AppendVarint(dst, delta)
		dst = binary.AppendVarint(dst, int64(i))
		dst = appendNullBytes(dst, m.Key)
		dst = appendNullBytes(dst, m.Value)
		dst = binary.AppendVarint(dst, int64(len(m.Headers)))
		for _, h := range m.Headers {
			dst = binary.AppendVarint(dst, int64(len(h.Key)))
			dst = append(dst, h.Key...)
			dst = appendNullBytes(dst, h.Value)
		}
	}
	binary.BigEndian.PutUint64(dst[tsAt:], uint64(first))
	binary.BigEndian.PutUint64(dst[tsAt+8:], uint64(maxTS))
	binary.BigEndian.PutUint32(dst[sizeAt:], uint32(len(dst)-start))
	binary.BigEndian.PutUint32(dst[start+8:], uint32(len(dst)-start-12))
	binary.BigEndian.PutUint32(dst[start+17:], crc32.Checksum(dst[start+21:], castagnoli))
	return dst
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// millis is kafka-go's timestamp of t: milliseconds since the epoch, 0 for
// the zero time.
func millis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano() / int64(time.Millisecond)
}

// varintSize is the length of n as a zig-zag varint.
func varintSize(n int64) int {
	u := uint64(n<<1) ^ uint64(n>>63)
	l := 1
	for u >= 0x80 {
		u >>= 7
		l++
	}
	return l
}

// nullBytesSize and appendNullBytes: a varint length, -1 for nil, then the bytes.
func nullBytesSize(b []byte) int {
	if b == nil {
		return varintSize(-1)
	}
	return varintSize(int64(len(b))) + len(b)
}

func appendNullBytes(dst, b []byte) []byte {
	if b == nil {
		return binary.AppendVarint(dst, -1)
	}
	return append(binary.AppendVarint(dst, int64(len(b))), b...)
}
