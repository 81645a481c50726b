package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sink"
)

// # Exactly-once delivery (Config.Delivery exactly-once)
//
// The stream's events are written in Kafka transactions, each holding whole
// Postgres transactions and, as its last record, the checkpoint: a record
// keyed by the slot in a compacted topic the relay owns (CheckpointTopic),
// whose value says up to which transaction end the events are in Kafka
// (kafkaCheckpoint). The events and their checkpoint become visible to
// read_committed consumers together, or not at all. So:
//
//   - The Kafka checkpoint is the truth of what was delivered. It is written
//     in the same transaction as the events; the Postgres checkpoint is
//     saved, and the position confirmed to the slot, only after the Kafka
//     commit (the committer gets a chunk only then). Whatever crashes when,
//     the Kafka checkpoint is at or past the Postgres one.
//   - A term starts by taking the transactional id (one per slot,
//     TransactionalID): InitProducerId finishes or aborts the transaction
//     the id left open (a former leader's, or this relay's before a crash)
//     and bumps the id's epoch, fencing every former producer in Kafka
//     itself, beside the checkpoint row's epoch in Postgres. Only then it
//     reads the Kafka checkpoint (read_committed: settled by the takeover)
//     and drops every event of a transaction at or before it: the stream
//     resumes from the Postgres checkpoint, which may be behind (Kafka
//     committed, Postgres not saved), and those events are in Kafka already.
//   - A transaction that cannot commit (the broker lost the producer's
//     state) is aborted and the term starts again from the checkpoint: its
//     events are read from the slot again and written in a new transaction.
//     A fenced producer (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) has lost
//     its leadership: the term stands by, and never takes the id again by
//     itself. Unless the transaction had been open longer than its timeout
//     and the lease shows this relay still leads: then the coordinator
//     aborted it on its timeout, which bumps the epoch too, and
//     txntimeout.go decides (write it again with a timeout raised to the
//     broker's cap, or stop with the fix), reporting it meanwhile.
//   - Events the pipeline parks in the retry table are stored before the
//     commit that covers their transaction, and the retry worker delivers
//     them only once that commit is done (WorkerConfig.Committed). A term
//     deletes the rows parked in a Kafka transaction that never committed
//     (retry.Store.Unpark): their transactions are read again and parked
//     again, in order, behind nothing that came after them. The retry
//     worker, replay, refill and the WAL buffer's drain (eosbuffer.go)
//     write outside transactions: at least once, and their messages carry
//     event.HeaderDelivery.
//   - A Kafka transaction holds whole Postgres transactions: it is
//     committed at the end of each chunk that ends one (chunks are bounded
//     by TransactionMaxEvents and TransactionMaxBytes), and a Postgres
//     transaction larger than a chunk keeps it open until its end, so that
//     a checkpoint never falls inside a Postgres transaction.

// Delivery modes (Config.Delivery).
const (
	DeliveryAtLeastOnce = "at-least-once"
	DeliveryExactlyOnce = "exactly-once"
)

// Defaults of the exactly-once settings.
const (
	DefaultCheckpointTopic      = "outbox-relay-checkpoints"
	DefaultTransactionMaxEvents = 10000
	DefaultTransactionMaxBytes  = 4 << 20
)

// TransactionalIDPrefix begins every transactional id the relay uses
// (sink.TransactionalIDPrefix).
const TransactionalIDPrefix = sink.TransactionalIDPrefix

// TransactionalID is the Kafka transactional id of the relays of slot
// (sink.TransactionalID).
func TransactionalID(slot string) string { return sink.TransactionalID(slot) }

// errRestart wraps the reasons a term ends to begin again at once from the
// checkpoint: its Kafka transaction was aborted.
var errRestart = errors.New("relay: the Kafka transaction was aborted; leading again from the checkpoint")

