package sink

import (
	"bytes"
	"encoding/binary"
	"errors"
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

// The sequence numbers of a partition with several batches in flight
// (pipeline.go): which batch may be sent next, and under which numbers, after
// each combination of answers.
func TestSequencePipelined(t *testing.T) {
	msgs := []kafka.Message{{Value: []byte("a")}, {Value: []byte("b")}, {Value: []byte("c")}, {Value: []byte("d")}}
	const (
		ack = iota
		refuse
		lose
	)
	answer := func(k *Kafka, g *partitionBatch, a int) error {
		switch a {
		case ack:
			return k.landGroup(g, nil, true)
		case refuse:
			return k.landGroup(g, kafka.OutOfOrderSequenceNumber, true)
		default:
			return k.landGroup(g, kafka.RequestTimedOut, true)
		}
	}
	tests := []struct {
		name     string
		first    int // answer to the first batch (records a, b)
		second   int // answer to the second (c, d), sent behind it
		resend   []int32
		wantBase int32
		wantErr  error
	}{
		// Both appended: the next batch follows them.
		{name: "both acknowledged", first: ack, second: ack, resend: []int32{0}, wantBase: 14},
		// The first refused, the second (behind it) refused too: the
		// numbers are free again, from the first's base.
		{name: "first refused, second refused behind it", first: refuse, second: refuse, resend: []int32{0, 1}, wantBase: 10},
		// The first lost, the second acknowledged: the first is in the log
		// (the broker checks order), and only it may be sent again, as is.
		{name: "first lost, second acknowledged: the first again", first: lose, second: ack, resend: []int32{0, 1}, wantBase: 10},
		{name: "first lost, second acknowledged: other records", first: lose, second: ack, resend: []int32{0}, wantErr: errSequenceReused},
		// The first lost, the second refused: the first again, as is.
		{name: "first lost, second refused", first: lose, second: refuse, resend: []int32{0, 1}, wantBase: 10},
		// The first refused, the second lost (it may have been appended,
		// as far as the sink can tell): no batch under those numbers.
		{name: "first refused, second lost", first: refuse, second: lose, resend: []int32{0, 1}, wantErr: errSequenceReused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := &Kafka{prod: producer{id: 7, seqs: map[topicPartition]*sequence{}}}
			tp := topicPartition{"t", 0}
			s := k.sequenceOf(tp)
			s.next, s.acked = 10, true
			g1 := &partitionBatch{topic: "t", idx: []int32{0, 1}}
			g2 := &partitionBatch{topic: "t", idx: []int32{2, 3}}
			for _, g := range []*partitionBatch{g1, g2} {
				if err := k.encode(msgs, g); err != nil {
					t.Fatalf("encode = %v", err)
				}
			}
			if g1.hdr.baseSeq != 10 || g2.hdr.baseSeq != 12 || !g2.sent.behind {
				t.Fatalf("pipelined bases %d, %d (behind %v); want 10, 12 (behind)", g1.hdr.baseSeq, g2.hdr.baseSeq, g2.sent.behind)
			}
			err1, err2 := answer(k, g1, tt.first), answer(k, g2, tt.second)
			var pse *ProducerStateError
			if errors.As(err1, &pse) && tt.first == refuse {
				// The head's sequence error is the broker's state: fine.
			} else if errors.As(err2, &pse) {
				t.Errorf("second batch's error = %v; want no producer state error behind a failed batch", err2)
			}
			if tt.first == ack && tt.second == ack {
				g := &partitionBatch{topic: "t", idx: tt.resend}
				if err := k.encode(msgs, g); err != nil || g.hdr.baseSeq != tt.wantBase {
					t.Errorf("next batch: base %d, %v; want %d, nil", g.hdr.baseSeq, err, tt.wantBase)
				}
				return
			}
			g := &partitionBatch{topic: "t", idx: tt.resend}
			err := k.encode(msgs, g)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("encode of %v = %v; want %v", tt.resend, err, tt.wantErr)
			}
			if err == nil && g.hdr.baseSeq != tt.wantBase {
				t.Errorf("encode of %v: base %d; want %d", tt.resend, g.hdr.baseSeq, tt.wantBase)
			}
			if err == nil && tt.first == lose && !bytes.Equal(g.buf, g1.buf) {
				t.Errorf("a batch whose outcome is unknown went again with other bytes")
			}
		})
	}
}
