package eos

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

// ErrRestart wraps the reasons a term ends to begin again at once from the
// checkpoint: its Kafka transaction was aborted.
var ErrRestart = errors.New("relay: the Kafka transaction was aborted; leading again from the checkpoint")

// A TxnSink is the stream's Sink in exactly-once mode: sink.Kafka with a
// transactional id. InitTransactions takes the id (fencing its former
// producers, settling the transaction they left open); Write writes into the
// open transaction; Commit and Abort end it (Commit durable when it returns
// nil). Their errors wrap sink.ErrFenced when a newer producer holds the id,
// sink.ErrTxnAborted when the transaction cannot commit. LastCommitted reads
// the latest committed value of a key in a topic, read_committed. Called
// from the writer's goroutine only.
type TxnSink interface {
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

// A Session is a term's exactly-once delivery, driven by the writer: it
// takes the transactional id, reads the Kafka checkpoint, and has each
// chunk's complete transactions written with their checkpoint in one Kafka
// transaction (Began, Record, Commit, Wrote, Covered: the writer's side).
// The fields are set once, before Start; the writer's goroutine alone calls
// its methods, but Committed.
type Session struct {
	Sink   TxnSink
	Topic  string
	Slot   string
	Epoch  func(ctx context.Context) (int64, error) // the lease's, once taken
	Server func() checkpoint.Server                 // the stream's server now
	Term   pgslot.Server                            // the server the term was checked against
	Log    *slog.Logger

	// Parked is the retry table (retry.Store.Unpark), Reload has the term's
	// gate read it again, Resume is the position the stream starts from.
	Parked interface {
		Unpark(ctx context.Context, from pglogrepl.LSN, hold func(context.Context, pgx.Tx) error) (int64, error)
	}
	// Hold proves in the Unpark's transaction that the term still leads
	// with epoch (checkpoint.Store.HoldEpoch).
	Hold   func(ctx context.Context, tx pgx.Tx, epoch int64) error
	Reload func(ctx context.Context) error
	Resume pglogrepl.LSN

	// Verify asks Postgres whether the term still leads (the lease's
	// Verify): a *checkpoint.FencedError once another relay took over.
	Verify func(ctx context.Context) error
	// Timeouts is the Relay's watch over transactions that outlive their
	// timeout, TSink the stream's sink as it raises it.
	Timeouts *Timeouts
	TSink    TimeoutSink

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
func (x *Session) Committed() pglogrepl.LSN { return pglogrepl.LSN(x.committed.Load()) }

// Start takes the transactional id and reads the Kafka checkpoint, once the
// term leads (fence): a standby must never fence the leader's producer.
func (x *Session) Start(ctx context.Context, f leader.Fence) error {
	if err := f.Check(ctx); err != nil {
		return err
	}
	epoch, err := x.Epoch(ctx)
	if err != nil {
		return err
	}
	x.taken = epoch
	if err := x.Sink.InitTransactions(ctx); err != nil {
		return x.Failed(ctx, fmt.Errorf("take the Kafka transactional id: %w", err))
	}
	var v []byte
	var found bool
	if err := backoff.RetryIf(ctx, x.Log, "read the checkpoint from Kafka topic "+x.Topic, nil, func() error {
		var err error
		v, found, err = x.Sink.LastCommitted(ctx, x.Topic, []byte(x.Slot))
		return err
	}); err != nil {
		return err
	}
	if !found {
		x.Log.Info("exactly-once: no checkpoint in Kafka yet", "topic", x.Topic, "slot", x.Slot)
		return x.unpark(ctx)
	}
	var cp kafkaCheckpoint
	if err := json.Unmarshal(v, &cp); err != nil {
		return fmt.Errorf("the checkpoint record of slot %q in Kafka topic %s is not one the relay wrote (%q): %w", x.Slot, x.Topic, v, err)
	}
	x.floor = x.usable(cp)
	return x.unpark(ctx)
}

// unpark deletes the retry rows of transactions the stream reads again
// (from max(floor, start) on): they were parked in a Kafka transaction that
// did not commit, before a crash or an abort, and are parked again in order
// when their transaction comes. Only then may the retry worker deliver rows.
func (x *Session) unpark(ctx context.Context) error {
	from := max(x.floor, x.Resume)
	if from == 0 {
		return nil
	}
	var n int64
	// Fenced by the term's epoch: a former leader that wakes up here (its
	// Kafka checkpoint read before the new leader's commits) must not
	// delete the rows the new leader parked.
	hold := func(ctx context.Context, tx pgx.Tx) error { return x.Hold(ctx, tx, x.taken) }
	if err := backoff.RetryIf(ctx, x.Log, "delete the retry rows of transactions not committed to Kafka", func(err error) bool {
		return !errors.Is(err, checkpoint.ErrFenced)
	}, func() error {
		var err error
		n, err = x.Parked.Unpark(ctx, from, hold)
		return err
	}); err != nil {
		return err
	}
	if n > 0 {
		x.Log.Info("exactly-once: removed retry rows of transactions whose Kafka transaction did not commit: they are read again and parked again in order",
			"rows", n, "from_lsn", from.String())
		if err := x.Reload(ctx); err != nil {
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
func (x *Session) usable(cp kafkaCheckpoint) pglogrepl.LSN {
	lsn, err := pglogrepl.ParseLSN(cp.EndLSN)
	if err != nil {
		x.Log.Warn("exactly-once: ignoring the Kafka checkpoint: its end_lsn does not parse", "value", cp.EndLSN, "err", err)
		return 0
	}
	if cp.SystemID != "" && x.Term.SystemID != "" && cp.SystemID != x.Term.SystemID {
		x.Log.Warn("exactly-once: ignoring the Kafka checkpoint of another Postgres system (its positions mean nothing here)",
			"topic", x.Topic, "slot", x.Slot, "checkpoint_system_identifier", cp.SystemID, "system_identifier", x.Term.SystemID)
		return 0
	}
	ok, fork := x.Term.Continues(cp.Timeline, lsn)
	switch {
	case ok:
		x.Log.Info("exactly-once: resuming after the Kafka checkpoint", "topic", x.Topic, "end_lsn", lsn.String(),
			"timeline", cp.Timeline, "epoch", cp.Epoch, "this_epoch", x.taken)
		return lsn
	case fork != 0:
		x.Log.Warn("exactly-once: the Kafka checkpoint lies past where its timeline forked off this server's: events after the fork are in Kafka but not in this WAL",
			"end_lsn", lsn.String(), "timeline", cp.Timeline, "fork", fork.String())
		return fork
	}
	x.Log.Warn("exactly-once: ignoring the Kafka checkpoint: its timeline is not in this server's history",
		"end_lsn", lsn.String(), "timeline", cp.Timeline, "server_timeline", x.Term.Timeline)
	return 0
}

// Record is the checkpoint record of a transaction ending at lsn.
func (x *Session) Record(lsn pglogrepl.LSN, commitTime time.Time) (*event.Event, error) {
	srv := x.Server()
	if srv.SystemID == "" {
		srv = x.Term.Server
	}
	v, err := json.Marshal(kafkaCheckpoint{Slot: x.Slot, SystemID: srv.SystemID, Timeline: srv.Timeline,
		EndLSN: lsn.String(), Epoch: x.taken, CommitTime: commitTime})
	if err != nil {
		return nil, fmt.Errorf("encode the Kafka checkpoint: %w", err)
	}
	return &event.Event{Topic: x.Topic, Key: []byte(x.Slot), Value: v, Time: time.Now()}, nil
}

// Failed ends the term for err: a fenced producer stands by; a transaction
// that cannot commit is aborted and the term begins again from the
// checkpoint; anything else (ctx's error, a refused checkpoint record) is
// returned after an abort, which a later InitTransactions would do anyway.
func (x *Session) Failed(ctx context.Context, err error) error {
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
		if aerr := x.Sink.Abort(actx); aerr != nil {
			if errors.Is(aerr, sink.ErrFenced) {
				return fmt.Errorf("%w: %w", leader.ErrStandBy, aerr)
			}
			x.Log.Warn("exactly-once: abort the Kafka transaction (the next term's takeover aborts it)", "err", aerr)
		}
		x.open = false
	}
	if errors.Is(err, sink.ErrTxnAborted) {
		return fmt.Errorf("%w: %w", ErrRestart, err)
	}
	return err
}

// timedOut ends the term whose transaction, open longer than its timeout
// (te), the broker refused with err: as failed does when another relay took
// the slot over (the lease says so), else as txnTimeouts.aborted decides.
func (x *Session) timedOut(ctx context.Context, te *sink.TxnTimeoutError, err error) error {
	if verr := x.Verify(ctx); verr != nil {
		if errors.Is(verr, checkpoint.ErrFenced) {
			return fmt.Errorf("%w: %w (the Kafka transaction ended with: %w)", leader.ErrStandBy, verr, err)
		}
		return verr // ctx is done
	}
	// The coordinator aborted it already; this settles our side.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if aerr := x.Sink.Abort(actx); aerr != nil {
		x.Log.Debug("exactly-once: abort the Kafka transaction the broker aborted on its timeout", "err", aerr)
	}
	x.open = false
	return x.Timeouts.aborted(ctx, x.TSink, x.first, te)
}

// passed is called after each Kafka commit up to end: once a transaction
// the broker aborted on its timeout is delivered, the next ones are written
// with kafka.transaction_timeout again (a new InitTransactions, once the
// term is proven to lead, as at its start).
func (x *Session) passed(ctx context.Context, f leader.Fence, end pglogrepl.LSN) error {
	if !x.Timeouts.passed(end) {
		return nil
	}
	x.Timeouts.reset(x.TSink)
	if err := f.Check(ctx); err != nil {
		return err
	}
	if err := x.Sink.InitTransactions(ctx); err != nil {
		return x.Failed(ctx, fmt.Errorf("take the Kafka transactional id again with kafka.transaction_timeout: %w", err))
	}
	return nil
}

// Close aborts a transaction left open when the pipeline stops (the route
// stage stopped inside a Postgres transaction: before a schema change, at
// the drain deadline): its events are written again after the restart.
func (x *Session) Close(ctx context.Context) error {
	if !x.open {
		return nil
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	x.open = false
	if err := x.Sink.Abort(actx); err != nil && !errors.Is(err, sink.ErrFenced) {
		x.Log.Warn("exactly-once: abort the Kafka transaction left open at the stop (the next term's takeover aborts it)", "err", err)
	}
	return nil
}

// The writer's side, chunk by chunk (relay's deliverExactlyOnce): events of
// transactions at or before Floor are dropped (they are in Kafka); for each
// write, Began with its first event's commit position, then the write (with
// Record's checkpoint when the write ends a Postgres transaction and Open or
// the write has events), then Commit for a write that carried the record,
// Covered once everything up to a transaction's end is committed or parked,
// and Wrote for a write left inside an open transaction.

// Floor is the Kafka checkpoint the term started from: transactions ending
// at or before it are in Kafka.
func (x *Session) Floor() pglogrepl.LSN { return x.floor }

// Open reports whether events were written since the last commit.
func (x *Session) Open() bool { return x.open }

// Began notes the commit position of the first transaction a write brings
// into the Kafka transaction, when none is open (the transaction a timeout
// abort names).
func (x *Session) Began(first pglogrepl.LSN) {
	if !x.open {
		x.first = first
	}
}

// Wrote notes a write of sent events left in the open transaction.
func (x *Session) Wrote(sent int) { x.open = x.open || sent > 0 }

// Commit commits the Kafka transaction, which ends with the checkpoint of
// the Postgres transaction ending at end; f is the term's fence, asked
// before the transactional id is taken again after a timeout abort (passed).
func (x *Session) Commit(ctx context.Context, f leader.Fence, end pglogrepl.LSN) error {
	if err := x.Sink.Commit(ctx); err != nil {
		return x.Failed(ctx, fmt.Errorf("commit the Kafka transaction up to %s: %w", end, err))
	}
	x.open = false
	return x.passed(ctx, f, end)
}

// Covered notes that everything up to end is committed in Kafka or parked,
// and no transaction is open: the retry worker may deliver the rows parked
// before it (Committed).
func (x *Session) Covered(end pglogrepl.LSN) { x.committed.Store(uint64(end)) }

// Buffering is called instead of Start by a buffering term's writer, which
// opens no Kafka transaction: the retry worker may deliver the rows of
// transactions before the term's start (committed to Kafka, or parked at
// least once by a drain); those after it wait for a live term's start.
func (x *Session) Buffering() { x.committed.Store(uint64(x.Resume)) }