// A txnSink is the stream's Sink in exactly-once mode: sink.Kafka with a
// transactional id. InitTransactions takes the id (fencing its former
// producers, settling the transaction they left open); Write writes into the
// open transaction; Commit and Abort end it (Commit durable when it returns
// nil). Their errors wrap sink.ErrFenced when a newer producer holds the id,
// sink.ErrTxnAborted when the transaction cannot commit. LastCommitted reads
// the latest committed value of a key in a topic, read_committed. Called
// from the writer's goroutine only.
type txnSink interface {
	InitTransactions(ctx context.Context) error
	Commit(ctx context.Context) error
	Abort(ctx context.Context) error
	LastCommitted(ctx context.Context, topic string, key []byte) ([]byte, bool, error)
}

// kafkaCheckpoint is the value of a checkpoint record: every event of a
// transaction of Slot ending at or before EndLSN, on the WAL of SystemID
// and Timeline, is in Kafka (committed with this record), written by the
// leader of Epoch.
type kafkaCheckpoint struct {
	Slot       string    `json:"slot"`
	SystemID   string    `json:"system_identifier"`
	Timeline   int32     `json:"timeline"`
	EndLSN     string    `json:"end_lsn"`
	Epoch      int64     `json:"epoch"`
	CommitTime time.Time `json:"commit_time,omitzero"`
}

// eos is a term's exactly-once delivery, driven by the writer: it takes the
// transactional id, reads the Kafka checkpoint, and writes each chunk's
// complete transactions with their checkpoint in one Kafka transaction.
type eos struct {
	sink   txnSink
	topic  string
	slot   string
	epoch  func(ctx context.Context) (int64, error) // the lease's, once taken
	server func() checkpoint.Server                 // the stream's server now
	term   pgslot.Server                            // the server the term was checked against
	log    *slog.Logger

	// parked is the retry table (retry.Store.Unpark), gate the term's,
	// resume the position the stream starts from.
	parked interface {
		Unpark(ctx context.Context, from pglogrepl.LSN, hold func(context.Context, pgx.Tx) error) (int64, error)
	}
	// hold proves in the Unpark's transaction that the term still leads
	// with epoch (checkpoint.Store.HoldEpoch).
	hold   func(ctx context.Context, tx pgx.Tx, epoch int64) error
	gate   *gate
	resume pglogrepl.LSN

	// verify asks Postgres whether the term still leads (the lease's
	// verify): a *checkpoint.FencedError once another relay took over.
	verify func(ctx context.Context) error
	// timeouts is the Relay's watch over transactions that outlive their
	// timeout, tsink the stream's sink as it raises it.
	timeouts *txnTimeouts
	tsink    timeoutSink

	taken int64         // the term's epoch
	floor pglogrepl.LSN // the Kafka checkpoint: transactions ending at or before it are in Kafka
	open  bool          // events written since the last commit
	first pglogrepl.LSN // the commit LSN of the first transaction written since the last commit
	// committed is where the Kafka commits have reached (the floor, then
	// each commit's end): the retry worker delivers only rows of
	// transactions before it (WorkerConfig.Committed). 0 until start.
	committed atomic.Uint64
}

// Committed is the retry worker's gate: rows parked in a Kafka transaction
// are delivered only once it committed, so that an abort cannot leave an
// event in Kafka, from the retry table, that its transaction's commit would
// have ordered after events sent again in the next one.
func (x *eos) Committed() pglogrepl.LSN { return pglogrepl.LSN(x.committed.Load()) }

