package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
)

// committer saves the highest acknowledged transaction end LSN as the
// checkpoint and then confirms it to the stream. Saves are paced by interval,
// unless the events waiting for one pass urgent (half the window).
type committer struct {
	store    leader.Saver
	stream   confirmer
	m        *metrics.Metrics
	win      *window
	log      *slog.Logger
	interval time.Duration
	urgent   int
	health   *health
	history  *historian

	mu         sync.Mutex
	acked      pglogrepl.LSN
	commitTime time.Time
	covered    int // acknowledged events covered by acked, not yet saved
	trailing   int // acknowledged events of a transaction not yet complete
	closed     bool
	notify     chan struct{}

	saved pglogrepl.LSN // run's goroutine only (read after run returns)
}

func newCommitter(store leader.Saver, stream confirmer, win *window, h *health, hist *historian, m *metrics.Metrics, log *slog.Logger, cfg Config, start pglogrepl.LSN) *committer {
	return &committer{
		store: store, stream: stream, win: win, health: h, history: hist, m: m, log: log,
		interval: cfg.CheckpointInterval,
		urgent:   cfg.MaxInFlightEvents / 2, saved: start,
		notify: make(chan struct{}, 1),
	}
}

// ack records that every event of ch is acknowledged or stored.
func (c *committer) ack(ch *chunk) {
	c.mu.Lock()
	if ch.endLSN != 0 {
		c.acked, c.commitTime = ch.endLSN, ch.commitTime
		c.covered += c.trailing + ch.covered
		c.trailing = 0
	}
	c.trailing += ch.trailing
	c.mu.Unlock()
	c.poke()
}

// idle records that every transaction ending at or before lsn is handled:
// the stream is idle there (nothing in flight, everything emitted
// confirmed). It is saved as the checkpoint like an acknowledged end, and
// only then confirmed, so the checkpoint explains every position the slot
// reaches (DESIGN invariant 14). The commit time stays the last delivered
// transaction's.
func (c *committer) idle(lsn pglogrepl.LSN) {
	c.mu.Lock()
	if lsn <= c.acked || c.trailing != 0 {
		c.mu.Unlock()
		return
	}
	c.acked = lsn
	c.mu.Unlock()
	c.poke()
}

func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.poke()
}

func (c *committer) poke() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

func (c *committer) run(ctx context.Context) error {
	var lastSave time.Time
	for {
		select {
		case <-c.notify:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
		closed, covered := c.closed, c.covered
		c.mu.Unlock()
		if wait := c.interval - time.Since(lastSave); wait > 0 && !closed && covered < c.urgent {
			if err := backoff.Sleep(ctx, wait); err != nil {
				return err
			}
		}
		c.mu.Lock()
		lsn, commitTime, events := c.acked, c.commitTime, c.covered
		c.covered = 0
		closed = c.closed
		c.mu.Unlock()
		if lsn > c.saved {
			if err := c.save(ctx, lsn, commitTime); err != nil {
				return err
			}
			c.saved = lsn
			lastSave = time.Now()
			c.stream.Confirm(lsn)
			c.history.offer(lsn, commitTime)
			c.health.progress()
			c.m.SetConfirmedLSN(lsn)
		}
		c.win.giveEvents(events)
		if closed {
			return nil
		}
	}
}

// serverStopping lets go of the replication connection when err says the
// server is shutting down (admin shutdown, or refusing connections while it
// stops): its fast shutdown waits for the walsender's client to confirm all
// the WAL it was sent, and this relay confirms only what it saved, which the
// server now refuses. The stream reconnects once the server is back, and
// resumes from the confirmed position: nothing is lost.
func (c *committer) serverStopping(err error) {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "57P01" && pgErr.Code != "57P03" {
		return
	}
	c.log.Info("the server is shutting down: closing the replication connection so that its shutdown can complete", "err", err)
	c.stream.Restart()
}

// save retries until the checkpoint is durable or ctx is done: Postgres may be
// restarting, and the stream will be waiting for it too. A save that finds a
// newer epoch is not retried: it ends the term.
func (c *committer) save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error {
	return backoff.RetryIf(ctx, c.log, "save checkpoint "+lsn.String(), func(err error) bool {
		return !errors.Is(err, checkpoint.ErrFenced)
	}, c.health.watch("checkpoint", func() error {
		err := c.store.Save(ctx, lsn, commitTime)
		c.serverStopping(err)
		return err
	}))
}
