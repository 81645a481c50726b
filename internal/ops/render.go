package ops

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// WriteJSON writes v (a *LagReport or *StatusReport) as one line of indented-free
// JSON followed by a newline, so that --watch --json produces one object per line.
func WriteJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	if _, err := w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// A Table writes the two-column rows of a report for people, aligned, every
// value escaped with Printable: the layout of every report the commands
// print.
type Table struct{ tw *tabwriter.Writer }

// NewTable returns a Table writing to w. Nothing is written before Flush.
func NewTable(w io.Writer) *Table { return &Table{tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)} }

// Row adds a row: the name k, then v escaped.
func (t *Table) Row(k, v string) { fmt.Fprintf(t.tw, "%s\t%s\n", k, Printable(v)) }

// Flush writes the rows.
func (t *Table) Flush() error { return t.tw.Flush() }

// WriteText writes the report as an aligned two-column table for people.
func (r *LagReport) WriteText(w io.Writer) error {
	tw := NewTable(w)
	row := tw.Row
	row("checked at", r.CheckedAt.UTC().Format(time.RFC3339))
	row("slot", r.SlotName+" ("+slotState(r.Slot, r.SlotGap, r.CheckedAt)+")")
	if missing(r.SlotGap) {
		// No slot: no WAL figures, and no time lag (no slot reads what
		// is committed now); what is known, and the gap.
		if c := r.Checkpoint; c != nil {
			row("checkpoint", c.LSN+"  saved "+timeAgo(c.SavedAt, r.CheckedAt))
		}
		row("retry", retry(r.Retry))
		gapRows(row, r.SlotGap)
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write text: %w", err)
		}
		return nil
	}
	row("wal status", walStatus(r))
	row("current WAL", r.CurrentWALLSN)
	row("confirmed flush", orNA(r.Slot.ConfirmedFlushLSN)+"  lag "+BytesOrNA(r.LagBytes))
	row("restart", orNA(r.Slot.RestartLSN)+"  retained "+BytesOrNA(r.RetainedWALBytes))
	if rd := r.Reading; rd != nil {
		age := "n/a"
		if rd.AgeSeconds != nil {
			age = seconds(*rd.AgeSeconds)
		}
		row("reading", fmt.Sprintf("transaction committed at %s: %d events, %s read in %s, not yet confirmed; behind %s in all",
			rd.CommitLSN, rd.Events, BytesOrNA(&rd.Bytes), age, BytesOrNA(r.BehindBytes)))
	}
	if c := r.Checkpoint; c != nil {
		row("checkpoint", c.LSN+"  saved "+timeAgo(c.SavedAt, r.CheckedAt))
		stoppedRow(row, c)
	} else {
		row("checkpoint", "none saved")
	}
	row("time lag", timeLag(r.TimeLag, r.Slot))
	for _, t := range r.Tables {
		row("time lag "+t.Table, timeLag(t.TimeLag, r.Slot))
	}
	if s := r.TimeLag.LastDeliveredAgeSeconds; s != nil {
		row("last delivered", "committed "+seconds(*s)+" ago")
	} else {
		row("last delivered", "n/a (nothing delivered yet)")
	}
	row("retry", retry(r.Retry))
	bufferRow(row, r.Buffer, r.CheckedAt)
	gapRows(row, r.SlotGap)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write text: %w", err)
	}
	return nil
}

// WriteText writes the report as an aligned two-column table for people.
func (r *StatusReport) WriteText(w io.Writer) error {
	tw := NewTable(w)
	row := tw.Row
	row("checked at", r.CheckedAt.UTC().Format(time.RFC3339))
	row("slot", r.SlotName)
	switch {
	case missing(r.SlotGap):
		row("streaming", "no (the slot does not exist)")
	case r.Streaming:
		row("streaming", "yes, since "+timeAgo(r.Slot.BackendStart, r.CheckedAt))
	case r.Slot.Active:
		row("streaming", "no (slot is held by a backend that is not a walsender)")
	default:
		row("streaming", "no (slot inactive: no relay connected)")
	}
	if r.Slot.Active {
		v := "unknown (application_name is not outbox-relay/<version>)"
		if r.Version != nil {
			v = *r.Version
		}
		row("relay version", v)
		row("backend", holder(r.Slot, r.CheckedAt))
		row("walsender state", orNA(r.Slot.WalsenderState))
	}
	row("confirmed flush", orNA(r.Slot.ConfirmedFlushLSN))
	if c := r.Checkpoint; c != nil {
		row("checkpoint", c.LSN+"  saved "+timeAgo(c.SavedAt, r.CheckedAt))
		if c.LeaderEpoch != nil {
			// Standbys hold nothing a query could see: they log, and
			// their outbox_relay_active metric is 0.
			row("leader", fmt.Sprintf("epoch %d: %s, took over %s", *c.LeaderEpoch, orNA(c.Leader), timeAgo(c.LeaderSince, r.CheckedAt)))
		}
		stoppedRow(row, c)
	} else {
		row("checkpoint", "none saved")
	}
	bufferRow(row, r.Buffer, r.CheckedAt)
	gapRows(row, r.SlotGap)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write text: %w", err)
	}
	return nil
}

// bufferRow says the relay is buffering: what the WAL buffer holds, since
// when.
func bufferRow(row func(k, v string), b *Buffer, now time.Time) {
	if b == nil {
		return
	}
	row("BUFFERING", fmt.Sprintf("%d events (%s) held in the WAL buffer %s since %s (postgres.max_retained_wal): delivered first, in commit order, once Kafka takes them",
		b.Events, BytesOrNA(&b.Bytes), b.Table, timeAgo(&b.Since, now)))
}

