package sink

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// appendRecordBatch must write the bytes kafka-go's own encoder writes for
// the same records (it replaced it on the produce path), and they must read
// back as the same records.
func TestAppendRecordBatchMatchesKafkaGo(t *testing.T) {
	at := time.Date(2026, 11, 22, 23, 45, 0, 123_000_000, time.UTC)
	msgs := []kafka.Message{
		{Key: []byte("order-1"), Value: []byte(`{"a":1}`), Headers: []kafka.Header{{Key: "id", Value: []byte("e1")}, {Key: "event_type", Value: []byte("Created")}}, Time: at},
		{Key: []byte("order-2"), Value: nil, Time: at.Add(-5 * time.Millisecond)}, // tombstone, earlier time
		{Key: nil, Value: []byte{}, Headers: []kafka.Header{{Key: "n", Value: nil}}, Time: at.Add(time.Hour)},
		{Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 300), Time: at.Add(time.Second)},
	}
	for _, idx := range [][]int32{{0}, {0, 1, 2, 3}, {3, 1}} {
		t.Run(fmt.Sprint(idx), func(t *testing.T) {
			got := appendRecordBatch([]byte("prefix"), msgs, idx, at, noProducer)
			if !bytes.HasPrefix(got, []byte("prefix")) {
				t.Fatalf("appendRecordBatch overwrote dst's prefix")
			}
			got = got[len("prefix"):]

			recs := make([]kafka.Record, len(idx))
			for i, j := range idx {
				m := msgs[j]
				recs[i] = kafka.Record{Time: m.Time, Headers: m.Headers}
				if m.Key != nil {
					recs[i].Key = protocol.NewBytes(m.Key)
				}
				if m.Value != nil {
					recs[i].Value = protocol.NewBytes(m.Value)
				}
			}
			var want bytes.Buffer
			rs := protocol.RecordSet{Version: 2, Records: protocol.NewRecordReader(recs...)}
			if _, err := rs.WriteTo(&want); err != nil {
				t.Fatal(err)
			}
			// Both with the int32 size first, as a produce request carries it.
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("appendRecordBatch(%v) =\n%x\nkafka-go writes\n%x", idx, got, want.Bytes())
			}

			var back protocol.RecordSet
			if _, err := back.ReadFrom(bytes.NewReader(got)); err != nil {
				t.Fatalf("read back: %v", err)
			}
			for i, j := range idx {
				r, err := back.Records.ReadRecord()
				if err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				m := msgs[j]
				if r.Offset != int64(i) || !r.Time.Equal(m.Time.Truncate(time.Millisecond)) {
					t.Errorf("record %d: offset %d, time %v; want %d, %v", i, r.Offset, r.Time, i, m.Time)
				}
				if k := readAll(t, r.Key); (r.Key == nil) != (m.Key == nil) || !bytes.Equal(k, m.Key) {
					t.Errorf("record %d: key %q; want %q", i, k, m.Key)
				}
				if v := readAll(t, r.Value); (r.Value == nil) != (m.Value == nil) || !bytes.Equal(v, m.Value) {
					t.Errorf("record %d: value %q (nil %t); want %q (nil %t)", i, v, r.Value == nil, m.Value, m.Value == nil)
				}
				if len(r.Headers) != len(m.Headers) {
					t.Fatalf("record %d: %d headers; want %d", i, len(r.Headers), len(m.Headers))
				}
				for h := range r.Headers {
					if r.Headers[h].Key != m.Headers[h].Key || !bytes.Equal(r.Headers[h].Value, m.Headers[h].Value) {
						t.Errorf("record %d header %d = %q=%q; want %q=%q", i, h, r.Headers[h].Key, r.Headers[h].Value, m.Headers[h].Key, m.Headers[h].Value)
					}
				}
			}
		})
	}
}

// A record without a time gets the batch's encoding time, as with kafka-go.
func TestAppendRecordBatchZeroTime(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b := appendRecordBatch(nil, []kafka.Message{{Key: []byte("k"), Value: []byte("v")}}, []int32{0}, now, noProducer)
	var back protocol.RecordSet
	if _, err := back.ReadFrom(bytes.NewReader(b)); err != nil {
		t.Fatal(err)
	}
	r, err := back.Records.ReadRecord()
	if err != nil {
		t.Fatal(err)
	}
	if !r.Time.Equal(now) {
		t.Errorf("time of a record without one = %v; want the encoding time %v", r.Time, now)
	}
}

func readAll(t *testing.T, b protocol.Bytes) []byte {
	t.Helper()
	if b == nil {
		return nil
	}
	out, err := protocol.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
