package walbuffer

import (
	"sync"
	"time"
)

// A logical slot's restart_lsn moves from one xl_running_xacts record to the
// next (15 s apart on a busy server), and only once the client confirmed past
// the record. A relay that leaves buffering ends its replication connection
// and starts another from its checkpoint; when that switch straddles a
// record, the slot can miss that record's move and wait for the next one:
// up to 30 s of WAL retained instead of 15 (Postgres 15 and 18, ~96 MB against
// a 96 MB limit at 2-3 MB/s, in TestWALBufferKafkaOutage). Switching just after
// the slot moved leaves the switch the whole interval to complete in.
//
// LeaveWindow is how soon after the slot's retained WAL dropped (its
// restart_lsn moved) a buffering relay may leave; MaxLeaveWait bounds the
// wait so that a relay whose samples never show a drop (a failing query, a
// server that writes so fast that no sample is lower) still goes live.
const (
	LeaveWindow  = 3 * time.Second
	MaxLeaveWait = 30 * time.Second
)

// A LeaveGate tells a buffering relay when leaving for live is cheap for the
// slot: just after its retained WAL dropped, when it is small anyway (an
// eighth of the bound), or once it has waited MaxLeaveWait since it first
// asked. Safe for concurrent use: one goroutine samples, the drain asks.
type LeaveGate struct {
	bound int64

	mu      sync.Mutex
	last    int64
	sampled bool
	dropped time.Time // when a sample was lower than the one before it
	small   bool      // the last sample was at most an eighth of the bound
	asked   time.Time // when Ready was first called
}

// NewLeaveGate returns the gate of a relay whose bound is
// postgres.max_retained_wal.
func NewLeaveGate(bound int64) *LeaveGate { return &LeaveGate{bound: bound} }

// Sample records the slot's retained WAL (RetainedWAL) at now.
func (g *LeaveGate) Sample(retained int64, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sampled && retained < g.last {
		g.dropped = now
	}
	g.last, g.sampled = retained, true
	g.small = retained <= g.bound/8
}

// Ready reports whether the relay may leave buffering at now.
func (g *LeaveGate) Ready(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.asked.IsZero() {
		g.asked = now
	}
	return g.small ||
		!g.dropped.IsZero() && now.Sub(g.dropped) <= LeaveWindow ||
		now.Sub(g.asked) >= MaxLeaveWait
}
