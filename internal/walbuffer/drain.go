package walbuffer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// Defaults of a Drainer.
const (
	DefaultPageSize = 1000
	DefaultPoll     = 200 * time.Millisecond
)

// A Drainer delivers one slot's buffer in key order: it reads a page after
// the last one it handed on, hands it to Send (the relay's writer: Kafka,
// the gate, the retry table), and deletes rows once the writer reports them
// finished with Acked. It never reads a row twice in one Run, and deletes
// only a prefix the writer finished, so a row is never lost and is
// delivered again only after a stop (what was sent and not yet deleted).
type Drainer struct {
	Store    *Store
	PageSize int // rows per page; default DefaultPageSize
	// PageBytes bounds a page's stored bytes (the relay's in-flight byte
	// window); 0: no bound.
	PageBytes int
	Poll      time.Duration // wait when nothing is left to read; default DefaultPoll
	// Send hands a page to the writer, in order; it may block while the
	// writer is busy and returns only ctx's error.
	Send func(ctx context.Context, page []Entry) error
	// Fence is asked before every Delete (the relay's lease); nil: none.
	Fence func(ctx context.Context) error
	// Deleted, when set, is told how many rows each Delete removed.
	Deleted func(n int64)
	// Failed, when set, is told of a read or delete that failed; the
	// Drainer waits and tries again (Postgres restarting is no reason to
	// lose its place: rows handed on are never handed on again).
	Failed func(err error)

	mu       sync.Mutex
	acked    Key
	hasAcked bool
	changed  chan struct{}
}

// Acked records that the writer finished every entry up to and including
// k. It does not block: the writer's goroutine calls it.
func (d *Drainer) Acked(k Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.hasAcked || d.acked.Less(k) {
		d.acked, d.hasAcked = k, true
	}
	if d.changed != nil {
		close(d.changed)
		d.changed = nil
	}
}

func (d *Drainer) ackedKey() (Key, bool, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.changed == nil {
		d.changed = make(chan struct{})
	}
	return d.acked, d.hasAcked, d.changed
}

// Run drains until ctx ends. With untilEmpty it returns nil once the buffer
// holds nothing and every row it handed on is finished and deleted: the
// last drain before the relay streams live, when nothing appends any more.
// Otherwise, each time a page comes back with fewer than half a page of
// rows while every row handed on is finished, it calls nearlyEmpty (nil:
// never), and goes on.
func (d *Drainer) Run(ctx context.Context, untilEmpty bool, nearlyEmpty func()) error {
	size := d.PageSize
	if size <= 0 {
		size = DefaultPageSize
	}
	poll := d.Poll
	if poll <= 0 {
		poll = DefaultPoll
	}
	var sent, deleted Key
	var hasSent, hasDeleted bool
	bo := backoff.Backoff{Min: poll, Max: 5 * time.Second}
	for {
		acked, ok, changed := d.ackedKey()
		if ok && (!hasDeleted || deleted.Less(acked)) {
			if err := d.delete(ctx, acked); err != nil {
				if ctx.Err() != nil || !errors.Is(err, errStore) {
					return err
				}
				if err := d.wait(ctx, err, &bo); err != nil {
					return err
				}
				continue
			}
			deleted, hasDeleted = acked, true
		}
		allDone := !hasSent || ok && !acked.Less(sent)
		page, err := d.Store.Page(ctx, sent, size, d.PageBytes)
		if err != nil {
			if err := d.wait(ctx, err, &bo); err != nil {
				return err
			}
			continue
		}
		bo = backoff.Backoff{Min: poll, Max: 5 * time.Second}
		if len(page) > 0 {
			if err := d.Send(ctx, page); err != nil {
				return err
			}
			sent, hasSent = page[len(page)-1].Key(), true
		}
		if len(page) == 0 && allDone && untilEmpty {
			return nil
		}
		// A page cut short by its bytes is no sign of an emptying buffer.
		full := len(page) == size || d.PageBytes > 0 && pageBytes(page) >= d.PageBytes/2
		if !full && len(page) < size/2 && allDone && nearlyEmpty != nil {
			nearlyEmpty()
		}
		if full {
			continue
		}
		t := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-changed:
			t.Stop()
		case <-t.C:
		}
	}
}

func pageBytes(page []Entry) int {
	n := 0
	for i := range page {
		n += page[i].Size()
	}
	return n
}

// errStore marks a failure of the buffer table, which the Drainer waits out
// (a fence's refusal is not one).
var errStore = errors.New("wal buffer")

func (d *Drainer) wait(ctx context.Context, err error, bo *backoff.Backoff) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if d.Failed != nil {
		d.Failed(err)
	}
	t := time.NewTimer(bo.Next())
	select {
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (d *Drainer) delete(ctx context.Context, upTo Key) error {
	if d.Fence != nil {
		if err := d.Fence(ctx); err != nil {
			return err
		}
	}
	n, err := d.Store.Delete(ctx, upTo)
	if err != nil {
		return fmt.Errorf("%w: %w", errStore, err)
	}
	if d.Deleted != nil {
		d.Deleted(n)
	}
	return nil
}