// start takes the transactional id and reads the Kafka checkpoint, once the
// term leads (fence): a standby must never fence the leader's producer.
func (x *eos) start(ctx context.Context, f leader.Fence) error {
	if err := f.Check(ctx); err != nil {
		return err
	}
	epoch, err := x.epoch(ctx)
	if err != nil {
		return err
	}
	x.taken = epoch
	if err := x.sink.InitTransactions(ctx); err != nil {
		return x.failed(ctx, fmt.Errorf("take the Kafka transactional id: %w", err))
	}
	var v []byte
	var found bool
	if err := backoff.RetryIf(ctx, x.log, "read the checkpoint from Kafka topic "+x.topic, nil, func() error {
		var err error
		v, found, err = x.sink.LastCommitted(ctx, x.topic, []byte(x.slot))
		return err
	}); err != nil {
		return err
	}
	if !found {
		x.log.Info("exactly-once: no checkpoint in Kafka yet", "topic", x.topic, "slot", x.slot)
		return x.unpark(ctx)
	}
	var cp kafkaCheckpoint
	if err := json.Unmarshal(v, &cp); err != nil {
		return fmt.Errorf("the checkpoint record of slot %q in Kafka topic %s is not one the relay wrote (%q): %w", x.slot, x.topic, v, err)
	}
	x.floor = x.usable(cp)
	return x.unpark(ctx)
}

// unpark deletes the retry rows of transactions the stream reads again
// (from max(floor, start) on): they were parked in a Kafka transaction that
// did not commit, before a crash or an abort, and are parked again in order
// when their transaction comes. Only then may the retry worker deliver rows.
func (x *eos) unpark(ctx context.Context) error {
	from := max(x.floor, x.resume)
	if from == 0 {
		return nil
	}
	var n int64
	// Fenced by the term's epoch: a former leader that wakes up here (its
	// Kafka checkpoint read before the new leader's commits) must not
	// delete the rows the new leader parked.
	hold := func(ctx context.Context, tx pgx.Tx) error { return x.hold(ctx, tx, x.taken) }
	if err := backoff.RetryIf(ctx, x.log, "delete the retry rows of transactions not committed to Kafka", func(err error) bool {
		return !errors.Is(err, checkpoint.ErrFenced)
	}, func() error {
		var err error
		n, err = x.parked.Unpark(ctx, from, hold)
		return err
	}); err != nil {
		return err
	}
	if n > 0 {
		x.log.Info("exactly-once: removed retry rows of transactions whose Kafka transaction did not commit: they are read again and parked again in order",
			"rows", n, "from_lsn", from.String())
		if err := x.gate.load(ctx); err != nil {
			return err
		}
	}
	x.committed.Store(uint64(from))
	return nil
}

// usable returns the position up to which cp says the term's WAL is in
// Kafka: cp's end when cp is this system's and this server's WAL contains
// it; where cp's timeline ended when the server forked off it before cp
// (what follows on the old timeline never reached this one); 0 when cp is
// another system's or its timeline is unknown here.
func (x *eos) usable(cp kafkaCheckpoint) pglogrepl.LSN {
	lsn, err := pglogrepl.ParseLSN(cp.EndLSN)
	if err != nil {
		x.log.Warn("exactly-once: ignoring the Kafka checkpoint: its end_lsn does not parse", "value", cp.EndLSN, "err", err)
		return 0
	}
	if cp.SystemID != "" && x.term.SystemID != "" && cp.SystemID != x.term.SystemID {
		x.log.Warn("exactly-once: ignoring the Kafka checkpoint of another Postgres system (its positions mean nothing here)",
			"topic", x.topic, "slot", x.slot, "checkpoint_system_identifier", cp.SystemID, "system_identifier", x.term.SystemID)
		return 0
	}
	ok, fork := x.term.Continues(cp.Timeline, lsn)
	switch {
	case ok:
		x.log.Info("exactly-once: resuming after the Kafka checkpoint", "topic", x.topic, "end_lsn", lsn.String(),
			"timeline", cp.Timeline, "epoch", cp.Epoch, "this_epoch", x.taken)
		return lsn
	case fork != 0:
		x.log.Warn("exactly-once: the Kafka checkpoint lies past where its timeline forked off this server's: events after the fork are in Kafka but not in this WAL",
			"end_lsn", lsn.String(), "timeline", cp.Timeline, "fork", fork.String())
		return fork
	}
	x.log.Warn("exactly-once: ignoring the Kafka checkpoint: its timeline is not in this server's history",
		"end_lsn", lsn.String(), "timeline", cp.Timeline, "server_timeline", x.term.Timeline)
	return 0
}

