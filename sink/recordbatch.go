package sink

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/compress"
)

// batchHeader is what a record batch says of its producer: its id, epoch and
// the sequence number of its first record (idempotence.go). noProducer is a
// batch of no idempotent producer, as kafka-go writes them.
type batchHeader struct {
	producerID    int64
	epoch         int16
	baseSeq       int32
	transactional bool // the batch belongs to a transaction (txn.go)
}

// attrTransactional is the record batch attribute bit of a transaction's
// batch.
const attrTransactional = 1 << 4

// markTransactional sets the transactional bit in the attributes of the
// batch that starts at batch[0] (its base offset) when hdr says so; before
// finishBatch, which computes the CRC over them.
func markTransactional(batch []byte, hdr batchHeader) {
	if hdr.transactional {
		batch[22] |= attrTransactional // attributes: an int16 at offset 21
	}
}

var noProducer = batchHeader{producerID: -1, epoch: -1, baseSeq: -1}

// appendRecordBatch appends msgs[idx...] to dst as one uncompressed Kafka
// record batch (message format v2, magic 2) after its int32 size: a record
// set as kafka-go's RawProduce sends it (protocol.RawRecordSet). With
// noProducer it writes what kafka-go's own encoder
// (protocol.RecordSet.writeToVersion2) writes for the same records, field by
// field: a record without a time gets the batch's encoding time, as there.
// With a producer (hdr) the batch carries its id, epoch and base sequence, and
// the attributes get the transactional bit only in a transaction, as the
// Java producer sets them: an idempotent batch is marked by its producer id
// alone. The same records, hdr and now always give the same
// bytes: a resend is byte-identical (idempotence.go). Encoding here, in one
// pass over the messages into a reused buffer, costs a fraction of kafka-go's
// encoder, which writes each varint and each key, value and header through an
// io.Writer into pages.
func appendRecordBatch(dst []byte, msgs []kafka.Message, idx []int32, now time.Time, hdr batchHeader) []byte {
	dst = slices.Grow(dst, batchOverhead+recordsBound(msgs, idx))
	// Attributes 0: no compression, create time; the timestamps once the
	// records are written.
	dst, sizeAt, start, tsAt := appendBatchHeader(dst, len(idx), 0, 0, 0, hdr)
	dst, first, maxTS := appendRecords(dst, msgs, idx, now)
	binary.BigEndian.PutUint64(dst[tsAt:], uint64(first))
	binary.BigEndian.PutUint64(dst[tsAt+8:], uint64(maxTS))
	markTransactional(dst[start:], hdr)
	return finishBatch(dst, sizeAt, start)
}

// appendBatchHeader appends the int32 size of a record batch of n records
// and its header, up to the record count, with attributes attrs and the
// timestamps first and maxTS (0 to fill in later, at tsAt). It returns where
// the size and the batch start, for finishBatch, which fills in the sizes and
// the CRC.
func appendBatchHeader(dst []byte, n int, attrs uint16, first, maxTS int64, hdr batchHeader) (_ []byte, sizeAt, start, tsAt int) {
	sizeAt = len(dst)
	dst = binary.BigEndian.AppendUint32(dst, 0) // record set size, below
	start = len(dst)
	dst = binary.BigEndian.AppendUint64(dst, 0)          // base offset
	dst = binary.BigEndian.AppendUint32(dst, 0)          // batch length, below
	dst = binary.BigEndian.AppendUint32(dst, 0xFFFFFFFF) // partition leader epoch: -1
	dst = append(dst, 2)                                 // magic
	dst = binary.BigEndian.AppendUint32(dst, 0)          // CRC-32C, below
	dst = binary.BigEndian.AppendUint16(dst, attrs)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n-1)) // last offset delta
	tsAt = len(dst)
	dst = binary.BigEndian.AppendUint64(dst, uint64(first))
	dst = binary.BigEndian.AppendUint64(dst, uint64(maxTS))
	dst = binary.BigEndian.AppendUint64(dst, uint64(hdr.producerID))
	dst = binary.BigEndian.AppendUint16(dst, uint16(hdr.epoch))
	dst = binary.BigEndian.AppendUint32(dst, uint32(hdr.baseSeq))
	dst = binary.BigEndian.AppendUint32(dst, uint32(n)) // records
	return dst, sizeAt, start, tsAt
}

// finishBatch fills in the sizes and the CRC of the batch that starts at
// start, after its int32 size at sizeAt.
func finishBatch(dst []byte, sizeAt, start int) []byte {
	binary.BigEndian.PutUint32(dst[sizeAt:], uint32(len(dst)-start))
	binary.BigEndian.PutUint32(dst[start+8:], uint32(len(dst)-start-12))
	binary.BigEndian.PutUint32(dst[start+17:], crc32.Checksum(dst[start+21:], castagnoli))
	return dst
}

// appendRecords appends the records of msgs[idx...] to dst and returns it
// with the first and the largest timestamp. The records' encoding is the same
// compressed or not.
func appendRecords(dst []byte, msgs []kafka.Message, idx []int32, now time.Time) (_ []byte, first, maxTS int64) {
	current := millis(now)
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
	return dst, first, maxTS
}

// batchOverhead is a record batch's header with the int32 size before it.
const batchOverhead = 4 + 61

// recordsBound bounds the encoded size of msgs[idx...], for one growth of the
// buffer: varints take at most 10 bytes (36 a record besides its headers' two).
func recordsBound(msgs []kafka.Message, idx []int32) int {
	bound := 0
	for _, j := range idx {
		m := &msgs[j]
		bound += 36 + len(m.Key) + len(m.Value)
		for _, h := range m.Headers {
			bound += 20 + len(h.Key) + len(h.Value)
		}
	}
	return bound
}

// appendCompressedBatch is appendRecordBatch for a compressed batch: the
// records, encoded alike into scratch, are compressed with codec (kafka-go's
// own codecs, as its encoder uses them) after the batch header, whose
// attributes name the codec. It returns dst and scratch, grown, for reuse.
// The same records, hdr and now give the same bytes, as the codecs are
// deterministic for the same input and level.
func appendCompressedBatch(dst, scratch []byte, msgs []kafka.Message, idx []int32, now time.Time, hdr batchHeader, codec compress.Codec) (_, _ []byte, err error) {
	scratch = slices.Grow(scratch[:0], recordsBound(msgs, idx))
	scratch, first, maxTS := appendRecords(scratch, msgs, idx, now)
	dst = slices.Grow(dst, batchOverhead+len(scratch)/2)
	// Attributes: the codec, create time.
	dst, sizeAt, start, _ := appendBatchHeader(dst, len(idx), uint16(codec.Code()), first, maxTS, hdr)
	w := &appender{b: dst}
	zw := codec.NewWriter(w)
	if _, err := zw.Write(scratch); err != nil {
		zw.Close()
		return dst[:sizeAt], scratch, fmt.Errorf("compress record batch (%s): %w", codec.Name(), err)
	}
	if err := zw.Close(); err != nil {
		return dst[:sizeAt], scratch, fmt.Errorf("compress record batch (%s): %w", codec.Name(), err)
	}
	markTransactional(w.b[start:], hdr)
	return finishBatch(w.b, sizeAt, start), scratch, nil
}

// appender is an io.Writer appending to a byte slice.
type appender struct{ b []byte }

func (a *appender) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
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
