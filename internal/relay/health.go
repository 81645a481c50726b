package relay

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/replication"
)

// health is what /readyz, the health metrics and the stall warning read: the
// conditions the stages report (a write that keeps failing), what the writer
// is doing, and when the pipeline last made progress.
//
// Stalled means: the server's WAL is ahead of the confirmed LSN, and for
// longer than stallAfter neither has the confirmed LSN moved nor has a chunk
// been acknowledged or parked. A quiet outbox is not stalled (the WAL is not
// ahead once idle advancement confirms it), and neither is a long transaction
// being delivered (its chunks are acknowledged as they go).
type health struct {
	stallAfter time.Duration
	log        *slog.Logger

	mu        sync.Mutex
	problems  map[string]problem // by check name (metrics.HealthChecks)
	lastOK    time.Time          // last time the pipeline progressed or was caught up
	confirmed pglogrepl.LSN      // last sampled confirmed LSN
	walEnd    pglogrepl.LSN      // last sampled server WAL end
	doing     string             // what the writer waits for, a format with one %d; "" when idle
	doingN    int                // the %d
	doingAt   time.Time
	warnedAt  time.Time
}

type problem struct {
	since time.Time
	err   error
}

func newHealth(stallAfter time.Duration, log *slog.Logger) *health {
	return &health{stallAfter: stallAfter, log: log, problems: map[string]problem{}, lastOK: time.Now()}
}

// report sets (err != nil) or clears (nil) the problem of check.
func (h *health) report(check string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.problems, check)
		return
	}
	p, ok := h.problems[check]
	if !ok {
		p.since = time.Now()
	}
	p.err = err
	h.problems[check] = p
}

// watch wraps a write so that its failures are reported under check.
func (h *health) watch(check string, write func() error) func() error {
	return func() error {
		err := write()
		h.report(check, err)
		return err
	}
}

// progress records that the pipeline moved events on, and that the writer
// waits for nothing now.
func (h *health) progress() {
	h.mu.Lock()
	h.lastOK, h.doing = time.Now(), ""
	h.mu.Unlock()
}

// waitFor records what the writer waits for: format (a constant with one %d)
// and n, put together only when reported, as it is set for every chunk.
func (h *health) waitFor(format string, n int) {
	h.mu.Lock()
	h.doing, h.doingN, h.doingAt = format, n, time.Now()
	h.mu.Unlock()
}

// sample feeds the stream's positions, once a second. A confirmed LSN that
// moved, or a WAL that is not ahead of it, is progress.
func (h *health) sample(confirmed, walEnd pglogrepl.LSN, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if confirmed > h.confirmed || walEnd <= confirmed {
		h.lastOK = now
	}
	h.confirmed, h.walEnd = confirmed, walEnd
}

// stalledFor returns how long the pipeline has been behind without progress,
// 0 when it is not stalled (not past stallAfter).
func (h *health) stalledFor(now time.Time) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stalledLocked(now)
}

func (h *health) stalledLocked(now time.Time) time.Duration {
	if d := now.Sub(h.lastOK); d > h.stallAfter && h.walEnd > h.confirmed {
		return d
	}
	return 0
}

// failing returns the checks that fail now and why, in a fixed order, given
// the stream's and the sink's state.
func (h *health) failing(now time.Time, st replication.Stats, outageSince time.Time, outage error) (map[string]bool, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	failing := map[string]bool{}
	var why []string
	switch {
	case !st.Streaming:
		failing["replication"] = true
		why = append(why, "not streaming: the replication connection is down (see the log)")
	case !st.PausedSince.IsZero():
		failing["replication"] = true
		why = append(why, fmt.Sprintf("replication paused for %s: the pipeline takes no batch, so the relay reads and drops what Postgres sends "+
			"(a walsender left unread would hold up every checkpoint) and reads it again once the pipeline moves", now.Sub(st.PausedSince).Round(time.Second)))
	}
	if !outageSince.IsZero() {
		failing["kafka"] = true
		why = append(why, fmt.Sprintf("kafka unreachable for %s: %v", now.Sub(outageSince).Round(time.Second), outage))
	}
	for _, check := range []string{"retry_table", "checkpoint"} {
		if p, ok := h.problems[check]; ok {
			failing[check] = true
			what := map[string]string{"retry_table": "the retry table refuses writes", "checkpoint": "the checkpoint cannot be saved"}[check]
			why = append(why, fmt.Sprintf("%s for %s: %v", what, now.Sub(p.since).Round(time.Second), p.err))
		}
	}
	if d := h.stalledLocked(now); d > 0 {
		failing["stalled"] = true
		msg := fmt.Sprintf("stalled: WAL at %s, confirmed %s, no progress for %s", h.walEnd, h.confirmed, d.Round(time.Second))
		if h.doing != "" {
			msg += fmt.Sprintf("; waiting %s for: "+h.doing, now.Sub(h.doingAt).Round(time.Second), h.doingN)
		}
		why = append(why, msg)
	}
	return failing, why
}

// warn logs the failing checks loudly, at most every 30 s while they last.
func (h *health) warn(now time.Time, why []string) {
	if len(why) == 0 {
		return
	}
	h.mu.Lock()
	due := now.Sub(h.warnedAt) >= 30*time.Second
	if due {
		h.warnedAt = now
	}
	h.mu.Unlock()
	if due {
		h.log.Warn("relay not ready: "+strings.Join(why, "; "), "checks_failing", len(why))
	}
}
