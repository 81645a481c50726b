package relay

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// gate is the set of aggregates with undelivered rows in the retry table.
// While an aggregate is in it, its events go into the table behind those rows
// instead of to Kafka, so they cannot overtake them (DESIGN invariant 6).
//
// mu serialises the writer's inserts with unblocking: an aggregate is taken
// out only after the table is seen to hold none of its rows, under the same
// lock as every insert, so a row being inserted always keeps it blocked.
type gate struct {
	store retryTable
	log   *slog.Logger

	mu      sync.Mutex
	blocked map[string]struct{}
}

// load rebuilds the set from the table, at start.
func (g *gate) load(ctx context.Context) error {
	aggs, err := g.store.Aggregates(ctx)
	if err != nil {
		return fmt.Errorf("read blocked aggregates from the retry table: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.blocked = make(map[string]struct{}, len(aggs))
	for _, a := range aggs {
		g.blocked[a] = struct{}{}
	}
	if len(aggs) > 0 {
		g.log.Info("aggregates waiting in the retry table: their new events queue behind them", "aggregates", len(aggs))
	}
	return nil
}

// release unblocks the given aggregates that have no row left in the table:
// the worker's Delivered hook, and a periodic sweep for rows delivered or
// dropped by another process.
func (g *gate) release(ctx context.Context, aggs []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	aggs = slices.DeleteFunc(slices.Clone(aggs), func(a string) bool { _, ok := g.blocked[a]; return !ok })
	if len(aggs) == 0 {
		return
	}
	left, err := g.store.Undelivered(ctx, aggs)
	if err != nil {
		g.log.Warn("check the retry table before unblocking aggregates", "err", err)
		return
	}
	for _, a := range aggs {
		if !left[a] {
			delete(g.blocked, a)
		}
	}
}

// sweep releases every blocked aggregate whose rows are gone, every interval.
func (g *gate) sweep(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g.mu.Lock()
		aggs := make([]string, 0, len(g.blocked))
		for a := range g.blocked {
			aggs = append(aggs, a)
		}
		g.mu.Unlock()
		if len(aggs) > 0 {
			g.release(ctx, aggs)
		}
	}
}
