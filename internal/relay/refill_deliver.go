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
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
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
func (r *Relay) deliverRefill(ctx context.Context, pool *pgxpool.Pool, sels []refillSource, snapshot string, ls *lease, res *RefillResult,
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
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+sql.Literal(snapshot)); err != nil {
		return 0, time.Time{}, fmt.Errorf("import the slot's snapshot: %w", err)
	}
	var xminText string
	var at time.Time
	if err := tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(pg_current_snapshot())::text, now()`).Scan(&xminText, &at); err != nil {
		return 0, time.Time{}, err
	}
	xmin, err := strconv.ParseUint(xminText, 10, 64)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("snapshot xmin %q: %w", xminText, err)
	}
	rts := make([]*router.Router, len(sels))
	for i, s := range sels {
		text, args := s.sel.SQL()
		if _, err := tx.Exec(ctx, fmt.Sprintf("DECLARE refill_%d NO SCROLL CURSOR FOR ", i)+text, args...); err != nil {
			return 0, time.Time{}, fmt.Errorf("read the outbox table %s: %w", s.name, err)
		}
		if rts[i], err = router.New(s.router); err != nil {
			return 0, time.Time{}, err
		}
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
	w := &writer{sink: rsink, gate: gt, fence: ls, win: win, health: newHealth(r.cfg.StallAfter, r.log), log: r.log, m: r.m}
	tally := &refillTally{at: map[*chunk]refillAt{}}
	var held int64
	tally.save = func(at refillAt, done int64) {
		held += at.held
		progress(checkpoint.RefillProgress{ID: res.ID, From: res.From, Xmin: xmin, Table: at.table, Position: at.pos, Sent: res.Resumed + done + held})
	}
	chunks := make(chan *chunk)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.run(gctx, chunks, tally) })
	header := router.Header{Key: HeaderRefillID, Value: []byte(res.ID)}
	g.Go(func() error {
		defer close(chunks)
		// A chunk per fetch: one Kafka write, a few in memory at a time.
		// The tables one after the other, each in its order.
		n, cur := 0, 0
		for cur < len(sels) {
			sel, rt := sels[cur].sel, rts[cur]
			fetch := fmt.Sprintf("FETCH FORWARD %d FROM refill_%d", max(r.cfg.Sink.BatchSize, 1000), cur)
			rows, err := tx.Query(gctx, fetch)
			if err != nil {
				return fmt.Errorf("read the outbox table: %w", err)
			}
			type routed struct {
				m   router.Message
				err error
			}
			var read []routed
			var last []string
			for rows.Next() {
				row, pos, err := sel.Scan(rows)
				last = pos
				if err != nil {
					rows.Close()
					return err
				}
				n++
				m, err := rt.Route(row)
				m.Refill, m.Pos, m.CommitTime, m.Table = res.ID, n, at, sels[cur].name
				m.Headers = append(slices.DeleteFunc(m.Headers, func(h router.Header) bool { return h.Key == HeaderRefillID }), header)
				if rsink != r.sink {
					// Beside an exactly-once stream: at least once.
					m.Headers = append(slices.DeleteFunc(m.Headers, func(h router.Header) bool { return h.Key == event.HeaderDelivery }), event.AtLeastOnce())
				}
				m.Extra = append(slices.DeleteFunc(slices.Clone(m.Extra), func(h event.Header) bool { return h.Key == HeaderRefillID }), event.Header(header))
				if err != nil {
					var re *router.RouteError
					if !errors.As(err, &re) {
						rows.Close()
						return fmt.Errorf("route refilled event %d: %w", n, err)
					}
				}
				read = append(read, routed{m, err})
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("read the outbox table: %w", err)
			}
			if len(read) == 0 {
				cur++
				continue
			}
			res.Events += int64(len(read))
			// Events the stream already stored in the retry table are
			// there still (a dead letter, a row being retried): sent or
			// stored again they would be a second copy behind the first,
			// pending for ever behind a dead one, or sent again after an
			// operator dropped it. Only an aggregate blocked in the gate
			// can have such rows.
			var ask []event.Event
			var askAt []int
			for i := range read {
				if gt.holds(read[i].m.Lane().String()) {
					ask, askAt = append(ask, read[i].m.Event), append(askAt, i)
				}
			}
			held := map[int]bool{}
			if len(ask) > 0 {
				h, err := rstore.Held(gctx, ask, "refill:"+res.ID+":")
				if err != nil {
					return fmt.Errorf("refill: %w", err)
				}
				for j := range h {
					held[askAt[j]] = true
				}
				res.Held += int64(len(h))
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
			tally.sent(c, at)
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
			select {
			case chunks <- c:
			case <-gctx.Done():
				return gctx.Err()
			}
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return 0, time.Time{}, err
	}
	if tally.done != res.Events-res.Held {
		return 0, time.Time{}, fmt.Errorf("the writer finished %d of %d refilled events", tally.done, res.Events-res.Held)
	}
	// What the retry table holds of this refill (the slot's rows): parked
	// behind an aggregate's earlier rows, or refused.
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+rstoreTable(r.cfg.RetryTable)+` WHERE slot_name = $2 AND event_key LIKE $1`, "refill:"+res.ID+":%", r.cfg.Replication.Slot).Scan(&res.Parked); err != nil {
		r.log.Warn("refill: cannot count the refilled events in the retry table", "err", err)
	}
	return xmin, at, tx.Commit(ctx)
}

func rstoreTable(name string) string {
	t, err := sql.ParseTable(name)
	if err != nil {
		return name
	}
	return t.Quoted()
}

func newRefillID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b)
}
