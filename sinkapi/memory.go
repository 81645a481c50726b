package sinkapi

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/event"
)

// Memory is an in-memory sink that keeps the contract of the package doc:
// it acknowledges every event Refuse does not refuse (permanently, with the
// error's text as the reason); later events of a refused event's lane fail
// with ErrBehind, in the same write and in the writes sent before that
// write's Wait returned. It is for tests of the relay without a broker.
//
// Send queues a write that its Wait makes, in order. Block, when set, holds
// every write until it is closed (a broker that does not answer). Ack is
// called with the events each write acknowledged, in order. The zero value
// acknowledges everything. Send, Wait, Write and Abandon are called from one
// goroutine at a time, as of any sink; Ping and Outage from any.
type Memory struct {
	Refuse func(e *event.Event) error
	Block  chan struct{}
	Ack    func(acked []event.Event)

	queue []*memoryDelivery
	holds map[event.Lane]bool
	mu    sync.Mutex
	acked []event.Event
}

type memoryDelivery struct {
	m   *Memory
	evs []event.Event
}

var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Send queues a write of events; its Delivery's Wait makes it.
func (m *Memory) Send(ctx context.Context, events []event.Event) Delivery {
	d := &memoryDelivery{m: m, evs: events}
	m.queue = append(m.queue, d)
	return d
}

// Write writes events now (after the Sends not yet waited for are given up).
func (m *Memory) Write(ctx context.Context, events []event.Event) error {
	return m.Send(ctx, events).Wait(ctx)
}

// Abandon gives up on every Send not yet waited for.
func (m *Memory) Abandon() { m.queue, m.holds = nil, nil }

// Ping answers at once: the memory is always there.
func (m *Memory) Ping(context.Context) error { return nil }

// Outage reports none.
func (m *Memory) Outage() (time.Time, error) { return time.Time{}, nil }

// Acked returns the events acknowledged so far, in order. Safe for
// concurrent use.
func (m *Memory) Acked() []event.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]event.Event(nil), m.acked...)
}

func (d *memoryDelivery) Done() <-chan struct{} { return closed }

func (d *memoryDelivery) Wait(ctx context.Context) error {
	m := d.m
	if len(m.queue) == 0 || m.queue[0] != d {
		return errors.New("sinkapi.Memory: Wait out of the order of the Sends, or after Abandon")
	}
	m.queue = m.queue[1:]
	err := m.write(ctx, d.evs)
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		m.Abandon()
		return err
	}
	var we *WriteError
	if len(m.queue) == 0 {
		m.holds = nil
	} else if errors.As(err, &we) {
		if m.holds == nil {
			m.holds = map[event.Lane]bool{}
		}
		for _, f := range we.Failures {
			m.holds[d.evs[f.Index].Lane()] = true
		}
	}
	return err
}

func (m *Memory) write(ctx context.Context, evs []event.Event) error {
	if m.Block != nil {
		select {
		case <-m.Block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var we WriteError
	failed := map[event.Lane]bool{}
	for lane := range m.holds {
		failed[lane] = true
	}
	var acked []event.Event
	for i := range evs {
		e := &evs[i]
		if failed[e.Lane()] {
			we.Failures = append(we.Failures, Failure{Index: i, Err: ErrBehind,
				Reason: "not written: an earlier message with the same key failed, and it waits behind it"})
			continue
		}
		if m.Refuse != nil {
			if err := m.Refuse(e); err != nil {
				failed[e.Lane()] = true
				we.Failures = append(we.Failures, Failure{Index: i, Err: err, Permanent: true, Reason: err.Error()})
				continue
			}
		}
		acked = append(acked, *e)
	}
	m.mu.Lock()
	m.acked = append(m.acked, acked...)
	m.mu.Unlock()
	if m.Ack != nil {
		m.Ack(acked)
	}
	if len(we.Failures) > 0 {
		return &we
	}
	return nil
}
