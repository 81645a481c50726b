package sink

import (
	"context"
	"time"

	"github.com/segmentio/kafka-go"
)

// kafka-go's Writer allocates every partition batch with room for BatchSize
// messages. With BatchSize at the per-call cap, a call touching P partitions
// allocated and zeroed P times the cap (about 150 bytes a message): for 40
// partitions, 6 KB per message written, most of the relay's CPU and memory.
// Before each call, the Writer's BatchSize is set to the largest number of the
// call's messages that go to one partition: every partition still gets exactly
// one batch per call (the ordering argument in the package doc), and the
// batches together hold about the call's own size. BatchSize is read only by
// WriteMessages on the calling goroutine, and a Kafka is not used
// concurrently, so setting it between calls is safe.

// partitionTTL is how long a topic's partition count is trusted. A count
// that grew meanwhile makes a partition's share larger than computed, and
// kafka-go then splits it into two batches: still in order, only no longer
// all-or-nothing for that partition if the broker fails one of them.
const partitionTTL = 30 * time.Second

type partitionCount struct {
	n  int
	at time.Time
}

// batchSizeFor returns the largest per-partition share of batch, or
// len(batch) when a topic's partition count is unknown (a missing topic: the
// call fails for it anyway).
func (k *Kafka) batchSizeFor(ctx context.Context, batch []kafka.Message) int {
	if k.shares == nil {
		k.shares = make(map[topicPartition]int)
		k.counts = make(map[string]partitionCount)
	}
	clear(k.shares)
	largest := 1
	for i := range batch {
		m := &batch[i]
		n := k.partitionCount(ctx, m.Topic)
		if n <= 0 {
			return len(batch)
		}
		p := k.balancer.Balance(*m, k.partitionList(n)...)
		tp := topicPartition{m.Topic, p}
		k.shares[tp]++
		largest = max(largest, k.shares[tp])
	}
	return largest
}

type topicPartition struct {
	topic     string
	partition int
}

func (k *Kafka) partitionCount(ctx context.Context, topic string) int {
	if c, ok := k.counts[topic]; ok && time.Since(c.at) < partitionTTL {
		return c.n
	}
	client := &kafka.Client{Addr: k.w.Addr, Transport: k.transport, Timeout: k.cfg.WriteTimeout}
	resp, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil || len(resp.Topics) != 1 || resp.Topics[0].Error != nil {
		return 0
	}
	n := len(resp.Topics[0].Partitions)
	k.counts[topic] = partitionCount{n: n, at: time.Now()}
	return n
}

// partitionList returns 0..n-1, the list kafka-go's Writer balances over.
func (k *Kafka) partitionList(n int) []int {
	for len(k.parts) < n {
		k.parts = append(k.parts, len(k.parts))
	}
	return k.parts[:n]
}
