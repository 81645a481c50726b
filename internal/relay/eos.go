package relay

import (
	"context"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/eos"
	"github.com/outbox-relay/outbox-relay/sink"
)

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

// A TxnTimeoutError says that the broker aborted, on its transaction
// timeout, a Kafka transaction while this relay still led the slot
// (eos.TxnTimeoutError, which says more).
type TxnTimeoutError = eos.TxnTimeoutError

// TransactionalID is the Kafka transactional id of the relays of slot
// (sink.TransactionalID).
func TransactionalID(slot string) string { return sink.TransactionalID(slot) }

// skipDelivered drops from c the events (routed or refused) of transactions
// the Kafka checkpoint (floor) covers: they were committed with it, or
// parked before it. Events are in commit order, so they are a prefix.
func skipDelivered(c *chunk, floor pglogrepl.LSN) {
	if floor == 0 {
		return
	}
	if n, f := committedBefore(c, floor); n > 0 || f > 0 {
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

// deliverExactlyOnce writes c as exactly-once delivery does (x drives the
// Kafka transactions): the events of the transactions c completes into the
// open Kafka transaction with their checkpoint, then the commit, then the
// events of the transaction left open into the next one. It returns the
// events acknowledged and how many were parked, once those of complete
// transactions are committed.
func deliverExactlyOnce(ctx context.Context, x *eos.Session, w *writer, c *chunk) (sent []event.Event, parked int, err error) {
	skipDelivered(c, x.Floor())
	head, tail := split(c)
	if head != nil {
		var cp *event.Event
		if x.Open() || len(head.evs) > 0 {
			if cp, err = x.Record(c.endLSN, c.commitTime); err != nil {
				return nil, 0, err
			}
		}
		if len(head.evs) > 0 {
			x.Began(head.evs[0].CommitLSN)
		}
		s, p, err := w.deliver(ctx, head, cp)
		if err != nil {
			return nil, 0, x.Failed(ctx, err)
		}
		c.sentAt = head.sentAt // stage trace: the first write of c
		if cp != nil {
			if err := x.Commit(ctx, w.fence, c.endLSN); err != nil {
				return nil, 0, err
			}
		}
		x.Covered(c.endLSN)
		sent, parked = s, p
	}
	if len(tail.evs) > 0 || len(tail.fails) > 0 {
		if len(tail.evs) > 0 {
			x.Began(tail.evs[0].CommitLSN)
		}
		s, p, err := w.deliver(ctx, tail, nil)
		if err != nil {
			return nil, 0, x.Failed(ctx, err)
		}
		if c.sentAt.IsZero() {
			c.sentAt = tail.sentAt
		}
		x.Wrote(len(s))
		sent, parked = append(sent, s...), parked+p
	}
	return sent, parked, nil
}
