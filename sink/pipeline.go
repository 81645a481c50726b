package sink

import (
	"context"
	"errors"

	"github.com/outbox-relay/outbox-relay/event"
)

// This file is Send and its Delivery. The producer writes one round at a
// time (franz.go says why), so a Send is written by its Wait, in the order
// of the Sends; Done is closed at once. What a caller that sends ahead
// relies on still holds:
//
//   - An event that fails holds its lane in the Sends made before its Wait
//     returned: the caller learns of the failure only then, so those events
//     of the lane fail with ErrBehind instead of overtaking it.
//   - A Wait that returns ctx's error gives up on every Send not yet waited
//     for (Abandon): none of their events is acknowledged.

// errAbandoned is Wait's answer for a Send given up on (Abandon, or an
// earlier Wait returned ctx's error): none of its events is acknowledged.
var errAbandoned = errors.New("sink: write abandoned: an earlier wait ended or Abandon was called")

// pipe is the Sends not yet waited for.
type pipe struct {
	pending []*pending
	// holds are the lanes of events that failed while later Sends were
	// outstanding: their events in those Sends fail with ErrBehind.
	holds map[event.Lane]bool
}

// pending is a Send; see Delivery.
type pending struct {
	k         *Kafka
	events    []event.Event
	abandoned bool
}

// Done is closed at once: Wait writes the Send.
func (p *pending) Done() <-chan struct{} { return closed }

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Send starts a write of events and returns its Delivery, whose Wait
// writes them and reports the outcome, as Write would. The events and their
// bytes must not be modified until Wait returns. Not safe for concurrent
// use (one goroutine sends and waits).
func (k *Kafka) Send(_ context.Context, events []event.Event) Delivery {
	p := &pending{k: k, events: events}
	k.pipe.pending = append(k.pipe.pending, p)
	return p
}

// Abandon gives up on every Send not yet waited for: none of their events
// counts as acknowledged. For a caller that stops without waiting.
func (k *Kafka) Abandon() {
	for _, q := range k.pipe.pending {
		q.abandoned = true
	}
	k.pipe = pipe{}
}

func (p *pending) Wait(ctx context.Context) error {
	k := p.k
	if p.abandoned {
		return errAbandoned
	}
	if len(k.pipe.pending) == 0 || k.pipe.pending[0] != p {
		return errors.New("sink: Wait called out of the order of the Sends")
	}
	err := k.writeAll(ctx, p.events)
	k.pipe.pending = k.pipe.pending[1:]
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		k.Abandon()
		return err
	}
	var we *WriteError
	if len(k.pipe.pending) == 0 {
		k.pipe = pipe{}
	} else if errors.As(err, &we) {
		if k.pipe.holds == nil {
			k.pipe.holds = make(map[event.Lane]bool)
		}
		for _, f := range we.Failures {
			k.pipe.holds[event.Lane{Topic: p.events[f.Index].Topic, Key: string(p.events[f.Index].Key)}] = true
		}
	}
	return err
}