// skipDelivered drops from c the events (routed or refused) of transactions
// the Kafka checkpoint covers: they were committed with it, or parked before
// it. Events are in commit order, so they are a prefix.
func (x *eos) skipDelivered(c *chunk) {
	if x.floor == 0 {
		return
	}
	if n, f := committedBefore(c, x.floor); n > 0 || f > 0 {
		c.evs, c.fails = c.evs[n:], c.fails[f:]
		for i := range c.fails {
			c.fails[i].before = max(c.fails[i].before-n, 0)
		}
	}
}

// committedBefore counts the routed (n) and refused (f) events of c whose
// transactions committed before lsn: in commit order, they are prefixes.
func committedBefore(c *chunk, lsn pglogrepl.LSN) (n, f int) {
	for n < len(c.evs) && c.evs[n].CommitLSN < lsn {
		n++
	}
	for f < len(c.fails) && c.fails[f].ev.CommitLSN < lsn {
		f++
	}
	return n, f
}

// split cuts c at the end of its last complete transaction: head holds the
// events of the transactions that end in c (nil when none does), tail those
// of the transaction still open at its end.
func split(c *chunk) (head, tail *chunk) {
	if c.endLSN == 0 {
		return nil, c
	}
	n, f := committedBefore(c, c.endLSN)
	head = &chunk{evs: c.evs[:n:n], fails: c.fails[:f:f], endLSN: c.endLSN, commitTime: c.commitTime}
	tail = &chunk{evs: c.evs[n:], fails: append([]routeFailure(nil), c.fails[f:]...)}
	for i := range tail.fails {
		tail.fails[i].before -= n
	}
	return head, tail
}

// deliver writes c as exactly-once delivery does: the events of the
// transactions c completes into the open Kafka transaction with their
// checkpoint, then the commit, then the events of the transaction left open
// into the next one. It returns the events acknowledged and how many were
// parked, once those of complete transactions are committed.
func (x *eos) deliver(ctx context.Context, w *writer, c *chunk) (sent []event.Event, parked int, err error) {
	x.skipDelivered(c)
	head, tail := split(c)
	if head != nil {
		var cp *event.Event
		if x.open || len(head.evs) > 0 {
			if cp, err = x.record(c.endLSN, c.commitTime); err != nil {
				return nil, 0, err
			}
		}
		if !x.open && len(head.evs) > 0 {
			x.first = head.evs[0].CommitLSN
		}
		s, p, err := w.deliver(ctx, head, cp)
		if err != nil {
			return nil, 0, x.failed(ctx, err)
		}
		c.sentAt = head.sentAt // stage trace: the first write of c
		if cp != nil {
			if err := x.sink.Commit(ctx); err != nil {
				return nil, 0, x.failed(ctx, fmt.Errorf("commit the Kafka transaction up to %s: %w", c.endLSN, err))
			}
			x.open = false
			if err := x.passed(ctx, w.fence, c.endLSN); err != nil {
				return nil, 0, err
			}
		}
		// Everything up to the end is committed in Kafka or parked, and
		// no transaction is open: the parked rows may go.
		x.committed.Store(uint64(c.endLSN))
		sent, parked = s, p
	}
	if len(tail.evs) > 0 || len(tail.fails) > 0 {
		if !x.open && len(tail.evs) > 0 {
			x.first = tail.evs[0].CommitLSN
		}
		s, p, err := w.deliver(ctx, tail, nil)
		if err != nil {
			return nil, 0, x.failed(ctx, err)
		}
		if c.sentAt.IsZero() {
			c.sentAt = tail.sentAt
		}
		x.open = x.open || len(s) > 0
		sent, parked = append(sent, s...), parked+p
	}
	return sent, parked, nil
}

