package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/addpartitionstotxn"
	"github.com/segmentio/kafka-go/protocol/endtxn"
	"github.com/segmentio/kafka-go/protocol/initproducerid"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
)

// TransactionalIDPrefix begins every transactional id the relay uses: the
// principal needs WRITE and DESCRIBE on TransactionalId resources with it.
const TransactionalIDPrefix = "outbox-relay-"

// TransactionalID is the Kafka transactional id of the relays of slot: one
// per slot, so that a new leader fences the former ones.
func TransactionalID(slot string) string { return TransactionalIDPrefix + slot }

// This file is the transactional producer (Kafka's KIP-98 with
// transactions), on top of the idempotent one (idempotence.go): with
// Config.TransactionalID set, Write writes into the open transaction, and
// Commit or Abort ends it. The protocol, as the Java producer speaks it:
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
//     down) are retried inside with backoff, as Write retries its own; a
//     batch whose outcome is unknown is sent again byte-identical with its
//     sequence numbers within the same transaction (idempotence.go).

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

// DefaultTransactionTimeout is Config.TransactionTimeout's default, as the
// Java producer's transaction.timeout.ms.
const DefaultTransactionTimeout = time.Minute

// txnState is the open transaction: the partitions added to it. Write's
// goroutine only (Commit and Abort are called between Writes).
type txnState struct {
	open  bool
	since time.Time // when the first AddPartitionsToTxn of the open transaction was sent
	parts map[topicPartition]bool
}

// transactional reports whether the sink writes in transactions.
func (k *Kafka) transactional() bool { return k.cfg.TransactionalID != "" }

// fenced reports whether err is a broker's answer that a newer producer of
// the transactional id exists.
func fenced(err error) bool {
	return errors.Is(err, kafka.ProducerFenced) || errors.Is(err, kafka.InvalidProducerEpoch)
}

// coordinatorBusy reports whether err is an answer of a transaction
// coordinator to ask again shortly: it is moving, loading, or still writing
// the markers of the previous transaction, or kafka-go does not know its
// broker yet (a restarted cluster).
func coordinatorBusy(err error) bool {
	return errors.Is(err, kafka.BrokerNotAvailable) ||
		errors.Is(err, kafka.GroupCoordinatorNotAvailable) || // COORDINATOR_NOT_AVAILABLE
		errors.Is(err, kafka.NotCoordinatorForGroup) || // NOT_COORDINATOR
		errors.Is(err, kafka.GroupLoadInProgress) || // COORDINATOR_LOAD_IN_PROGRESS
		errors.Is(err, kafka.ConcurrentTransactions)
}

