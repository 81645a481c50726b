package relay

// The refill's delivery: the rows a lost slot's gap left undelivered, read in
// the slot's exported snapshot table after table and written by a writer of
// the refill's own (see refill.go for the rule that selects them).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/router"
)

// refillTally is the refill's acker: it counts what the writer finished,
// and records after each chunk how far the refill got (the position of the
// chunk's last row), so that a refill killed midway is followed by one that
// skips what it handled.
type refillTally struct {
	done int64

	mu   sync.Mutex
	at   map[*chunk]refillAt // where each chunk sent and not yet finished ends
	save func(refillAt, int64)
}

// refillAt is where a chunk ends: its table, and its last row's position
// in the table's order (nil values: NULL).
type refillAt struct {
	table int
	pos   []*string
	held  int64 // rows of the chunk neither sent nor stored: in the retry table already
}

func (t *refillTally) sent(c *chunk, at refillAt) {
	t.mu.Lock()
	t.at[c] = at
	t.mu.Unlock()
}

func (t *refillTally) ack(c *chunk) {
	t.done += int64(len(c.evs) + len(c.fails))
	t.mu.Lock()
	at, ok := t.at[c]
	delete(t.at, c)
	t.mu.Unlock()
	if ok && t.save != nil {
		t.save(at, t.done)
	}
}

func (t *refillTally) close() {}

// deliverRefill reads the selection in the exported snapshot and hands it to
// a writer, chunk by chunk; it returns once the writer finished every chunk,
// with the snapshot's xmin (a full xid) and the server's time.
//
// After each chunk the writer finished it calls progress with how far the
// refill got.
func (r *Relay) deliverRefill(ctx context.Context, pool *pgxpool.Pool, sels []refillSource, snapshot string, ls *leader.Lease, res *RefillResult,
	progress func(checkpoint.RefillProgress)) (uint64, time.Time, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return 0, time.Time{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	xmin, at, err := pgslot.ImportSnapshot(ctx, tx, snapshot)
	if err != nil {
		return 0, time.Time{}, err
	}
	rts, err := declareRefill(ctx, tx, sels)
	if err != nil {
		return 0, time.Time{}, err
	}
	rstore, err := retry.NewStore(pool, r.cfg.RetryTable, r.cfg.Replication.Slot)
	if err != nil {
		return 0, time.Time{}, err
	}
	gt := newGate(rstore, r.log)
	if err := gt.load(ctx); err != nil {
		return 0, time.Time{}, err
	}
	win := newWindow(r.cfg.MaxInFlightEvents, r.cfg.MaxInFlightBytes)
	// A refill is at least once (see above): with exactly-once delivery its
	// events go outside transactions, by the retry worker's sink, which is
	// idle between terms, and say so in a header.
	rsink := r.sink
	if r.cfg.Delivery == DeliveryExactlyOnce {
		rsink = r.retrySink
	}
	// The refill's writer takes none of writerRole: at least once (above);
	// one chunk at a time, each saved as the refill's progress once
	// finished; no spans or stage trace, its rows being read from a
	// snapshot, not the WAL as they commit.
	w := newWriter(r.cfg, writerEnds{sink: rsink, gate: gt, fence: ls}, win, newHealth(r.cfg.StallAfter, r.log), writerRole{})
	tally := &refillTally{at: map[*chunk]refillAt{}}
	var held int64
	tally.save = func(at refillAt, done int64) {
		held += at.held
		progress(checkpoint.RefillProgress{ID: res.ID, From: res.From, Xmin: xmin, Table: at.table, Position: at.pos, Sent: res.Resumed + done + held})
	}
	rd := &refillReader{tx: tx, sels: sels, rts: rts, res: res, at: at, gt: gt, rstore: rstore, tally: tally,
		atLeastOnce: rsink != r.sink, header: router.Header{Key: HeaderRefillID, Value: []byte(res.ID)}}
	chunks := make(chan *chunk)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.run(gctx, chunks, tally) })
	g.Go(func() error { return rd.run(gctx, chunks, r.cfg.Sink.BatchSize) })
	if err := g.Wait(); err != nil {
		return 0, time.Time{}, err
	}
	if tally.done != res.Events-res.Held {
		return 0, time.Time{}, fmt.Errorf("the writer finished %d of %d refilled events", tally.done, res.Events-res.Held)
	}
	// What the retry table holds of this refill (the slot's rows): parked
	// behind an aggregate's earlier rows, or refused.
	if res.Parked, err = rstore.CountKeys(ctx, "refill:"+res.ID+":"); err != nil {
		r.log.Warn("refill: cannot count the refilled events in the retry table", "err", err)
	}
	return xmin, at, tx.Commit(ctx)
}

// declareRefill declares a cursor refill_<i> over each selection, and
// returns their routers.
func declareRefill(ctx context.Context, tx pgx.Tx, sels []refillSource) ([]*router.Router, error) {
	rts := make([]*router.Router, len(sels))
	for i, s := range sels {
		text, args := s.sel.SQL()
		if _, err := tx.Exec(ctx, fmt.Sprintf("DECLARE refill_%d NO SCROLL CURSOR FOR ", i)+text, args...); err != nil {
			return nil, fmt.Errorf("read the outbox table %s: %w", s.name, err)
		}
		var err error
		if rts[i], err = router.New(s.router); err != nil {
			return nil, err
		}
	}
	return rts, nil
}