// record is the checkpoint record of a transaction ending at lsn.
func (x *eos) record(lsn pglogrepl.LSN, commitTime time.Time) (*event.Event, error) {
	srv := x.server()
	if srv.SystemID == "" {
		srv = x.term.Server
	}
	v, err := json.Marshal(kafkaCheckpoint{Slot: x.slot, SystemID: srv.SystemID, Timeline: srv.Timeline,
		EndLSN: lsn.String(), Epoch: x.taken, CommitTime: commitTime})
	if err != nil {
		return nil, fmt.Errorf("encode the Kafka checkpoint: %w", err)
	}
	return &event.Event{Topic: x.topic, Key: []byte(x.slot), Value: v, Time: time.Now()}, nil
}

// failed ends the term for err: a fenced producer stands by; a transaction
// that cannot commit is aborted and the term begins again from the
// checkpoint; anything else (ctx's error, a refused checkpoint record) is
// returned after an abort, which a later InitTransactions would do anyway.
func (x *eos) failed(ctx context.Context, err error) error {
	// The sink's word that the transaction outlived its timeout, whether
	// it spans chunks or one slow write.
	var te *sink.TxnTimeoutError
	if errors.As(err, &te) && (errors.Is(err, sink.ErrFenced) || errors.Is(err, sink.ErrTxnAborted)) {
		return x.timedOut(ctx, te, err)
	}
	if errors.Is(err, sink.ErrFenced) {
		return fmt.Errorf("%w: %w", leader.ErrStandBy, err)
	}
	if x.open || !errors.Is(err, context.Canceled) {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if aerr := x.sink.Abort(actx); aerr != nil {
			if errors.Is(aerr, sink.ErrFenced) {
				return fmt.Errorf("%w: %w", leader.ErrStandBy, aerr)
			}
			x.log.Warn("exactly-once: abort the Kafka transaction (the next term's takeover aborts it)", "err", aerr)
		}
		x.open = false
	}
	if errors.Is(err, sink.ErrTxnAborted) {
		return fmt.Errorf("%w: %w", errRestart, err)
	}
	return err
}

// timedOut ends the term whose transaction, open longer than its timeout
// (te), the broker refused with err: as failed does when another relay took
// the slot over (the lease says so), else as txnTimeouts.aborted decides.
func (x *eos) timedOut(ctx context.Context, te *sink.TxnTimeoutError, err error) error {
	if verr := x.verify(ctx); verr != nil {
		if errors.Is(verr, checkpoint.ErrFenced) {
			return fmt.Errorf("%w: %w (the Kafka transaction ended with: %w)", leader.ErrStandBy, verr, err)
		}
		return verr // ctx is done
	}
	// The coordinator aborted it already; this settles our side.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if aerr := x.sink.Abort(actx); aerr != nil {
		x.log.Debug("exactly-once: abort the Kafka transaction the broker aborted on its timeout", "err", aerr)
	}
	x.open = false
	return x.timeouts.aborted(ctx, x.tsink, x.first, te)
}

// passed is called after each Kafka commit up to end: once a transaction
// the broker aborted on its timeout is delivered, the next ones are written
// with kafka.transaction_timeout again (a new InitTransactions, once the
// term is proven to lead, as at its start).
func (x *eos) passed(ctx context.Context, f leader.Fence, end pglogrepl.LSN) error {
	if !x.timeouts.passed(end) {
		return nil
	}
	x.timeouts.reset(x.tsink)
	if err := f.Check(ctx); err != nil {
		return err
	}
	if err := x.sink.InitTransactions(ctx); err != nil {
		return x.failed(ctx, fmt.Errorf("take the Kafka transactional id again with kafka.transaction_timeout: %w", err))
	}
	return nil
}

// close aborts a transaction left open when the pipeline stops (the route
// stage stopped inside a Postgres transaction: before a schema change, at
// the drain deadline): its events are written again after the restart.
func (x *eos) close(ctx context.Context) error {
	if !x.open {
		return nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	x.open = false
	if err := x.sink.Abort(actx); err != nil && !errors.Is(err, sink.ErrFenced) {
		x.log.Warn("exactly-once: abort the Kafka transaction left open at the stop (the next term's takeover aborts it)", "err", err)
	}
	return nil
}
