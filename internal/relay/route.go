package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/event"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// routeStage turns the stream's batches into chunks of routed events, in
// commit order, taking the window for what it reads.
type routeStage struct {
	router   *router.Router
	win      *window
	schema   string // the outbox table, split
	table    string
	maxMsgs  int // events per chunk
	maxBytes int // bytes per chunk
	log      *slog.Logger
	m        *metrics.Metrics
	tableM   *metrics.Table

	isOutbox       map[*replication.Relation]bool
	lastBadHeaders time.Time
}

// run turns batches into chunks until in is closed, ctx is done, or stop is
// closed; it stops reading on stop only at a transaction boundary, so a clean
// shutdown leaves no transaction half-delivered. It closes out when it
// returns. A *router.SchemaError stops it before the event, after handing
// on the chunk of what came before: nothing from that event on is
// confirmed, and what came before can be.
func (r *routeStage) run(ctx context.Context, stop <-chan struct{}, in <-chan replication.Batch, out chan<- *chunk) error {
	defer close(out)
	maxMsgs, maxBytes := r.maxMsgs, r.maxBytes
	newChunk := func() *chunk {
		evs := r.win.spareEvents()
		if evs == nil {
			evs = make([]event.Event, 0, min(maxMsgs, 1024))
		}
		return &chunk{evs: evs}
	}
	cur := newChunk()
	flush := func() error {
		if cur.empty() {
			return nil
		}
		select {
		case out <- cur:
			cur = newChunk()
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	inTxn := false
	var txnRow int // position of the next row in its transaction, for retry keys
	for {
		stopCh := stop
		if inTxn {
			stopCh = nil // finish the open transaction first
		}
		// What we hold goes to the writer as soon as it takes it, and
		// batches that arrive meanwhile join it: with out unbuffered, a
		// busy writer makes chunks grow (fewer, larger Kafka writes), an
		// idle one gets each batch at once (latency).
		var outCh chan<- *chunk
		if !cur.empty() {
			outCh = out
		}
		var b replication.Batch
		select {
		case b = <-in:
		case outCh <- cur:
			cur = newChunk()
			continue
		case <-stopCh:
			return flush()
		case <-ctx.Done():
			return ctx.Err()
		}

		if !r.win.tryTake(len(b.Rows), b.Bytes, inTxn) {
			// What we hold counts against the window: hand it on before waiting.
			if err := flush(); err != nil {
				return err
			}
			if err := r.win.take(ctx, len(b.Rows), b.Bytes, inTxn); err != nil {
				return err
			}
		}
		if !inTxn {
			txnRow = 0
		}
		routed := 0
		for i := range b.Rows {
			row := &b.Rows[i]
			cur.trailing++
			cur.bytes += rowBytes(row)
			txnRow++
			if !r.outbox(row.Relation) {
				continue
			}
			routed++
			m, err := r.router.Route(*row)
			r.headerTrouble(&m)
			m.CommitLSN, m.CommitTime, m.Pos = b.CommitLSN, b.CommitTime, txnRow
			if err != nil {
				var re *router.RouteError
				if !errors.As(err, &re) {
					var se *router.SchemaError
					if errors.As(err, &se) {
						r.m.SchemaStop()
						// Hand on what came before, so that the caller can
						// drain and confirm it as at a clean stop: a restart
						// then resends at most this transaction's earlier
						// events.
						if err := flush(); err != nil {
							return err
						}
						return fmt.Errorf("stopped before the event at position %d of the transaction committed at %s, so that nothing from it on is confirmed: %w",
							txnRow, b.CommitLSN, err)
					}
					return fmt.Errorf("route event of transaction %d committed at %s: %w", b.Xid, b.CommitLSN, err)
				}
				// Not this relay's to drop nor to stop for: the event goes
				// to the retry table, in its place.
				cur.fails = append(cur.fails, routeFailure{before: len(cur.evs), ev: m.Event, err: err})
				continue
			}
			cur.evs = append(cur.evs, m.Event)
			cur.addCommit(b.CommitLSN, b.CommitTime)
			if len(cur.evs) >= maxMsgs || cur.bytes >= maxBytes {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		r.tableM.Received(routed)
		inTxn = !b.Last
		if b.Last {
			cur.endLSN = b.EndLSN
			cur.commitTime = b.CommitTime
			cur.covered += cur.trailing
			cur.trailing = 0
		}
	}
}

// outbox reports whether rel is the configured outbox table. The publication
// should cover only that table; inserts into any other are not events.
func (r *routeStage) outbox(rel *replication.Relation) bool {
	is, ok := r.isOutbox[rel]
	if !ok {
		is = rel.Namespace == r.schema && rel.Name == r.table
		r.isOutbox[rel] = is
		if !is {
			r.log.Warn("publication covers a table that is not the outbox: its inserts are ignored",
				"table", rel.Namespace+"."+rel.Name, "outbox_table", r.schema+"."+r.table)
		}
	}
	return is
}

// headerTrouble counts what the router left out of an event's headers and
// warns about a headers value it ignored, at most once every ten seconds:
// the event is delivered all the same, so a line per event would only flood
// the log.
func (r *routeStage) headerTrouble(m *router.Message) {
	if m.DroppedHeaders > 0 {
		r.m.HeadersDropped(m.DroppedHeaders)
	}
	if m.BadHeaders == "" {
		return
	}
	r.m.HeadersInvalid()
	if now := time.Now(); now.Sub(r.lastBadHeaders) >= 10*time.Second {
		r.lastBadHeaders = now
		r.log.Warn("headers column ignored: event delivered without its extra headers",
			"event_id", m.ID, "aggregate_type", m.AggregateType, "reason", m.BadHeaders)
	}
}

func rowBytes(row *replication.Row) int {
	n := 0
	for _, v := range row.Values {
		n += len(v)
	}
	return n
}
