package kafkaadmin

import (
	"context"
)

// LastCommitted returns the value of the latest committed record with key
// in topic (a compacted topic of the relay's own, such as its checkpoints),
// read as a read_committed consumer reads it (reader.go) from the partition
// Write puts the key in; found is false when there is none. It reads back
// from the partition's end, further each time, so that a long uncompacted
// tail of other keys costs only what it must. Not safe for concurrent use
// with Write.
func (k *Admin) LastCommitted(ctx context.Context, topic string, key []byte) (value []byte, found bool, err error) {
	adm, err := k.admin()
	if err != nil {
		return nil, false, err
	}
	r := &Reader{cl: k.kc, adm: adm}
	parts, err := r.Partitions(ctx, topic)
	if err != nil {
		return nil, false, err
	}
	// Where Write puts the key: kgo's default partitioner, the Java
	// client's, over the same partitions.
	part := KeyPartition(key, len(parts))
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

// KeyPartition is the partition of key among n, as the Java client's
// default partitioner (and kgo's, which the producer uses) chooses it:
// murmur2 of the key, made positive, modulo n.
func KeyPartition(key []byte, n int) int {
	return int((murmur2(key) & 0x7fffffff) % uint32(n))
}

// murmur2 is the Java client's (org.apache.kafka.common.utils.Utils.murmur2).
func murmur2(b []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	h := seed ^ uint32(len(b))
	for len(b) >= 4 {
		k := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
		b = b[4:]
	}
	switch len(b) {
	case 3:
		h ^= uint32(b[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(b[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(b[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}
