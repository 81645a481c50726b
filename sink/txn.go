package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/event"
)

// TransactionalIDPrefix begins every transactional id the relay uses: the
// principal needs WRITE and DESCRIBE on TransactionalId resources with it.
const TransactionalIDPrefix = "outbox-relay-"

// TransactionalID is the Kafka transactional id of the relays of slot: one
// per slot, so that a new leader fences the former ones.
func TransactionalID(slot string) string { return TransactionalIDPrefix + slot }

// This file is the transactional producer's contract (Kafka's KIP-98
// transactions, on kgo's: franztxn.go): with Config.TransactionalID set,
// Write writes into the open transaction, and Commit or Abort ends it. The
// protocol, as kgo and the Java producer speak it:
//
//   - InitTransactions: InitProducerId with the transactional id, sent to
//     its transaction coordinator. The coordinator finishes (or aborts) a
//     transaction the id left open, bumps the id's epoch and returns it:
//     every earlier producer of the id is fenced from then on, in Kafka
//     itself (its produces and EndTxn are refused with PRODUCER_FENCED or
//     INVALID_PRODUCER_EPOCH).
//   - Before the first record batch to a partition in a transaction,
//     AddPartitionsToTxn registers the partition with the coordinator (one
//     request per produce round for the partitions new to the transaction);
//     record batches carry the transactional attribute bit.
//   - EndTxn commits or aborts: the coordinator writes the commit (abort)
//     markers to every partition of the transaction. A read_committed
//     consumer sees a transaction's records only once its commit marker is
//     written, and never an aborted one's.
//
// What a failure means here:
//
//   - Fenced (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH): a newer producer of
//     the transactional id exists. The sink never writes again under its
//     epoch and never takes a new one by itself: that would fence the newer
//     producer in turn. Write, Commit and Abort return an error wrapping
//     ErrFenced; the caller has lost its leadership.
//   - Abortable: the transaction cannot commit (the broker lost the
//     producer's state, a sequence gap, a batch whose outcome stayed
//     unknown while other records were to take its sequence numbers, the
//     coordinator aborted the transaction on its timeout): an error
//     wrapping ErrTxnAborted. The caller aborts it (Abort) and writes its
//     events again in a new transaction.
//   - Timed out: the coordinator aborts a transaction open longer than the
//     timeout it was opened with, and (Kafka 2.5+, KIP-360) bumps the
//     producer's epoch, so the producer's next request is refused as a
//     fenced one's. The sink cannot tell that from a newer producer; it
//     adds what it knows: when the transaction had been open for at least
//     its timeout, the error also wraps a *TxnTimeoutError (how long, which
//     timeout), and the caller decides (is there a newer producer?).
//   - Broker-wide failures (the coordinator moving or loading, a broker
//     down) are retried inside (kgo's retries, then Write's with backoff); a
//     batch whose outcome is unknown is sent again with its sequence
//     numbers within the same transaction (kgo).

// ErrFenced is wrapped by the errors of Write, Commit, Abort and
// InitTransactions when a newer producer of the transactional id fenced this
// one: it must not write again. Taking a new epoch would fence the newer
// producer in turn, so the sink never does it by itself.
var ErrFenced = errors.New("kafka: a newer producer with the same transactional id fenced this one")

// ErrTxnAborted is wrapped by the errors of Write and Commit when the open
// transaction cannot commit: abort it and write its events again in a new
// one.
var ErrTxnAborted = errors.New("kafka: the transaction cannot commit and must be aborted")

// ErrTransactionsNotAllowed is wrapped when the cluster refuses the
// principal the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): it
// needs WRITE and DESCRIBE on the TransactionalId resource.
var ErrTransactionsNotAllowed = errors.New("the Kafka principal may not use the transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant it WRITE and DESCRIBE on the TransactionalId resource")

