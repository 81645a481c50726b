package main

import (
	"cmp"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// newSinks builds n Kafka sinks of cfg, and closes them with done: the one
// place a command builds the sinks it writes with (run's and recover's two,
// replay's one) or asks Kafka with (check's). Packages take them as their
// own small interfaces (relay.Sink, replay.Sink, admin.Kafka), never as
// *sink.Kafka.
func newSinks(cfg kafkaclient.Config, n int) (sinks []*sink.Kafka, done func(), err error) {
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

// newRelay builds the relay of run and recover with its sinks (the
// pipeline's and the retry worker's; with exactly-once delivery and a WAL
// bound also the WAL buffer drain's, non-transactional); done closes them
// once the relay returned.
func newRelay(rc relay.Config) (r *relay.Relay, done func(), err error) {
	n := 1
	if rc.Delivery == relay.DeliveryExactlyOnce && rc.MaxRetainedWAL > 0 {
		n = 2
	}
	ks, done, err := newSinks(rc.Sink, n)
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
	sinks := relay.Sinks{Stream: ks[0], Retry: ks[1]}
	if len(ks) > 2 {
		sinks.Drain = ks[2]
	}
	if r, err = relay.New(rc, sinks); err != nil {
		done()
		return nil, nil, err
	}
	return r, done, nil
}
