package faults

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The producer stands for an application: it writes outbox events in transactions of
// 1 to 50, continuously, over 20 aggregates of 3 aggregate types, each payload carrying
// its aggregate's next sequence number, with a poison event now and then.
//
// It survives Postgres going away. After any failure of a transaction it asks the
// table whether the transaction's rows exist (after making sure the backend that ran
// it is gone, so a late COMMIT cannot land afterwards): only then are the sequence
// numbers it used taken, otherwise they are used again. So the table holds 1..n per
// aggregate without gaps or repeats when the producer judged right, which the suite
// checks; the checker itself reads order from the table, not from the producer.

// aggregateTypes and the aggregates per type: 7 + 7 + 6 = 20 aggregates.
var aggregateTypes = []struct {
	name  string
	count int
}{{"Order", 7}, {"Payment", 7}, {"Customer", 6}}

const (
	// invalidType makes an invalid topic name (a space and '!'): dead at once.
	invalidType = "Bad Type!"
	// poisonBytes is above the relay's kafka.batch_bytes (largePayloadLimit): dead at once.
	poisonBytes       = 300_000
	largePayloadLimit = 262_144

	// The phrases the retry row's last_error must contain for each kind of poison.
	reasonInvalidTopic = "Kafka topic names may contain only"
	reasonTooLarge     = "larger than"
)

// producerStats is what the producer did, for the report.
type producerStats struct {
	Transactions      int // committed, as the table confirms
	Events            int // in committed transactions
	Poison            int
	Failed            int // transactions that failed before the producer knew their outcome
	UnknownCommitted  int // of those, found in the table afterwards
	UnknownRolledBack int // of those, not in the table: their sequence numbers are used again
	Reconnects        int
}

type producer struct {
	dsn     string
	rng     *mrand.Rand
	rate    float64 // events per second
	poisonP float64 // chance that a transaction carries a poison event
	// messages: each event is also emitted as a transactional logical
	// decoding message, in the statement that archives it (emitSQL).
	messages bool

	mu    sync.Mutex
	stats producerStats
	seq   map[string]int // last committed sequence number per aggregate id
	next  int            // poison counter, for unique aggregate ids
	// sincePoison counts the transactions committed since the last one with
	// a poison event: past maxWithoutPoison every transaction carries one
	// until one commits (unless poisonP is 0: no poison at all), so that a short run (make test's 20 s, ~300
	// transactions, where chance alone gives none 7% of the time) always
	// proves that poison is handled.
	sincePoison int
}

// maxWithoutPoison bounds the transactions committed in a row without a
// poison event (poisonP alone leaves it to chance).
const maxWithoutPoison = 100

type outboxEvent struct {
	id, aggType, aggID, payload string
}

func newProducer(dsn string, seed uint64, rate float64) *producer {
	return &producer{dsn: dsn, rng: mrand.New(mrand.NewPCG(seed, seed^0x5eed)), rate: rate, poisonP: 1.0 / 120, seq: map[string]int{}}
}

// start runs the producer until the returned stop is called; stop waits for it
// and fails the test on its error, and does nothing when called again (the
// runs stop it midway and defer it as well).
func (p *producer) start(t *testing.T) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("producer: %v", err)
			}
		})
	}
}

func (p *producer) Stats() producerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Run writes until ctx is cancelled and returns nil then; it returns an error only for
// what it cannot survive (a transaction found half committed).
func (p *producer) Run(ctx context.Context) error {
	var conn *pgx.Conn
	var connAt time.Time // after the backend started
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = p.connect(ctx); err != nil {
				return nil // ctx ended
			}
			connAt = time.Now()
		}
		evs := p.makeTx()
		start := time.Now()
		err := insertTx(ctx, conn, evs, p.messages)
		if err == nil {
			p.committed(evs)
		} else {
			// Also when ctx ended mid-transaction: its outcome must be settled too.
			pid := conn.PgConn().PID()
			conn.Close(context.Background())
			conn = nil
			ok, err := p.settle(ctx, pid, connAt, evs)
			if err != nil {
				return err
			}
			p.mu.Lock()
			p.stats.Failed++
			if ok {
				p.stats.UnknownCommitted++
			} else {
				p.stats.UnknownRolledBack++
			}
			p.mu.Unlock()
			if ok {
				p.committed(evs)
			}
		}
		// Pace to the rate: a transaction of n events is followed by n/rate seconds.
		wait := time.Duration(float64(len(evs))/p.rate*float64(time.Second)) - time.Since(start)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

