package relay

import (
	"io"
	"strconv"
	"sync"
	"time"
)

// stageTrace writes Config.StageTrace: one line per chunk delivered whole
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
// commit→ack, and its stages say where that went (the bench's -stages).
type stageTrace struct {
	mu  sync.Mutex
	w   io.Writer
	buf []byte
}

func newStageTrace(w io.Writer) *stageTrace {
	if w == nil {
		return nil
	}
	return &stageTrace{w: w}
}

// write writes c's line; a write error is ignored, as the trace is for
// benchmarks and must never stop delivery.
func (t *stageTrace) write(c *chunk, events int, acked time.Time) {
	if len(c.commits) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	b := strconv.AppendInt(t.buf[:0], int64(events), 10)
	for _, at := range [...]time.Time{c.commits[0].at, c.readAt, c.tookAt, c.sentAt, acked} {
		b = append(b, ' ')
		b = strconv.AppendInt(b, at.UnixNano(), 10)
	}
	b = append(b, '\n')
	t.buf = b
	_, _ = t.w.Write(b)
}
