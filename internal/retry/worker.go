package retry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// A Sink delivers messages to Kafka: the sink.Kafka contract. Write blocks
// until every message is acknowledged, or returns ctx's error (it blocks
// through broker-wide outages), or a *sink.WriteError listing the messages
// that failed on their own; every message it does not list was acknowledged.
// Ping returns nil when the cluster answers a fresh metadata request (not a
// cached answer): the Worker asks it whether a Write that ran out of time
// met a broker outage or trouble of its own messages. The Worker calls both
// from one goroutine.
type Sink interface {
	Write(ctx context.Context, events []event.Event) error
	Ping(ctx context.Context) error
}

// A Routing is how the Worker routes the rows of one outbox table: its
// router's Topic and the relay's own headers its messages carry.
type Routing struct {
	Topic   func(aggregateType, eventType string) (string, error)
	Headers router.HeaderSet
}

// Defaults of WorkerConfig's zero values.
const (
	DefaultBackoffMin   = time.Second
	DefaultBackoffMax   = 5 * time.Minute
	DefaultMaxAge       = 24 * time.Hour
	DefaultPollInterval = time.Second
)

// WorkerConfig configures a Worker. Zero durations mean the documented
// defaults.
type WorkerConfig struct {
	Store *Store // required
	Sink  Sink   // required; used by the Worker alone
	// Topic routes an event again on every attempt (the router's Topic), so
	// that an operator can fix the routing config and requeue. An error is
	// permanent: the row goes dead. Required.
	Topic func(aggregateType, eventType string) (string, error)

	BackoffMin   time.Duration // default 1s: wait after the first failed attempt
	BackoffMax   time.Duration // default 5m: longest wait; each wait is jittered
	MaxAge       time.Duration // default 24h: a row failing for longer goes dead
	MaxAttempts  int           // default 0: unlimited
	PollInterval time.Duration // default 1s: how often due rows are looked for
	BatchSize    int           // default 100: rows behind a head written per call

	// AttemptTimeout, default 30s, is the longest attempt. An attempt that
	// runs out of time counts as the row's failure when Kafka answers a ping
	// then (its topic may be unusable, e.g. a name colliding with another
	// topic's), and as a broker outage, not counted, when it does not.
	AttemptTimeout time.Duration

	// Delivered, if set, is called with an aggregate once the Worker has
	// delivered rows of it and none is left in the table, so that the
	// pipeline can stop diverting its events (after checking Undelivered:
	// a new row may arrive meanwhile). It is called from Run's goroutine.
	Delivered func(aggregate string)
	// Headers is the relay's own headers, as the router sends them
	// (message.headers); the zero value is all three.
	Headers router.HeaderSet
	// Tables routes the rows of the outbox tables named (Entry.Table) by
	// their own table's rules, when the relay reads several; a row of
	// another table, or of none, takes Topic and Headers. (Every row the
	// Worker sees is of its Store's slot: another relay's never reach it.)
	Tables map[string]Routing
	// Committed, when set, holds rows back until their transaction is
	// committed downstream: only a row whose source LSN is below
	// Committed() (or unknown) is delivered, and the rows behind a head
	// stop at the first that is not. For exactly-once delivery, whose
	// parked rows belong to a Kafka transaction until it commits. Called
	// from Run's goroutine.
	Committed func() pglogrepl.LSN
	// MarkAtLeastOnce adds event.HeaderDelivery to every message: with
	// exactly-once delivery, whose stream messages are never repeated,
	// this one may be (the worker delivers at least once).
	MarkAtLeastOnce bool
	Logger          *slog.Logger // default discards
}

