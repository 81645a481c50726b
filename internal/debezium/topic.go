package debezium

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// ReadOffsets reads a Kafka Connect offsets topic with cfg's connection
// settings (readTopic) and returns the latest offset of each connector
// (LatestOffsets). It connects for the call only, joins no consumer group and
// commits nothing.
func ReadOffsets(ctx context.Context, cfg kafkaclient.Config, topic string) ([]Offset, error) {
	var records []Record
	err := readTopic(ctx, cfg, topic, func(key, value []byte) error {
		records = append(records, Record{Key: key, Value: value})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read offsets topic %q: %w", topic, err)
	}
	return LatestOffsets(records)
}

// readTopic calls fn with the key and value of every record of topic, from
// the earliest offset of each partition up to its end as of the call, in
// offset order within a partition, partition after partition. A nil key or
// value is Kafka's null (a nil value is a tombstone), an empty one is empty.
// fn may keep key and value; an error from fn stops the read and is returned
// as it is.
//
// It reads committed records only, as a read_committed consumer does
// (kafkaadmin.Reader, the project's one such reader): each partition's end is its
// last stable offset, records of aborted transactions are skipped, and so
// are transaction markers. That matters for Kafka Connect's offsets topic,
// which a worker with exactly-once source support writes in transactions: an
// aborted offset was never in force. For a topic written without
// transactions it is the high watermark.
//
// readTopic uses cfg's brokers, TLS, SASL and client id, connects for the
// call only and joins no consumer group; it commits nothing. It blocks until
// the records are read, fn fails, or ctx is done. It is for reading a small
// topic once (Kafka Connect's offsets), not for consuming.
func readTopic(ctx context.Context, cfg kafkaclient.Config, topic string, fn func(key, value []byte) error) error {
	r, err := kafkaadmin.NewReader(cfg)
	if err != nil {
		return fmt.Errorf("read topic %q: %w", topic, err)
	}
	defer r.Close()
	parts, err := r.Partitions(ctx, topic)
	if errors.Is(err, kafkaadmin.ErrNoTopic) {
		return fmt.Errorf("read topic %q from %s: topic does not exist (check its name: Kafka Connect's offsets topic is the worker's offset.storage.topic): %w",
			topic, strings.Join(cfg.Brokers, ","), err)
	}
	if err != nil {
		return fmt.Errorf("read topic %q from %s: %w", topic, strings.Join(cfg.Brokers, ","), err)
	}
	// Every partition's end as of the call: a record written while the
	// read runs is not read.
	_, ends, err := r.Bounds(ctx, topic)
	if err != nil {
		return fmt.Errorf("read topic %q: %w", topic, err)
	}
	for _, p := range parts {
		var fnErr error
		_, err := r.ReadUntil(ctx, topic, p, 0, ends[p], func(rec kafkaadmin.Record) error {
			key, value := rec.Key, rec.Value
			fnErr = fn(key, value)
			return fnErr
		})
		if fnErr != nil {
			return fnErr
		}
		if err != nil {
			return fmt.Errorf("read topic %q partition %d: %w", topic, p, err)
		}
	}
	return nil
}
