package walbuffer

import (
	"testing"
	"time"
)

func TestLeaveGate(t *testing.T) {
	const mb = 1 << 20
	t0 := time.Unix(1e9, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

	g := NewLeaveGate(64 * mb)
	g.Sample(20*mb, at(0))
	g.Sample(22*mb, at(1))
	if g.Ready(at(1)) {
		t.Fatal("ready while the slot's retained WAL only grew; want to wait for it to drop")
	}
	g.Sample(24*mb, at(2))
	g.Sample(3*mb+mb/2, at(3)) // restart_lsn moved
	g.Sample(11*mb, at(4))     // above an eighth of the bound again
	if !g.Ready(at(5)) {
		t.Fatal("not ready 2 s after the slot's retained WAL dropped; want ready within LeaveWindow")
	}
	if g.Ready(at(3 + LeaveWindow.Seconds() + 1)) {
		t.Fatal("ready 4 s after the drop with retained WAL above an eighth of the bound; want to wait for the next drop")
	}

	// Small retained WAL: nothing to wait for.
	g = NewLeaveGate(64 * mb)
	g.Sample(8*mb, at(0))
	if !g.Ready(at(0)) {
		t.Fatal("not ready with the slot retaining an eighth of the bound")
	}

	// No drop ever seen (no samples, or a server writing faster than the
	// slot moves): ready after MaxLeaveWait from the first question.
	g = NewLeaveGate(64 * mb)
	if g.Ready(at(0)) {
		t.Fatal("ready at the first question without any sample")
	}
	if g.Ready(at(MaxLeaveWait.Seconds() - 1)) {
		t.Fatal("ready before MaxLeaveWait without any sample")
	}
	if !g.Ready(at(MaxLeaveWait.Seconds())) {
		t.Fatal("not ready after MaxLeaveWait; a relay that never sees a drop must still go live")
	}
}