// Validate fills the defaults of the tunables (backoff, maximum age and
// attempts, poll interval, attempt timeout, batch size) and returns every
// one that cannot work, each a *field.Error naming its field. NewWorker also
// wants Store, Sink and Topic.
func (c *WorkerConfig) Validate() error {
	var v field.Checker
	field.Positive(&v, "BackoffMin", &c.BackoffMin, DefaultBackoffMin)
	field.Positive(&v, "BackoffMax", &c.BackoffMax, DefaultBackoffMax)
	field.Positive(&v, "MaxAge", &c.MaxAge, DefaultMaxAge)
	field.Positive(&v, "PollInterval", &c.PollInterval, DefaultPollInterval)
	field.Positive(&v, "AttemptTimeout", &c.AttemptTimeout, 30*time.Second)
	field.Positive(&v, "BatchSize", &c.BatchSize, 100)
	if c.MaxAttempts < 0 {
		v.Errorf("MaxAttempts", "%d is negative; use 0 for no limit ({MaxAge} still applies)", c.MaxAttempts)
	}
	if c.BackoffMax < c.BackoffMin {
		v.Errorf("BackoffMax", "%s is less than {BackoffMin} %s; raise it", c.BackoffMax, c.BackoffMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return v.Err()
}

func (c *WorkerConfig) validate() error {
	if c.Store == nil || c.Sink == nil || c.Topic == nil {
		return errors.New("retry worker: store, sink and topic function are required")
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("retry worker: %w", err)
	}
	return nil
}

// A Worker delivers the due rows of its Store's slot. See the package doc
// for its guarantees. Several Workers, in one process or many, may share a
// table: those of one slot share its rows, those of other slots never see
// them.
type Worker struct {
	cfg WorkerConfig
	log *slog.Logger

	attempted, succeeded, deadLettered atomic.Int64
	outage                             bool // Run's goroutine only: an outage was logged
	// topicFailures counts, per topic, the heads that failed in a row
	// because their topic is missing: the rows of such a topic wait for
	// it together (postpone), with a backoff that grows per topic, not
	// per row. Run's goroutine only; at most maxTopicWaits topics.
	topicFailures map[string]int
}

// maxTopicWaits bounds Worker.topicFailures: past it, the counts start over
// (a topic then waits from BackoffMin again).
const maxTopicWaits = 1024

// NewWorker validates cfg and fills defaults. It neither dials nor starts
// goroutines.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Worker{cfg: cfg, log: cfg.Logger}, nil
}

// WorkerStats counts what a Worker has done since NewWorker.
type WorkerStats struct {
	Attempted    int64 // rows tried (attempts cut short by a verified Kafka outage not included)
	Succeeded    int64 // rows delivered and deleted
	DeadLettered int64 // rows this Worker moved to dead
}

// Stats returns the Worker's counters. Safe for concurrent use.
func (w *Worker) Stats() WorkerStats {
	return WorkerStats{Attempted: w.attempted.Load(), Succeeded: w.succeeded.Load(), DeadLettered: w.deadLettered.Load()}
}

// Run delivers due rows until ctx is done, then returns ctx's error. Errors
// of the database are logged and retried at a slower pace; Run returns only
// for ctx.
func (w *Worker) Run(ctx context.Context) error {
	failures := 0
	for {
		wait := w.cfg.PollInterval
		for ctx.Err() == nil {
			more, err := w.step(ctx)
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				failures++
				wait = min(w.cfg.PollInterval<<min(failures, 5), time.Minute)
				w.log.Warn("retry worker: database error, retrying", "err", err, "retry_in", wait.String())
				break
			}
			failures = 0
			if !more {
				break
			}
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

// step claims one due head and delivers it and the rows behind it. more is
// false when there was nothing to claim or Kafka is unreachable: Run then
// waits a poll interval.
func (w *Worker) step(ctx context.Context) (more bool, err error) {
	// The transaction outlives ctx by the few statements that record what
	// Kafka already acknowledged: forgetting it would send it again.
	dbctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	s := w.cfg.Store
	tx, err := s.pool.Begin(dbctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(dbctx)

	// A head is a due pending row with no lower seq of its aggregate. The
	// oldest goes first; a head that failed waits out its backoff
	// (next_attempt_at), so the heads of other aggregates are claimed
	// meanwhile: one row's trouble never holds up the others.
	limit := pglogrepl.LSN(math.MaxUint64) // rows below it may go
	if w.cfg.Committed != nil {
		limit = w.cfg.Committed()
	}
	head, err := scanEntry(tx.QueryRow(dbctx, fmt.Sprintf(`SELECT %s FROM %s r
WHERE r.slot_name = $2 AND r.status = 'pending' AND r.next_attempt_at <= now()
  AND (r.source_lsn IS NULL OR r.source_lsn < $1::text::pg_lsn)
  AND NOT EXISTS (SELECT 1 FROM %s p WHERE p.slot_name = r.slot_name AND %s AND p.seq < r.seq)
ORDER BY r.seq LIMIT 1
FOR UPDATE OF r SKIP LOCKED`, columns(true), s.table, s.table, sameAggregate("p", "r.aggregate")), limit.String(), s.slot))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("claim due row: %w", s.hint(err))
	}

	d := &delivery{w: w, tx: tx, topics: map[[3]string]topicResult{}}
	res := d.send(ctx, []Entry{head})
	if res == sendStopped {
		return false, d.finish(dbctx, ctx)
	}

	// The head went through: the rows behind it were only waiting for it,
	// or failed for the reason it did, so they go now, whatever their
	// next_attempt_at, in batches, until the first failure.
	for last := head.Seq; res == sendDelivered; {
		rows, err := tx.Query(dbctx, fmt.Sprintf(`SELECT %s FROM %s r
WHERE r.slot_name = $4 AND %s AND r.seq > $2 ORDER BY r.seq LIMIT $3 FOR UPDATE`, columns(true), s.table, sameAggregate("r", "$1::text")),
			head.Aggregate, last, w.cfg.BatchSize, s.slot)
		if err != nil {
			return false, fmt.Errorf("read rows behind %d: %w", head.Seq, err)
		}
		batch, err := collectEntries(rows)
		if err != nil {
			return false, fmt.Errorf("read rows behind %d: %w", head.Seq, err)
		}
		end := len(batch) < w.cfg.BatchSize
		for i, e := range batch {
			if e.Status == StatusDead || e.SourceLSN != 0 && e.SourceLSN >= limit {
				// Still blocks (dead), or not committed downstream
				// yet: deliver up to it.
				batch, end = batch[:i], true
				break
			}
		}
		if len(batch) == 0 {
			break
		}
		last = batch[len(batch)-1].Seq
		if res = d.send(ctx, batch); end {
			break
		}
	}
	if err := d.finish(dbctx, ctx); err != nil {
		return false, err
	}
	if len(d.delivered) > 0 && w.cfg.Delivered != nil {
		var left bool
		err := s.pool.QueryRow(dbctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s r WHERE r.slot_name = $2 AND %s)`,
			s.table, sameAggregate("r", "$1::text")), head.Aggregate, s.slot).Scan(&left)
		if err != nil {
			return true, fmt.Errorf("check aggregate %q: %w", head.Aggregate, err)
		}
		if !left {
			w.cfg.Delivered(head.Aggregate)
		}
	}
	return !d.outage, nil
}

type sendResult int

const (
	sendDelivered sendResult = iota // every row acknowledged
	sendFailed                      // a row failed on its own; recorded
	sendStopped                     // Kafka unreachable or shutdown: nothing of this call counted
)

type topicResult struct {
	topic string
	err   error
}

// A delivery is one step's transaction: the rows it delivered, and the
// failure it recorded.
type delivery struct {
	w         *Worker
	tx        pgx.Tx
	topics    map[[3]string]topicResult
	delivered []int64
	failed    *failure
	topicWait string // the failure was its topic's: missing (postpone)
	outage    bool
	shutdown  bool
	attempted int
}

type failure struct {
	row       Entry
	reason    string
	code      string // reason's code (Entry.ReasonCode); "" for none
	permanent bool
}

// send routes and writes rows (in seq order, of one aggregate) and records
// the outcome in d: acknowledged rows before the first failure are delivered,
// the first failure is recorded, and the rest stays.
func (d *delivery) send(ctx context.Context, rows []Entry) sendResult {
	msgs := make([]event.Event, 0, len(rows))
	var refuse *failure
	for _, e := range rows {
		if reason := undeliverable(&e); reason != "" {
			refuse = &failure{row: e, reason: reason, permanent: true}
			break
		}
		rt := Routing{Topic: d.w.cfg.Topic, Headers: d.w.cfg.Headers}
		if t, ok := d.w.cfg.Tables[e.Table]; ok {
			rt = t
		}
		k := [3]string{e.Table, e.AggregateType, e.EventType}
		tr, ok := d.topics[k]
		if !ok {
			tr.topic, tr.err = rt.Topic(e.AggregateType, e.EventType)
			d.topics[k] = tr
		}
		if tr.err != nil {
			refuse = &failure{row: e, reason: routeReason(tr.err), code: routeCode(tr.err), permanent: true}
			break
		}
		msgs = append(msgs, e.event(tr.topic, rt.Headers, d.w.cfg.MarkAtLeastOnce))
	}
	if len(msgs) > 0 {
		actx, cancel := context.WithTimeout(ctx, d.w.cfg.AttemptTimeout)
		err := d.w.cfg.Sink.Write(actx, msgs)
		cancel()
		var we *sink.WriteError
		switch {
		case err == nil:
			d.outageOver()
			delete(d.w.topicFailures, msgs[0].Topic)
		case ctx.Err() != nil:
			d.shutdown = true
			return sendStopped
		case errors.Is(err, context.DeadlineExceeded):
			// The sink blocks through broker-wide failures, but also
			// through some of one topic's (a name colliding with another
			// topic's, partitions without a leader): only a cluster that
			// does not answer now is an outage that counts against no row.
			pctx, cancel := context.WithTimeout(ctx, d.w.cfg.AttemptTimeout)
			perr := d.w.cfg.Sink.Ping(pctx)
			cancel()
			if ctx.Err() != nil {
				d.shutdown = true
				return sendStopped
			}
			if perr != nil {
				if !d.w.outage {
					d.w.log.Warn("retry worker: kafka unreachable, retrying later without counting attempts",
						"timeout", d.w.cfg.AttemptTimeout.String(), "err", perr)
					d.w.outage = true
				}
				d.outage = true
				return sendStopped
			}
			d.outageOver()
			d.attempted += len(msgs)
			d.failed = &failure{row: rows[0], reason: timeoutReason(d.w.cfg.AttemptTimeout, msgs[0].Topic)}
			return sendFailed
		case errors.As(err, &we) && len(we.Failures) > 0:
			d.outageOver()
			first := we.Failures[0]
			for _, e := range rows[:first.Index] {
				d.delivered = append(d.delivered, e.Seq)
			}
			if acked := len(msgs) - first.Index - len(we.Failures); acked > 0 {
				d.w.log.Warn("retry worker: events acknowledged after an earlier event of their aggregate failed; they stay and will be sent again after it",
					"aggregate", rows[0].Aggregate, "events", acked)
			}
			d.attempted += first.Index + 1
			d.failed = &failure{row: rows[first.Index], reason: first.Reason, code: first.Code, permanent: first.Permanent}
			var te *sink.TopicError
			if errors.As(first.Err, &te) && !te.Permanent {
				// The topic is missing: every row of it would fail
				// alike, so they wait for it together (postpone).
				d.topicWait = te.Topic
			}
			return sendFailed
		default:
			d.attempted += len(msgs)
			d.failed = &failure{row: rows[0], reason: "writing to Kafka failed: " + err.Error()}
			return sendFailed
		}
		d.attempted += len(msgs)
		for _, e := range rows[:len(msgs)] {
			d.delivered = append(d.delivered, e.Seq)
		}
	}
	if refuse != nil {
		d.attempted++
		d.failed = refuse
		return sendFailed
	}
	return sendDelivered
}

// event is the envelope of e for topic. Its headers are built as the
// pipeline builds them: the relay's own from the row's columns, then the
// stored extra headers (header fields and the headers column's), and with
// mark event.HeaderDelivery. Rows of
// earlier versions stored the relay's own
// headers too; HeaderSet.Build drops them, so they are not sent twice.
func (e *Entry) event(topic string, set router.HeaderSet, mark bool) event.Event {
	hs, _ := set.Build([]byte(e.EventID), []byte(e.EventType), []byte(e.AggregateType), e.Extra)
	if mark {
		// Sent at least once (this may be its second delivery) beside a
		// stream that delivers exactly once: the header says so, in place
		// of any stored entry of the name.
		hs = append(slices.DeleteFunc(hs, func(h event.Header) bool { return h.Key == event.HeaderDelivery }), event.AtLeastOnce())
	}
	return event.Event{
		ID: e.EventID, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Type: e.EventType,
		Topic: topic, Key: e.Key, Value: e.Value, Headers: hs, Extra: e.Extra, Time: e.MessageTime,
		CommitLSN: e.SourceLSN, CommitTime: e.CommitTime,
	}
}

// undeliverable says why the Worker must not send e at all, or "".
func undeliverable(e *Entry) string {
	switch {
	case e.LastResort:
		return fmt.Sprintf("last-resort record: the retry table could not store this event in its columns, so the relay "+
			"cannot deliver it and keeps it dead (requeueing does not change that); it blocks later events of its aggregate "+
			"until dropped. Inspect it with `outbox-relay retries show %d`, then deliver it by hand, or fix the cause and "+
			"insert the event into the outbox again, and drop this row", e.Seq)
	case e.unreadable != "":
		return fmt.Sprintf("the row cannot be delivered: %s; inspect it with `outbox-relay retries show %d`, deliver it by hand and drop it",
			e.unreadable, e.Seq)
	case e.EventID == "":
		// Consumers deduplicate by the id header: the router refuses such
		// an event, and so does the Worker.
		return fmt.Sprintf("the event has no id (its outbox row's id was NULL or empty), and consumers need one: "+
			"inspect it with `outbox-relay retries show %d`, deliver it by hand or drop it", e.Seq)
	case e.AggregateID == "":
		// No key, no order: the router refuses such an event, and so does
		// the Worker (a requeue cannot give it one).
		return fmt.Sprintf("the event has no aggregate id (its outbox row's aggregate id was NULL or empty), so it has no Kafka key "+
			"and no order: inspect it with `outbox-relay retries show %d`, deliver it by hand or drop it", e.Seq)
	}
	return ""
}

// timeoutReason says why an attempt that ran out of time while Kafka
// answered is the row's own failure.
func timeoutReason(timeout time.Duration, topic string) string {
	return fmt.Sprintf("writing to topic %q did not finish within %s although Kafka answers: the topic may be unusable "+
		"(a name that collides with an existing topic's, such as one differing only in '.' and '_'; partitions without a leader; "+
		"too few in-sync replicas): check it with the Kafka tools and fix it or the topic config; retried with backoff",
		topic, timeout)
}

func (d *delivery) outageOver() {
	if d.w.outage {
		d.w.log.Info("retry worker: kafka reachable again")
		d.w.outage = false
	}
}

// finish deletes what was delivered, records the failure, and commits; with
// nothing to record it rolls back, releasing the claim.
func (d *delivery) finish(dbctx, ctx context.Context) error {
	w, s := d.w, d.w.cfg.Store
	if len(d.delivered) == 0 && d.failed == nil {
		return nil // deferred rollback
	}
	if len(d.delivered) > 0 {
		if _, err := d.tx.Exec(dbctx, fmt.Sprintf(`DELETE FROM %s WHERE seq = ANY($1) AND slot_name = $2`, s.table), d.delivered, s.slot); err != nil {
			return fmt.Errorf("delete delivered rows: %w", err)
		}
	}
	var dead bool
	var attempts int
	if f := d.failed; f != nil {
		backoff := w.backoff(f.row.Attempts + 1)
		var maxAttempts *int
		if w.cfg.MaxAttempts > 0 {
			maxAttempts = &w.cfg.MaxAttempts
		}
		var status string
		// The reason is made plain text whatever Kafka or the router put in
		// it: a failure must never fail to be recorded.
		err := d.tx.QueryRow(dbctx, fmt.Sprintf(`UPDATE %s SET
    attempts = attempts + 1,
    last_error = $2,
    reason_code = $8,
    next_attempt_at = now() + make_interval(secs => $3),
    status = CASE WHEN $4 OR attempts + 1 >= $5
        OR (NOT waiting AND first_failed_at < now() - make_interval(secs => $6)) THEN 'dead' ELSE 'pending' END,
    first_failed_at = CASE WHEN waiting THEN now() ELSE first_failed_at END,
    waiting = false,
    updated_at = now()
WHERE seq = $1 AND slot_name = $7 RETURNING status, attempts`, s.table),
			f.row.Seq, event.PlainText(f.reason), backoff.Seconds(), f.permanent, maxAttempts, w.cfg.MaxAge.Seconds(), s.slot, nullable(f.code)).Scan(&status, &attempts)
		if err != nil {
			return fmt.Errorf("record failure of row %d: %w", f.row.Seq, err)
		}
		dead = status == string(StatusDead)
	}
	if d.topicWait != "" {
		if err := d.postpone(dbctx, d.topicWait); err != nil {
			return err
		}
	}
	if err := d.tx.Commit(dbctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	w.attempted.Add(int64(d.attempted))
	w.succeeded.Add(int64(len(d.delivered)))
	if f := d.failed; f != nil && dead {
		w.deadLettered.Add(1)
		w.log.Warn("retry worker: event is dead; it blocks later events of its aggregate until requeued or dropped",
			"seq", f.row.Seq, "event_id", f.row.EventID, "aggregate", f.row.Aggregate,
			"attempts", attempts, "reason", f.reason)
	}
	if d.shutdown {
		return ctx.Err()
	}
	return nil
}

// postpone makes every pending row of topic (the Store's slot's), a topic
// found missing, wait for it together: due again after a backoff that grows
// with the heads of the topic that failed in a row (topicFailures), in one
// statement. Without
// it each of 100,000 aggregates waiting for one missing topic was claimed
// and failed on its own, again and again: a core spent, and the table read
// whole every poll. Only the probing head counts an attempt; rows older than
// MaxAge stay due, to go dead one by one as their own attempts decide. A
// topic created meanwhile is found within that backoff (at most
// BackoffMax), as a row's own backoff would.
func (d *delivery) postpone(dbctx context.Context, topic string) error {
	w, s := d.w, d.w.cfg.Store
	if w.topicFailures == nil || len(w.topicFailures) >= maxTopicWaits {
		w.topicFailures = make(map[string]int)
	}
	n := w.topicFailures[topic]
	w.topicFailures[topic] = n + 1
	wait := w.backoff(n + 1)
	_, err := d.tx.Exec(dbctx, fmt.Sprintf(`UPDATE %s SET next_attempt_at = now() + make_interval(secs => $2)
WHERE slot_name = $4 AND topic = $1 AND status = 'pending' AND next_attempt_at < now() + make_interval(secs => $2)
  AND (waiting OR first_failed_at >= now() - make_interval(secs => $3))`, s.table),
		topic, wait.Seconds(), w.cfg.MaxAge.Seconds(), s.slot)
	if err != nil {
		return fmt.Errorf("postpone the rows of missing topic %q: %w", topic, err)
	}
	return nil
}

// backoff returns the wait after the attempts-th failed attempt: exponential
// from BackoffMin, capped at BackoffMax, jittered into its upper half so that
// rows that failed together spread out.
func (w *Worker) backoff(attempts int) time.Duration {
	return backoff.Delay(w.cfg.BackoffMin, w.cfg.BackoffMax, attempts-1)
}

// routeCode is the code of routeReason's reason, "" for none.
func routeCode(err error) string {
	var re *router.RouteError
	if errors.As(err, &re) {
		return re.Code
	}
	return ""
}

// routeReason says why an event has no topic.
func routeReason(err error) string {
	var re *router.RouteError
	if errors.As(err, &re) && re.Reason != "" {
		return "cannot route the event: " + re.Reason + "; fix the topic config and requeue it"
	}
	return "cannot route the event: " + err.Error() + "; fix the topic config and requeue it"
}
