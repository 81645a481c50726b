package relay

// The WAL buffer with exactly-once delivery (docs/wal-buffer.md,
// docs/guarantees.md#exactly-once): the bound applies, and what goes through the
// buffer is delivered at least once, each message marked with
// event.HeaderDelivery, as the retry worker's, replay's and a refill's are.
//
// Why not exactly once: the exactly-once checkpoint travels in the Kafka
// transaction with the events it covers, and the stream resumes from the
// Postgres checkpoint, skipping what the Kafka one covers. A buffering term
// confirms the slot and saves the Postgres checkpoint past events Kafka has
// not taken (that is the point of the buffer), so the Kafka checkpoint falls
// behind the Postgres one, and a drain that wrote the buffered range in
// transactions with checkpoint records would need a second checkpoint (the
// drained prefix of the buffer) kept in the same transactions, plus the
// retry table's unparking for it. Instead:
//
//   - The buffering term's pipeline writes to the buffer only: no Kafka
//     transaction is opened. The transaction the blocked live term left
//     open (its abort failed with Kafka away) is aborted by the coordinator
//     on its timeout (kafka.transaction_timeout), or by the next live
//     term's InitTransactions: its events were read again into the buffer.
//   - The drain writes with a sink of its own (Sinks.Drain), never
//     transactional, beside the retry worker's: the same writer, gate,
//     retry table and fencing as at least once. A read_committed consumer
//     reads those messages as soon as Kafka acknowledged them (once no
//     transaction left open before them is pending).
//   - Duplicates are possible only among marked messages: rows delivered
//     and not yet deleted when the relay stops, and events the blocked live
//     term had committed to Kafka before the Postgres checkpoint was saved
//     (the buffering term reads them again from it). An unmarked message is
//     never repeated.
//   - The next live term reads the Kafka checkpoint as always: it lies
//     before the Postgres checkpoint, so nothing is skipped, and its
//     transactions' checkpoints move past the buffered range.

import (
	"context"
	"slices"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sink"
)

// drainSink is the sink the WAL buffer's drain writes with: the stream's,
// or with exactly-once delivery Sinks.Drain, each message marked as sent at
// least once.
func (r *Relay) drainSink() Sink {
	if r.cfg.Delivery == DeliveryExactlyOnce {
		return markedSink{r.bufferSink}
	}
	return r.sink
}

// markedSink is a Sink whose every message carries event.HeaderDelivery
// (at least once), the relay's own value in place of any the event had.
type markedSink struct{ Sink }

func (s markedSink) Send(ctx context.Context, evs []event.Event) sink.Delivery {
	return s.Sink.Send(ctx, markAtLeastOnce(evs))
}

func (s markedSink) Write(ctx context.Context, evs []event.Event) error {
	return s.Sink.Write(ctx, markAtLeastOnce(evs))
}

// markAtLeastOnce returns copies of evs with the header; evs are not
// changed (the writer parks them as they were read).
func markAtLeastOnce(evs []event.Event) []event.Event {
	out := make([]event.Event, len(evs))
	for i, e := range evs {
		hs := slices.DeleteFunc(slices.Clone(e.Headers), func(h event.Header) bool { return h.Key == event.HeaderDelivery })
		e.Headers = append(hs, event.AtLeastOnce())
		out[i] = e
	}
	return out
}
