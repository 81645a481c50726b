package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// The transactional producer on kgo (franz.go):
// the same contract as txn.go's, on kgo's transactions. InitTransactions
// makes a new kgo client with the transactional id and takes the id at
// once (InitProducerId with no id and epoch: the coordinator bumps the
// epoch and fences every earlier producer of the id). kgo never takes a
// new epoch over a newer producer's: it re-initializes only with its own
// id and epoch (KIP-360), which a coordinator refuses once another
// producer took the id, so a fenced sink stays fenced (ErrFenced).

// franzInit is InitTransactions on kgo.
func (k *Kafka) franzInit(ctx context.Context) error {
	f := k.franz
	k.closeFranz()
	f.inTxn, f.last, f.fenced = false, nil, nil
	k.txn = txnState{}
	for attempt := 0; ; attempt++ {
		cl, err := k.newFranzClient(kgo.TransactionalID(k.cfg.TransactionalID), kgo.TransactionTimeout(k.cfg.TransactionTimeout))
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
		id, epoch, err := cl.ProducerID(rctx)
		cancel()
		if err == nil {
			f.cl = cl
			k.prod.id, k.prod.epoch = id, epoch
			k.prod.timeout = k.cfg.TransactionTimeout
			k.prod.inits++
			k.log.Info("kafka transactional producer", "transactional_id", k.cfg.TransactionalID,
				"producer_id", id, "epoch", epoch, "transaction_timeout", k.prod.timeout.String())
			if attempt > 0 {
				k.outageOver()
			}
			return nil
		}
		cl.Close()
		if ctx.Err() != nil {
			return fmt.Errorf("init transactions: %w (last answer: %w)", ctx.Err(), err)
		}
		kerrv := kerrOf(err)
		if kerrv == kerr.InvalidTransactionTimeout {
			return fmt.Errorf("init transactions: the transaction timeout %s is above the broker's transaction.max.timeout.ms: lower it: %w", k.cfg.TransactionTimeout, err)
		}
		if kerrv != nil && !kerr.IsRetriable(kerrv) && kerrv != kerr.ConcurrentTransactions {
			return k.txnError("init transactions", err)
		}
		// The coordinator moving, loading or unreachable: an outage,
		// waited out with backoff as Write's.
		k.outageStarts(err)
		d := backoff.Delay(20*time.Millisecond, k.cfg.RetryMax, attempt)
		if attempt%10 == 0 {
			k.log.Warn("kafka transaction coordinator unavailable, retrying", "op", "init transactions", "attempt", attempt+1, "backoff", d, "err", err)
		}
		if err := backoff.Sleep(ctx, d); err != nil {
			return fmt.Errorf("init transactions: %w", err)
		}
	}
}

// franzBegin begins a transaction before a transactional sink's first
// round after InitTransactions, Commit or Abort.
func (k *Kafka) franzBegin(cl *kgo.Client) error {
	f := k.franz
	if f.fenced != nil {
		return f.fenced
	}
	if !k.transactional() || f.inTxn {
		return nil
	}
	if err := cl.BeginTransaction(); err != nil {
		return k.txnError("begin transaction", err)
	}
	f.inTxn = true
	k.txn.open, k.txn.since = true, time.Now()
	return nil
}

// franzTxnFailure returns the error that ends the transaction when a
// record of the round was refused for the producer's state, nil when none
// was: fenced (ErrFenced), or the transaction cannot commit (ErrTxnAborted).
func (k *Kafka) franzTxnFailure(errs writeErrors) error {
	return k.franzFenced(k.franzTxnError(errs))
}

// franzFenced keeps err when it says the sink was fenced: the sink never
// writes again.
func (k *Kafka) franzFenced(err error) error {
	if errors.Is(err, ErrFenced) {
		k.franz.fenced = err
	}
	return err
}

func (k *Kafka) franzTxnError(errs writeErrors) error {
	for _, e := range errs {
		if e == nil {
			continue
		}
		switch ke := kerrOf(e); {
		case errors.Is(e, kgo.ErrAborting):
			return fmt.Errorf("produce: %w: %w", ErrTxnAborted, e)
		case ke != nil:
			switch ke {
			case kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.TransactionalIDAuthorizationFailed,
				kerr.OutOfOrderSequenceNumber, kerr.UnknownProducerID, kerr.InvalidProducerIDMapping,
				kerr.InvalidTxnState, kerr.TransactionAbortable:
				return k.txnError("produce", e)
			}
		case kerrOf(e) == nil && !errors.Is(e, kgo.ErrRecordTimeout) && !errors.Is(e, kgo.ErrRecordRetries):
			// kgo's own refusal, such as a producer id it failed
			// to take: the transaction cannot go on.
			return fmt.Errorf("produce: %w: %w", ErrTxnAborted, e)
		}
	}
	return nil
}

// franzEnd commits or aborts the open transaction on kgo.
func (k *Kafka) franzEnd(ctx context.Context, commit bool) error {
	f := k.franz
	if f.fenced != nil {
		return f.fenced
	}
	if !f.inTxn || f.cl == nil {
		return nil
	}
	if f.last != nil {
		select {
		case <-f.last:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	op := "commit transaction"
	if !commit {
		op = "abort transaction"
		if err := f.cl.AbortBufferedRecords(ctx); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}
	err := f.cl.EndTransaction(ctx, kgo.TransactionEndTry(commit))
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (last answer: %w)", op, ctx.Err(), err)
		}
		err = k.franzFenced(k.txnError(op, err))
		if commit && f.fenced == nil {
			// Abort ends what is left of it.
			return err
		}
	}
	f.inTxn = false
	k.txn.open = false
	return err
}