// gapRows says that run refuses the slot, what range is uncovered and why,
// and the fix.
func gapRows(row func(k, v string), g *SlotGap) {
	if g == nil {
		return
	}
	rng := g.FromLSN + ".."
	if g.ToLSN != nil {
		rng += *g.ToLSN
	}
	row("SLOT GAP", "run refuses to stream this slot (exit 4): the events committed in "+rng+" were never sent")
	row("  why", g.Reason)
	row("  fix", g.Fix)
}

// missing reports a gap whose slot does not exist.
func missing(g *SlotGap) bool { return g != nil && g.Cause == string(pgslot.CauseSlotMissing) }

// slotState is holder, or "missing" when the slot does not exist.
func slotState(s Slot, g *SlotGap, now time.Time) string {
	if missing(g) {
		return "missing"
	}
	return holder(s, now)
}

func holder(s Slot, now time.Time) string {
	if !s.Active {
		return "inactive"
	}
	var b strings.Builder
	b.WriteString("active")
	if s.ActivePID != nil {
		fmt.Fprintf(&b, ", pid %d", *s.ActivePID)
	}
	if s.ApplicationName != nil {
		fmt.Fprintf(&b, ", %s", *s.ApplicationName)
	}
	if s.ClientAddr != nil {
		fmt.Fprintf(&b, " from %s", *s.ClientAddr)
	}
	if s.BackendStart != nil {
		fmt.Fprintf(&b, ", connected %s", timeAgo(s.BackendStart, now))
	}
	return b.String()
}

// walStatus reports the slot's wal_status as the server has it, with the
// server's max_slot_wal_keep_size. safe_wal_size is NULL both when the limit
// is unlimited and when the slot is already lost: only the setting tells them
// apart, so it is read, never assumed.
func walStatus(r *LagReport) string {
	s := r.Slot
	keep := "max_slot_wal_keep_size = " + r.MaxSlotWALKeepSize
	switch {
	case r.MaxSlotWALKeepSize == "":
		keep = "max_slot_wal_keep_size unknown"
	}
	var safe string
	switch {
	case s.Lost():
		safe = "none: the slot was invalidated, the WAL it needed is gone"
	case s.SafeWALSizeBytes != nil:
		safe = Bytes(*s.SafeWALSizeBytes)
	case r.MaxSlotWALKeepSizeBytes == nil && r.MaxSlotWALKeepSize != "":
		safe = "unlimited"
	default:
		safe = "n/a"
	}
	line := orNA(s.WALStatus) + ", safe_wal_size " + safe + " (" + keep + ")"
	switch {
	case s.Lost():
		line += "  LOST: it can never stream again; recreate it (see \"When the slot is at risk\" in docs/failover.md)"
	case s.atRisk():
		line += "  AT RISK: invalidated at the next checkpoint unless the relay catches up; see \"When the slot is at risk\" in docs/failover.md"
	}
	return line
}

func timeLag(t TimeLag, s Slot) string {
	switch {
	case t.State == StateCaughtUp:
		return "caught up"
	case t.State == StateBehind:
		return seconds(*t.Seconds) + " (oldest undelivered event created " + t.OldestUndeliveredAt.UTC().Format(time.RFC3339) + ")"
	case t.slotAtRisk && s.Lost():
		return "unknown: the slot is lost, events committed after its confirmed position are not delivered through it"
	case t.slotAtRisk:
		return "unknown: the slot is unreserved and will be lost at the next checkpoint unless the relay catches up"
	default:
		return "unknown (outbox table is empty; use the lag in bytes)"
	}
}

func retry(r *Retry) string {
	if r == nil {
		return "n/a (no retry table)"
	}
	s := fmt.Sprintf("%d pending", r.Pending)
	if r.OldestPendingAgeSeconds != nil {
		s += " (oldest " + seconds(*r.OldestPendingAgeSeconds) + ")"
	}
	return s + fmt.Sprintf(", %d dead", r.Dead)
}

func orNA(s *string) string {
	if s == nil {
		return "n/a"
	}
	return *s
}

// BytesOrNA is Bytes, or "n/a" for nil (an SQL NULL).
func BytesOrNA(n *int64) string {
	if n == nil {
		return "n/a"
	}
	return Bytes(*n)
}

// Bytes renders a byte count for people in binary units, keeping the exact
// number for small values where the unit would hide it: 512 B, 16.0 MiB. It
// is the one rendering of sizes in human output (lag, status, check).
func Bytes(n int64) string {
	const unit = 1024
	if n < unit && n > -unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), 0
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	for math.Abs(f) >= unit && i < len(units)-1 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

func timeAgo(t *time.Time, now time.Time) string {
	if t == nil {
		return "at unknown time"
	}
	return t.UTC().Format(time.RFC3339) + " (" + seconds(now.Sub(*t).Seconds()) + " ago)"
}

// seconds formats an age for people: millisecond precision below a minute,
// whole seconds above.
func seconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d < time.Minute {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// RoughDuration renders d coarsely, for columns and ages where the second
// does not matter: 0s, 45s, 12m, 3h (below two days), 2d.
func RoughDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

// stoppedRow shows the relay's stop record, if any.
func stoppedRow(row func(k, v string), c *Checkpoint) {
	if c.StoppedBefore != nil {
		row("STOPPED", "before the transaction committed at "+*c.StoppedBefore+": "+*c.StopReason)
	}
	if c.LastRefill != nil {
		row("LAST REFILL", *c.LastRefill)
	}
}
