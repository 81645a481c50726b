package main

import (
	"cmp"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// newSinks builds n Kafka sinks of cfg, and closes them with done: the one
// place a command builds the sinks it writes with (run's and recover's two,
// replay's one) or asks Kafka with (check's). Packages take them as their
// own small interfaces (relay.Sink, replay.Sink, admin.Kafka), never as
// *sink.Kafka.
func newSinks(cfg sink.Config, n int) (sinks []*sink.Kafka, done func(), err error) {
	done = func() {
		for _, k := range sinks {
			k.Close()
		}
	}
	for range n {
		k, err := sink.New(cfg)
		if err != nil {
			done()
			return nil, nil, err
		}
		sinks = append(sinks, k)
	}
	return sinks, done, nil
}

// newRelay builds the relay of run and recover with its two sinks (the
// pipeline's and the retry worker's); done closes them once the relay
// returned.
func newRelay(rc relay.Config) (r *relay.Relay, done func(), err error) {
	ks, done, err := newSinks(rc.Sink, 1)
	if err != nil {
		return nil, nil, err
	}
	// With exactly-once delivery the stream's sink is transactional, under
	// the slot's transactional id; the retry worker's never is.
	scfg := rc.Sink
	if rc.Delivery == relay.DeliveryExactlyOnce {
		scfg.TransactionalID = relay.TransactionalID(cmp.Or(rc.Replication.Slot, sql.DefaultSlot))
	}
	stream, sdone, err := newSinks(scfg, 1)
	if err != nil {
		done()
		return nil, nil, err
	}
	ks = append(stream, ks...)
	rdone := done
	done = func() { sdone(); rdone() }
	if r, err = relay.New(rc, relay.Sinks{Stream: ks[0], Retry: ks[1]}); err != nil {
		done()
		return nil, nil, err
	}
	return r, done, nil
}