// refillReader reads a refill's cursors and makes chunks of their events.
type refillReader struct {
	tx          pgx.Tx
	sels        []refillSource
	rts         []*router.Router
	res         *RefillResult
	at          time.Time // the snapshot's time: the events' commit time
	gt          *gate
	rstore      *retry.Store
	tally       *refillTally
	atLeastOnce bool // beside an exactly-once stream: say so in a header
	header      router.Header
	n           int // events read so far: their positions
}

// refillRouted is an event read and routed, or its routing's failure.
type refillRouted struct {
	m   router.Message
	err error
}

// run hands chunks to the writer until the cursors are read, and closes
// chunks. A chunk per fetch: one Kafka write, a few in memory at a time. The
// tables one after the other, each in its order.
func (rd *refillReader) run(ctx context.Context, chunks chan<- *chunk, batchSize int) error {
	defer close(chunks)
	for cur := 0; cur < len(rd.sels); {
		read, last, err := rd.fetch(ctx, cur, max(batchSize, 1000))
		if err != nil {
			return err
		}
		if len(read) == 0 {
			cur++
			continue
		}
		c, err := rd.chunk(ctx, cur, read, last)
		if err != nil {
			return err
		}
		select {
		case chunks <- c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// fetch reads and routes up to n rows of cursor cur; it returns them and
// the last row's position in the selection's order.
func (rd *refillReader) fetch(ctx context.Context, cur, n int) ([]refillRouted, []string, error) {
	sel, rt := rd.sels[cur].sel, rd.rts[cur]
	rows, err := rd.tx.Query(ctx, fmt.Sprintf("FETCH FORWARD %d FROM refill_%d", n, cur))
	if err != nil {
		return nil, nil, fmt.Errorf("read the outbox table: %w", err)
	}
	defer rows.Close()
	var read []refillRouted
	var last []string
	for rows.Next() {
		row, pos, err := sel.Scan(rows)
		last = pos
		if err != nil {
			return nil, nil, err
		}
		rd.n++
		m, err := rt.Route(row)
		rd.mark(&m, cur)
		if err != nil {
			var re *router.RouteError
			if !errors.As(err, &re) {
				return nil, nil, fmt.Errorf("route refilled event %d: %w", rd.n, err)
			}
		}
		read = append(read, refillRouted{m, err})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("read the outbox table: %w", err)
	}
	return read, last, nil
}

// mark gives a refilled event of table cur its place and the refill's
// headers.
func (rd *refillReader) mark(m *router.Message, cur int) {
	m.Refill, m.Pos, m.CommitTime, m.Table = rd.res.ID, rd.n, rd.at, rd.sels[cur].name
	m.Headers = append(slices.DeleteFunc(m.Headers, func(h router.Header) bool { return h.Key == HeaderRefillID }), rd.header)
	if rd.atLeastOnce {
		// Beside an exactly-once stream: at least once.
		m.Headers = append(slices.DeleteFunc(m.Headers, func(h router.Header) bool { return h.Key == event.HeaderDelivery }), event.AtLeastOnce())
	}
	m.Extra = append(slices.DeleteFunc(slices.Clone(m.Extra), func(h event.Header) bool { return h.Key == HeaderRefillID }), event.Header(rd.header))
}

// chunk makes the chunk of one fetch of table cur, leaving out the events
// the retry table holds already, and registers it with the tally.
func (rd *refillReader) chunk(ctx context.Context, cur int, read []refillRouted, last []string) (*chunk, error) {
	rd.res.Events += int64(len(read))
	held, err := rd.held(ctx, read)
	if err != nil {
		return nil, err
	}
	c := &chunk{}
	at := refillAt{table: cur, held: int64(len(held))}
	for _, v := range last {
		if v == "" { // NULL: no value of the order is empty text
			at.pos = append(at.pos, nil)
		} else {
			at.pos = append(at.pos, &v)
		}
	}
	rd.tally.sent(c, at)
	for i := range read {
		if held[i] {
			continue
		}
		if read[i].err != nil {
			c.fails = append(c.fails, routeFailure{before: len(c.evs), ev: read[i].m.Event, err: read[i].err})
			continue
		}
		c.evs = append(c.evs, read[i].m.Event)
	}
	return c, nil
}

// held returns which of read the retry table holds already. Events the
// stream already stored there are there still (a dead letter, a row being
// retried): sent or stored again they would be a second copy behind the
// first, pending for ever behind a dead one, or sent again after an operator
// dropped it. Only an aggregate blocked in the gate can have such rows.
func (rd *refillReader) held(ctx context.Context, read []refillRouted) (map[int]bool, error) {
	var ask []event.Event
	var askAt []int
	for i := range read {
		if rd.gt.holds(read[i].m.Lane().String()) {
			ask, askAt = append(ask, read[i].m.Event), append(askAt, i)
		}
	}
	held := map[int]bool{}
	if len(ask) == 0 {
		return held, nil
	}
	h, err := rd.rstore.Held(ctx, ask, "refill:"+rd.res.ID+":")
	if err != nil {
		return nil, fmt.Errorf("refill: %w", err)
	}
	for j := range h {
		held[askAt[j]] = true
	}
	rd.res.Held += int64(len(h))
	return held, nil
}

func newRefillID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b)
}