// A TxnTimeoutError is wrapped, beside ErrFenced or ErrTxnAborted, by an
// error that ended a transaction that had been open for at least the
// transaction timeout it was opened with: the coordinator may have aborted
// it on that timeout (and bumped the epoch, which looks like fencing). Open
// is measured from before the transaction's first AddPartitionsToTxn, so it
// is never shorter than the coordinator's own count.
type TxnTimeoutError struct {
	Open    time.Duration // how long the transaction had been open when the broker refused it
	Timeout time.Duration // its transaction timeout (transaction.timeout.ms)
}

func (e *TxnTimeoutError) Error() string {
	return fmt.Sprintf("the transaction had been open for %s, longer than its timeout %s: the coordinator aborts such a transaction and bumps the producer epoch",
		e.Open.Round(time.Millisecond), e.Timeout)
}

// errNoTransactions is Write's refusal before InitTransactions succeeded.
var errNoTransactions = errors.New("kafka: a transactional sink writes only after InitTransactions")

// txnState is the open transaction. Write's goroutine only (Commit and
// Abort are called between Writes).
type txnState struct {
	open  bool
	since time.Time // when it began, before its first record was produced
}

// transactional reports whether the sink writes in transactions.
func (k *Kafka) transactional() bool { return k.cfg.TransactionalID != "" }

// fenced reports whether err is a broker's answer that a newer producer of
// the transactional id exists.
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch)
}

// txnError turns a broker's answer to a transactional request or produce
// into the sink's: fenced, not allowed, or abortable; fenced and abortable
// also wrap a *TxnTimeoutError when the open transaction outlived its
// timeout.
func (k *Kafka) txnError(op string, err error) error {
	if k.txn.open && !errors.Is(err, kerr.TransactionalIDAuthorizationFailed) && !errors.Is(err, kerr.ClusterAuthorizationFailed) {
		if open := time.Since(k.txn.since); open >= k.prod.timeout {
			err = fmt.Errorf("%w: %w", &TxnTimeoutError{Open: open, Timeout: k.prod.timeout}, err)
		}
	}
	switch {
	case fenced(err):
		return fmt.Errorf("%s (transactional id %q, producer id %d, epoch %d): %w: %w", op, k.cfg.TransactionalID, k.prod.id, k.prod.epoch, ErrFenced, err)
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return fmt.Errorf("%s (transactional id %q): %w: %w", op, k.cfg.TransactionalID, ErrTransactionsNotAllowed, err)
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		return fmt.Errorf("%s: %w: %w", op, ErrIdempotenceNotAllowed, err)
	}
	return fmt.Errorf("%s (transactional id %q): %w: %w", op, k.cfg.TransactionalID, ErrTxnAborted, err)
}

// InitTransactions takes the transactional id: InitProducerId with it, at
// its transaction coordinator, which finishes or aborts a transaction the id
// left open and bumps its epoch, fencing every earlier producer of the id.
// It retries while the coordinator is unavailable or busy, until ctx is done;
// it wraps ErrTransactionsNotAllowed when the principal may not use the id.
// Every partition's sequence numbers start again at 0. Not safe for
// concurrent use with Write.
func (k *Kafka) InitTransactions(ctx context.Context) error {
	if !k.transactional() {
		return errors.New("kafka: InitTransactions needs a TransactionalID")
	}
	return k.franzInit(ctx)
}

// SetTransactionTimeout sets the transaction timeout the next
// InitTransactions takes the id with (Config.TransactionTimeout until then);
// the open transaction keeps its own. Not safe for concurrent use with
// Write.
func (k *Kafka) SetTransactionTimeout(d time.Duration) { k.cfg.TransactionTimeout = d }

// Commit commits the open transaction: every record Write acknowledged since
// the last Commit or Abort becomes visible to read_committed consumers,
// atomically. Nil without an open transaction. It is durable when it returns
// nil. On an error wrapping ErrFenced or ErrTxnAborted nothing of the
// transaction is visible (or, fenced, another producer decides); a ctx error
// leaves the outcome unknown: the next InitTransactions settles it.
func (k *Kafka) Commit(ctx context.Context) error { return k.endTxn(ctx, true) }