// txnError turns a broker's answer to a transactional request or produce
// into the sink's: fenced, not allowed, or abortable; fenced and abortable
// also wrap a *TxnTimeoutError when the open transaction outlived its
// timeout.
func (k *Kafka) txnError(op string, err error) error {
	if k.txn.open && !errors.Is(err, kafka.TransactionalIDAuthorizationFailed) && !errors.Is(err, kafka.ClusterAuthorizationFailed) {
		if open := time.Since(k.txn.since); open >= k.prod.timeout {
			err = fmt.Errorf("%w: %w", &TxnTimeoutError{Open: open, Timeout: k.prod.timeout}, err)
		}
	}
	switch {
	case fenced(err):
		return fmt.Errorf("%s (transactional id %q, producer id %d, epoch %d): %w: %w", op, k.cfg.TransactionalID, k.prod.id, k.prod.epoch, ErrFenced, err)
	case errors.Is(err, kafka.TransactionalIDAuthorizationFailed):
		return fmt.Errorf("%s (transactional id %q): %w: %w", op, k.cfg.TransactionalID, ErrTransactionsNotAllowed, err)
	case errors.Is(err, kafka.ClusterAuthorizationFailed):
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
	if k.franz != nil {
		return k.franzInit(ctx)
	}
	if err := k.settleStragglers(ctx); err != nil {
		return err
	}
	old := k.prod.id
	k.prod.id = -1
	clear(k.prod.seqs)
	k.txn = txnState{}
	var res *initproducerid.Response
	err := k.coordinate(ctx, "init transactions", func(ctx context.Context) error {
		m, err := k.transport.Load().RoundTrip(ctx, k.addr, &initproducerid.Request{
			TransactionalID:      k.cfg.TransactionalID,
			TransactionTimeoutMs: int32(k.cfg.TransactionTimeout / time.Millisecond),
			ProducerID:           -1,
			ProducerEpoch:        -1,
		})
		if err != nil {
			return err
		}
		res = m.(*initproducerid.Response)
		if res.ErrorCode != 0 {
			return kafka.Error(res.ErrorCode)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, kafka.InvalidTransactionTimeout) {
			return fmt.Errorf("init transactions: the transaction timeout %s is above the broker's transaction.max.timeout.ms: lower it: %w", k.cfg.TransactionTimeout, err)
		}
		return err
	}
	k.prod.id, k.prod.epoch = res.ProducerID, res.ProducerEpoch
	k.prod.timeout = k.cfg.TransactionTimeout
	k.prod.inits++
	k.log.Info("kafka transactional producer", "transactional_id", k.cfg.TransactionalID,
		"producer_id", k.prod.id, "epoch", k.prod.epoch, "previous_producer_id", old,
		"transaction_timeout", k.prod.timeout.String())
	return nil
}

// SetTransactionTimeout sets the transaction timeout the next
// InitTransactions takes the id with (Config.TransactionTimeout until then);
// the open transaction keeps its own. Not safe for concurrent use with
// Write.
func (k *Kafka) SetTransactionTimeout(d time.Duration) { k.cfg.TransactionTimeout = d }

// coordinate runs one request to the transaction coordinator until it
// succeeds, retrying with backoff while the coordinator is unavailable or
// busy or the network fails, and returns ctx's error or the sink's reading
// of the coordinator's answer otherwise (txnError).
func (k *Kafka) coordinate(ctx context.Context, op string, req func(ctx context.Context) error) error {
	for attempt := 0; ; attempt++ {
		rctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
		err := req(rctx)
		cancel()
		if err == nil {
			if attempt > 0 {
				k.outageOver()
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last answer: %w)", op, ctx.Err(), err)
		}
		var kerr kafka.Error
		if errors.As(err, &kerr) && !coordinatorBusy(err) && !kerr.Temporary() {
			return k.txnError(op, err)
		}
		// The coordinator moving, busy, or not reachable: as an outage of
		// Write, waited out with backoff. CONCURRENT_TRANSACTIONS is the
		// answer to the next transaction's first request until the last
		// one's markers are written, a few milliseconds after its commit:
		// asked again soon, as it is on every commit.
		d := backoff.Delay(20*time.Millisecond, k.cfg.RetryMax, attempt)
		if errors.Is(err, kafka.ConcurrentTransactions) {
			d = backoff.Delay(time.Millisecond, 20*time.Millisecond, attempt)
		}
		if !coordinatorBusy(err) {
			k.outageStarts(err)
			if attempt%10 == 0 {
				k.log.Warn("kafka transaction coordinator unavailable, retrying", "op", op, "attempt", attempt+1, "backoff", d, "err", err)
			}
		}
		if err := backoff.Sleep(ctx, d); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
}

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

func (k *Kafka) endTxn(ctx context.Context, commit bool) error {
	if k.franz != nil {
		return k.franzEnd(ctx, commit)
	}
	if !k.txn.open {
		return nil
	}
	if err := k.settleStragglers(ctx); err != nil {
		return err
	}
	op := "commit transaction"
	if !commit {
		op = "abort transaction"
	}
	err := k.coordinate(ctx, op, func(ctx context.Context) error {
		m, err := k.transport.Load().RoundTrip(ctx, k.addr, &endtxn.Request{
			TransactionalID: k.cfg.TransactionalID,
			ProducerID:      k.prod.id,
			ProducerEpoch:   k.prod.epoch,
			Committed:       commit,
		})
		if err != nil {
			return err
		}
		if code := m.(*endtxn.Response).ErrorCode; code != 0 {
			return kafka.Error(code)
		}
		return nil
	})
	if err != nil {
		return err
	}
	k.txn.open = false
	clear(k.txn.parts)
	return nil
}

// addPartitions registers with the coordinator the partitions of groups not
// yet in the open transaction (AddPartitionsToTxn), and returns the groups
// that may be produced: a partition the coordinator refuses on its own (its
// topic unknown or not authorized) gets that error as its group's and is
// not produced. It returns an error wrapping ErrFenced or ErrTxnAborted when
// the transaction cannot go on, or a broker-wide error for Write's retries.
func (k *Kafka) addPartitions(ctx context.Context, groups []*partitionBatch) ([]*partitionBatch, error) {
	if k.txn.parts == nil {
		k.txn.parts = make(map[topicPartition]bool)
	}
	byTopic := map[string][]int32{}
	var order []string
	for _, g := range groups {
		tp := topicPartition{g.topic, g.partition}
		if k.txn.parts[tp] {
			continue
		}
		if _, ok := byTopic[g.topic]; !ok {
			order = append(order, g.topic)
		}
		byTopic[g.topic] = append(byTopic[g.topic], int32(g.partition))
	}
	refused := map[topicPartition]error{}
	if len(order) > 0 {
		req := &addpartitionstotxn.Request{TransactionalID: k.cfg.TransactionalID, ProducerID: k.prod.id, ProducerEpoch: k.prod.epoch}
		for _, t := range order {
			req.Topics = append(req.Topics, addpartitionstotxn.RequestTopic{Name: t, Partitions: byTopic[t]})
		}
		if !k.txn.open {
			// The coordinator's clock for the timeout starts when it
			// receives this request: ours starts before.
			k.txn.since = time.Now()
		}
		err := k.coordinate(ctx, "add partitions to the transaction", func(ctx context.Context) error {
			m, err := k.transport.Load().RoundTrip(ctx, k.addr, req)
			if err != nil {
				return err
			}
			clear(refused)
			var again error
			for _, t := range m.(*addpartitionstotxn.Response).Results {
				for _, p := range t.Results {
					tp := topicPartition{t.Name, int(p.PartitionIndex)}
					switch err := kafka.Error(p.ErrorCode); {
					case p.ErrorCode == 0:
						k.txn.parts[tp] = true
					case err == kafka.UnknownTopicOrPartition, err == kafka.TopicAuthorizationFailed:
						refused[tp] = err
					case err == kafka.Error(55): // OPERATION_NOT_ATTEMPTED: another partition's refusal
						again = kafka.ConcurrentTransactions
					default:
						return err
					}
				}
			}
			if again != nil && len(refused) == 0 {
				return again
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		k.txn.open = true
	}
	if len(refused) == 0 && len(order) > 0 {
		// Every partition added: all groups may go.
		return groups, nil
	}
	out := groups[:0:0]
	for _, g := range groups {
		tp := topicPartition{g.topic, g.partition}
		switch {
		case refused[tp] != nil:
			g.err = refused[tp]
		case k.txn.parts[tp]:
			out = append(out, g)
		default:
			// Not attempted because another partition was refused: the
			// next round adds it.
			g.err = kafka.ConcurrentTransactions
		}
	}
	return out, nil
}

// txnProduce writes a call's groups into the open transaction: their
// partitions registered first (addPartitions), then one produce request per
// partition leader with all of its partitions' batches (round), as the Java
// producer sends them. Since Kafka 3.6 a leader asks the transaction
// coordinator whether a partition was added to the transaction before it
// appends the first batch (KIP-890), and it keeps one such question per
// transactional id: a second request of the same transaction fails the first
// one's with NOT_ENOUGH_REPLICAS ("Unable to verify the partition has been
// added to the transaction. Underlying error: NETWORK_EXCEPTION"). One
// request per partition, at once, failed nearly all of them. ctx's end does
// not cut a transaction's request short: the round waits for its answers.
// A producer's trouble ends the transaction (txnFailure) instead of taking a
// new producer id.
func (k *Kafka) txnProduce(ctx context.Context, batch []kafka.Message, groups []*partitionBatch) error {
	round, err := k.addPartitions(ctx, groups)
	if err != nil {
		return err
	}
	if err := k.round(context.WithoutCancel(ctx), batch, round); err != nil {
		return err
	}
	return k.txnFailure(round)
}

// txnFailure returns the error that ends a transactional round: a group
// refused for the producer's state or its epoch, or not sent because its
// sequence numbers may be taken. Nil when none was.
func (k *Kafka) txnFailure(groups []*partitionBatch) error {
	for _, g := range groups {
		var pse *ProducerStateError
		switch {
		case g.err == nil:
		case errors.Is(g.err, errSequenceReused):
			return fmt.Errorf("%s[%d]: %w: %w", g.topic, g.partition, ErrTxnAborted, g.err)
		case errors.As(g.err, &pse), errors.Is(g.err, kafka.InvalidTransactionState), errors.Is(g.err, kafka.TransactionalIDAuthorizationFailed):
			return k.txnError(fmt.Sprintf("produce to %s[%d]", g.topic, g.partition), g.err)
		}
	}
	return nil
}

// txnFatal reports whether err, from produce, ends the transaction rather
// than being an outage or a message's failure.
func txnFatal(err error) bool {
	return errors.Is(err, ErrFenced) || errors.Is(err, ErrTxnAborted) ||
		errors.Is(err, ErrTransactionsNotAllowed) || errors.Is(err, errNoTransactions)
}

// outageStarts and outageOver record a broker-wide failure streak for
// Outage, as Write's backoff and acknowledgements do.
func (k *Kafka) outageStarts(cause error) {
	k.outage.mu.Lock()
	if k.outage.since.IsZero() {
		k.outage.since = time.Now()
	}
	k.outage.cause = cause
	k.outage.mu.Unlock()
}

func (k *Kafka) outageOver() {
	k.outage.mu.Lock()
	k.outage.since, k.outage.cause = time.Time{}, nil
	k.outage.mu.Unlock()
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
	probe := &Kafka{cfg: cfg, addr: k.addr, tls: k.tls, mech: k.mech, compression: k.compression, log: k.log,
		prod: producer{id: -1, seqs: make(map[topicPartition]*sequence)}}
	probe.transport.Store(probe.newTransport(nil))
	if k.franz != nil {
		probe.franz = &franz{}
	}
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