// connect dials until it succeeds or ctx ends, with backoff.
func (p *producer) connect(ctx context.Context) (*pgx.Conn, error) {
	backoff := 100 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, p.dsn)
		cancel()
		if err == nil {
			return conn, nil
		}
		p.mu.Lock()
		p.stats.Reconnects++
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// settle decides whether a transaction that failed committed. It waits until the
// backend that ran it is gone (terminating it if it lives on; a backend started after
// connAt only reuses the PID after a restart), then counts its rows.
// It keeps trying while Postgres is down, also after ctx ends: an unsettled transaction
// would make the producer's sequence numbers wrong.
func (p *producer) settle(ctx context.Context, pid uint32, connAt time.Time, evs []outboxEvent) (bool, error) {
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.id
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	var last error
	for sctx.Err() == nil {
		conn, err := p.connect(sctx)
		if err != nil {
			break
		}
		var n int
		err = func() error {
			defer conn.Close(context.Background())
			for {
				var alive bool
				err := conn.QueryRow(sctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = $1 AND backend_start <= $2`, int(pid), connAt).Scan(&alive)
				if errors.Is(err, pgx.ErrNoRows) {
					break
				}
				if err != nil {
					return err
				}
				time.Sleep(50 * time.Millisecond)
			}
			return conn.QueryRow(sctx, `SELECT count(*) FROM outbox WHERE id = ANY($1::uuid[])`, ids).Scan(&n)
		}()
		if err == nil {
			switch n {
			case 0:
				return false, nil
			case len(evs):
				return true, nil
			default:
				return false, fmt.Errorf("transaction of %d events is in the outbox table with %d rows: not atomic", len(evs), n)
			}
		}
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return false, fmt.Errorf("settle a failed transaction: %w (last error: %v)", sctx.Err(), last)
}

// makeTx returns the next transaction's events, numbered after the committed ones.
func (p *producer) makeTx() []outboxEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 1 + p.rng.IntN(50)
	next := map[string]int{}
	evs := make([]outboxEvent, 0, n+1)
	for range n {
		t := aggregateTypes[p.rng.IntN(len(aggregateTypes))]
		agg := fmt.Sprintf("%s-%d", strings.ToLower(t.name), p.rng.IntN(t.count))
		if _, ok := next[agg]; !ok {
			next[agg] = p.seq[agg]
		}
		next[agg]++
		evs = append(evs, outboxEvent{
			id: testenv.NewUUID(), aggType: t.name, aggID: agg,
			payload: fmt.Sprintf(`{"agg": %q, "seq": %d, "note": "fault suite event with a little padding to look real"}`, agg, next[agg]),
		})
	}
	if p.rng.Float64() < p.poisonP || p.poisonP > 0 && p.sincePoison >= maxWithoutPoison {
		p.next++
		e := outboxEvent{id: testenv.NewUUID(), aggID: fmt.Sprintf("poison-%d", p.next)}
		// Its own aggregate: a dead event blocks the later events of its aggregate.
		if p.next%2 == 0 {
			e.aggType, e.payload = invalidType, `{"seq": 1}`
		} else {
			e.aggType, e.payload = "Order", `{"seq": 1, "blob": "`+strings.Repeat("x", poisonBytes)+`"}`
		}
		evs = slices.Insert(evs, p.rng.IntN(len(evs)+1), e)
	}
	return evs
}

// committed takes the sequence numbers of evs.
func (p *producer) committed(evs []outboxEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Transactions++
	p.sincePoison++
	for _, e := range evs {
		if strings.HasPrefix(e.aggID, "poison-") {
			p.stats.Poison++
			p.sincePoison = 0
			continue
		}
		p.stats.Events++
		p.seq[e.aggID]++
	}
}

// emitSQL archives an event and emits it as a logical decoding message in
// one statement, as docs/outbox-table.md shows an application doing it.
const emitSQL = `WITH e AS (
	INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb) RETURNING *)
SELECT pg_logical_emit_message(true, 'outbox', json_build_object('id', id, 'aggregate_type', aggregate_type,
	'aggregate_id', aggregate_id, 'event_type', event_type, 'payload', payload, 'headers', headers)::text) FROM e`

func insertTx(ctx context.Context, conn *pgx.Conn, evs []outboxEvent, messages bool) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	b := &pgx.Batch{}
	for _, e := range evs {
		stmt := `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`
		if messages {
			stmt = emitSQL
		}
		b.Queue(stmt, e.id, e.aggType, e.aggID, e.aggType+"Changed", e.payload)
	}
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