// Abort aborts the open transaction: none of its records is ever visible to
// read_committed consumers. Nil without an open transaction.
func (k *Kafka) Abort(ctx context.Context) error { return k.endTxn(ctx, false) }

func (k *Kafka) endTxn(ctx context.Context, commit bool) error { return k.franzEnd(ctx, commit) }

// txnFatal reports whether err, from produce, ends the transaction rather
// than being an outage or a message's failure.
func txnFatal(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, ErrTxnAborted) ||
		errors.Is(err, ErrTransactionsNotAllowed) || errors.Is(err, errNoTransactions)
}

// retrying counts a broker-wide failure that the producer retries
// (Stats.BrokerErrors and Retries, the Observer) and records it as (part
// of) an outage: Write's backoff and a round's watchdog (franz.go).
func (k *Kafka) retrying(cause error) {
	k.stats.brokerErrors.Add(1)
	k.stats.retries.Add(1)
	if k.obs != nil {
		k.obs.ProduceRetried()
	}
	k.outageStarts(cause)
}

// outageStarts and outageOver record a broker-wide failure streak for
// Outage, as Write's backoff and acknowledgements do; outageOver returns
// when the streak it ended started (zero when there was none).
func (k *Kafka) outageStarts(cause error) {
	k.outage.mu.Lock()
	if k.outage.since.IsZero() {
		k.outage.since = time.Now()
	}
	k.outage.cause = cause
	k.outage.mu.Unlock()
}

func (k *Kafka) outageOver() (since time.Time) {
	k.outage.mu.Lock()
	defer k.outage.mu.Unlock()
	since = k.outage.since
	k.outage.since, k.outage.cause = time.Time{}, nil
	return since
}

// CheckTransactions does what a transactional relay does, with a probe of
// its own under transactionalID: takes the id (InitProducerId at its
// coordinator), writes one record keyed checkKey to topic in a transaction,
// aborts it (so no read_committed consumer ever sees it), and reads topic as
// a read_committed consumer. Nil when all of it is allowed; else an error
// saying which step failed and why (wrapping ErrTransactionsNotAllowed,
// ErrIdempotenceNotAllowed, or the broker's answer: a coordinator that stays
// unavailable means the broker cannot write its transaction state log).
// Taking the id fences a producer that holds it: use an id no relay runs
// with. For `check`; safe for concurrent use.
func (k *Kafka) CheckTransactions(ctx context.Context, transactionalID, topic string) error {
	cfg := k.cfg
	cfg.TransactionalID = transactionalID
	probe := newKafka(cfg)
	defer probe.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.WriteTimeout)
	defer cancel()
	if err := probe.InitTransactions(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("%w: the transaction coordinator did not become available: the cluster must be able to create and write __transaction_state (transaction.state.log.replication.factor brokers, default 3, and transaction.state.log.min.isr in sync, default 2)", err)
		}
		return err
	}
	err := probe.Write(ctx, []event.Event{{Topic: topic, Key: []byte(checkKey), Value: []byte("aborted by check"), Time: time.Now()}})
	if err != nil {
		var we *WriteError
		if errors.As(err, &we) && len(we.Failures) == 1 {
			return fmt.Errorf("write to %s in a transaction: %s", topic, we.Failures[0].Reason)
		}
		return fmt.Errorf("write to %s in a transaction: %w", topic, err)
	}
	if err := probe.Abort(ctx); err != nil {
		return err
	}
	if _, _, err := probe.LastCommitted(ctx, topic, []byte(checkKey)); err != nil {
		return fmt.Errorf("read %s (read_committed): %w", topic, err)
	}
	return nil
}

// checkKey is the key of CheckTransactions' aborted record.
const checkKey = "outbox-relay check (aborted)"
