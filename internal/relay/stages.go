package relay

import (
	"io"
	"strconv"
	"time"
)

// writeStages writes Config.StageTrace's line of a chunk delivered whole
// (nothing of it parked), its figures separated by spaces:
//
//	events commit read took sent acked
//
// events is the number of events Kafka acknowledged; the others are Unix
// times in nanoseconds: the commit time (Postgres's clock) of the chunk's
// first transaction, when the route stage took the batch of its first event
// from the stream, when the writer took the chunk, when it handed it to the
// sink, and when every event was acknowledged and the chunk finished in
// order. commit→acked is the relay's share of its first event's
// commit→ack, and its stages say where that went (the bench's stage table,
// docs/performance.md).
//
// The pipeline's writer calls it, one goroutine at a time (a term's writer
// ends before the next term's starts); the caller's w may buffer.
func writeStages(w io.Writer, c *chunk, events int, acked time.Time) {
	if len(c.commits) == 0 {
		return
	}
	var line [128]byte // six numbers of at most 20 digits, spaces and newline
	b := strconv.AppendInt(line[:0], int64(events), 10)
	for _, at := range [...]time.Time{c.commits[0].at, c.readAt, c.tookAt, c.sentAt, acked} {
		b = append(b, ' ')
		b = strconv.AppendInt(b, at.UnixNano(), 10)
	}
	// A write error is ignored: the trace is for benchmarks and must never
	// stop delivery.
	_, _ = w.Write(append(b, '\n'))
}
