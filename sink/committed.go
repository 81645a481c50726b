package sink

import (
	"context"

	"github.com/segmentio/kafka-go"
)

// LastCommitted returns the value of the latest committed record with key
// in topic (a compacted topic of the relay's own, such as its checkpoints),
// read as a read_committed consumer reads it (reader.go) from the partition
// Write puts the key in; found is false when there is none. It reads back
// from the partition's end, further each time, so that a long uncompacted
// tail of other keys costs only what it must. Not safe for concurrent use
// with Write.
func (k *Kafka) LastCommitted(ctx context.Context, topic string, key []byte) (value []byte, found bool, err error) {
	adm, err := k.admin()
	if err != nil {
		return nil, false, err
	}
	r := &Reader{cl: k.kc, adm: adm}
	parts, err := r.Partitions(ctx, topic)
	if err != nil {
		return nil, false, err
	}
	// Where Write puts the key: the same balancer over the same partitions.
	part := k.balancer.Balance(kafka.Message{Key: key}, k.partitionList(len(parts))...)
	firsts, lasts, err := r.Bounds(ctx, topic)
	if err != nil {
		return nil, false, err
	}
	first, last := firsts[part], lasts[part]
	for back := int64(256); ; back *= 8 {
		from := max(first, last-back)
		_, err := r.ReadUntil(ctx, topic, part, from, last, func(rec Record) error {
			if string(rec.Key) == string(key) {
				value, found = rec.Value, true
			}
			return nil
		})
		if err != nil {
			return nil, false, err
		}
		if found || from == first {
			return value, found, nil
		}
	}
}
