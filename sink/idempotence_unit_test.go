package sink

import (
	"bytes"
	"encoding/binary"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/initproducerid"
)

// An idempotent batch carries the producer id, epoch and base sequence in
// the header fields the Java producer writes, with attributes unchanged
// (no transactional bit), compressed or not, and reads back as the records.
func TestRecordBatchProducerFields(t *testing.T) {
	at := time.Date(2026, 11, 25, 1, 2, 3, 0, time.UTC)
	msgs := []kafka.Message{
		{Key: []byte("a"), Value: []byte("one"), Headers: []kafka.Header{{Key: "id", Value: []byte("e1")}}, Time: at},
		{Key: []byte("b"), Value: bytes.Repeat([]byte("two"), 100), Time: at.Add(time.Millisecond)},
	}
	hdr := batchHeader{producerID: 4711, epoch: 3, baseSeq: math.MaxInt32 - 1}
	for _, c := range []kafka.Compression{0, kafka.Gzip, kafka.Snappy, kafka.Lz4, kafka.Zstd} {
		var b []byte
		if c == 0 {
			b = appendRecordBatch(nil, msgs, []int32{0, 1}, at, hdr)
		} else {
			var err error
			b, _, err = appendCompressedBatch(nil, nil, msgs, []int32{0, 1}, at, hdr, c.Codec())
			if err != nil {
				t.Fatal(err)
			}
		}
		batch := b[4:] // after the record set's size
		if got := int64(binary.BigEndian.Uint64(batch[43:])); got != hdr.producerID {
			t.Errorf("%v: producer id = %d; want %d", c, got, hdr.producerID)
		}
		if got := int16(binary.BigEndian.Uint16(batch[51:])); got != hdr.epoch {
			t.Errorf("%v: epoch = %d; want %d", c, got, hdr.epoch)
		}
		if got := int32(binary.BigEndian.Uint32(batch[53:])); got != hdr.baseSeq {
			t.Errorf("%v: base sequence = %d; want %d", c, got, hdr.baseSeq)
		}
		if got := binary.BigEndian.Uint16(batch[21:]); got != uint16(c) {
			t.Errorf("%v: attributes = %#x; want %#x (the codec only: not transactional)", c, got, uint16(c))
		}
		var back protocol.RecordSet
		if _, err := back.ReadFrom(bytes.NewReader(b)); err != nil {
			t.Fatalf("%v: read back: %v", c, err)
		}
		for i := range msgs {
			r, err := back.Records.ReadRecord()
			if err != nil {
				t.Fatalf("%v: record %d: %v", c, i, err)
			}
			if v := readAll(t, r.Value); !bytes.Equal(v, msgs[i].Value) {
				t.Errorf("%v: record %d value = %q; want %q", c, i, v, msgs[i].Value)
			}
		}
		// Deterministic: a resend's candidate encoding equals the first.
		var again []byte
		if c == 0 {
			again = appendRecordBatch(nil, msgs, []int32{0, 1}, at, hdr)
		} else {
			again, _, _ = appendCompressedBatch(nil, nil, msgs, []int32{0, 1}, at, hdr, c.Codec())
		}
		if !bytes.Equal(again, b) {
			t.Errorf("%v: the same records, header and time encode to other bytes", c)
		}
	}
}

// Sequence numbers wrap past MaxInt32 to 0, as Kafka's do.
func TestNextSequence(t *testing.T) {
	tests := []struct {
		base int32
		n    int
		want int32
	}{
		{0, 10, 10},
		{math.MaxInt32 - 10, 10, math.MaxInt32},
		{math.MaxInt32 - 10, 11, 0},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32 - 1, 5, 3},
	}
	for _, tt := range tests {
		if got := nextSequence(tt.base, tt.n); got != tt.want {
			t.Errorf("nextSequence(%d, %d) = %d; want %d", tt.base, tt.n, got, tt.want)
		}
	}
}

// initProducerIDRequest must have the registered request type's fields, in
// order, with the same tags: kafka-go encodes it by those field indexes.
func TestInitProducerIDRequestLayout(t *testing.T) {
	want := reflect.TypeOf(initproducerid.Request{})
	got := reflect.TypeOf(initProducerIDRequest{})
	if got.NumField() != want.NumField() {
		t.Fatalf("initProducerIDRequest has %d fields; kafka-go's initproducerid.Request %d", got.NumField(), want.NumField())
	}
	for i := range want.NumField() {
		w, g := want.Field(i), got.Field(i)
		if w.Name != g.Name || w.Type != g.Type || w.Tag != g.Tag || w.Offset != g.Offset {
			t.Errorf("field %d = %s %s %q; kafka-go has %s %s %q", i, g.Name, g.Type, g.Tag, w.Name, w.Type, w.Tag)
		}
	}
}

// The uncompressed encoder allocates nothing once its buffer has grown, with
// a producer or without: the produce path's cost per record.
func TestAppendRecordBatchAllocations(t *testing.T) {
	msgs := make([]kafka.Message, 1000)
	idx := make([]int32, len(msgs))
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("order-1"), Value: bytes.Repeat([]byte("x"), 300),
			Headers: []kafka.Header{{Key: "id", Value: []byte("e")}}, Time: time.Now()}
		idx[i] = int32(i)
	}
	for _, hdr := range []batchHeader{noProducer, {producerID: 1, epoch: 0, baseSeq: 7}} {
		buf := appendRecordBatch(nil, msgs, idx, time.Now(), hdr)
		if n := testing.AllocsPerRun(20, func() { buf = appendRecordBatch(buf[:0], msgs, idx, time.Now(), hdr) }); n != 0 {
			t.Errorf("appendRecordBatch(%+v, 1000 records) allocates %.0f times; want 0", hdr, n)
		}
	}
}
