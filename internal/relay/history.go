package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/backoff"
)

// A historyRecorder writes the checkpoint history: checkpoint.Store's
// contract. Record is durable when it returns nil and records an LSN at most
// once; PruneHistory deletes a slot's rows older than keep but its newest.
// Safe for concurrent use.
type historyRecorder interface {
	Record(ctx context.Context, slot string, lsn pglogrepl.LSN, commitTime time.Time) error
	PruneHistory(ctx context.Context, slot string, keep time.Duration, batch int) (int64, error)
}

// historyTimeout bounds one history write: a hung statement must not keep
// the history from catching up once the server answers again.
const historyTimeout = 30 * time.Second

// historian records saved checkpoints in the checkpoint history, at most one
// row every interval, on its own goroutine: the committer only hands it the
// latest saved checkpoint (offer never blocks), so a slow or failing history
// write never delays a confirmation. A failed write is logged and retried
// with the latest checkpoint an interval later; the history is a record for
// retention and replay, and a gap in it only makes retention wait longer.
type historian struct {
	store          historyRecorder
	log            *slog.Logger
	slot           string
	interval, keep time.Duration

	mu     sync.Mutex
	lsn    pglogrepl.LSN // latest saved checkpoint not yet recorded; 0 when none
	commit time.Time
	notify chan struct{}
}

func newHistorian(store historyRecorder, log *slog.Logger, cfg Config) *historian {
	return &historian{
		store: store, log: log.With("component", "checkpoint_history"), slot: cfg.Replication.Slot,
		interval: cfg.HistoryInterval, keep: cfg.HistoryKeep, notify: make(chan struct{}, 1),
	}
}

// offer hands the historian a checkpoint that was saved. It does not block.
func (h *historian) offer(lsn pglogrepl.LSN, commit time.Time) {
	h.mu.Lock()
	if lsn > h.lsn {
		h.lsn, h.commit = lsn, commit
	}
	h.mu.Unlock()
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// run records offered checkpoints until ctx is done, and prunes rows older
// than keep about once an hour.
func (h *historian) run(ctx context.Context) {
	var last, lastPrune time.Time
	failures := 0
	pruneEvery := min(time.Hour, h.keep)
	for {
		select {
		case <-h.notify:
		case <-ctx.Done():
			return
		}
		if wait := h.interval - time.Since(last); wait > 0 {
			if backoff.Sleep(ctx, wait) != nil {
				return
			}
		}
		h.mu.Lock()
		lsn, commit := h.lsn, h.commit
		h.lsn = 0
		h.mu.Unlock()
		if lsn == 0 {
			continue
		}
		last = time.Now()
		wctx, cancel := context.WithTimeout(ctx, historyTimeout)
		err := h.store.Record(wctx, h.slot, lsn, commit)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			failures++
			if failures == 1 || failures%10 == 0 {
				h.log.Warn("cannot record the checkpoint history; delivery goes on, retention waits for the history: retrying",
					"failures", failures, "retry_in", h.interval.String(), "err", err)
			}
			h.offer(lsn, commit) // unless a newer one came meanwhile
			continue
		}
		if failures > 0 {
			h.log.Info("checkpoint history recorded again", "failures_before", failures)
			failures = 0
		}
		if time.Since(lastPrune) >= pruneEvery {
			lastPrune = time.Now()
			pctx, cancel := context.WithTimeout(ctx, historyTimeout)
			n, err := h.store.PruneHistory(pctx, h.slot, h.keep, 1000)
			cancel()
			switch {
			case ctx.Err() != nil:
				return
			case err != nil:
				h.log.Warn("cannot prune the checkpoint history; trying again in an hour", "keep", h.keep.String(), "err", err)
			case n > 0:
				h.log.Info("pruned the checkpoint history", "rows", n, "keep", h.keep.String())
			}
		}
	}
}
