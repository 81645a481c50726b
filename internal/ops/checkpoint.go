package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// CheckpointReport is the answer of CheckpointShow (`outbox-relay
// checkpoint show`). Its JSON form is documented in the package doc.
type CheckpointReport struct {
	SlotName      string          `json:"slot_name"`
	CheckedAt     time.Time       `json:"checked_at"`
	Checkpoint    *Checkpoint     `json:"checkpoint"`
	Slot          *CheckpointSlot `json:"slot"`
	ResumeLSN     *string         `json:"resume_lsn"`
	CurrentWALLSN string          `json:"current_wal_lsn"`
	History       *History        `json:"history"`
	Horizon       *Horizon        `json:"retention_horizon"`
	NoHorizon     *string         `json:"retention_horizon_missing"`
}

// CheckpointSlot is what `checkpoint show` says of the slot.
type CheckpointSlot struct {
	Active            bool    `json:"active"`
	ConfirmedFlushLSN *string `json:"confirmed_flush_lsn"`
}

// History summarises the checkpoint history of the slot.
type History struct {
	Table  string        `json:"table"`
	Count  int64         `json:"count"`
	Oldest *HistoryEntry `json:"oldest"`
	Newest *HistoryEntry `json:"newest"`
}

// HistoryEntry is one row of the checkpoint history.
type HistoryEntry struct {
	LSN            string     `json:"lsn"`
	LastCommitTime *time.Time `json:"last_commit_time"`
	SavedAt        time.Time  `json:"saved_at"`
}

// Horizon is the retention horizon (checkpoint.Horizon): rows of
// transactions older than SnapshotXmin are delivered.
type Horizon struct {
	HistoryEntry
	SnapshotXmin uint64 `json:"snapshot_xmin"`
	SnapshotLSN  string `json:"snapshot_lsn"`
}

// CheckpointShow reports the slot's saved checkpoint, the slot's position,
// where a relay would resume, the checkpoint history and the retention
// horizon. A missing slot, checkpoint or history table is reported as
// absent, not as an error: the checkpoint outlives a dropped slot, and its
// value is what an operator needs to recreate one.
func CheckpointShow(ctx context.Context, q Querier, cfg Config) (*CheckpointReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &CheckpointReport{SlotName: cfg.Slot}
	var err error
	if r.CurrentWALLSN, r.CheckedAt, err = pgslot.ReadWAL(ctx, q); err != nil {
		return nil, err
	}
	switch sl, err := pgslot.Read(ctx, q, cfg.Slot); {
	case errors.Is(err, pgslot.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		r.Slot = &CheckpointSlot{Active: sl.Active, ConfirmedFlushLSN: sl.ConfirmedFlushLSN}
	}
	if r.Checkpoint, err = queryCheckpoint(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
		return nil, err
	}
	r.ResumeLSN = resumeLSN(r.Checkpoint, r.Slot)
	if r.History, err = queryHistory(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
		return nil, err
	}
	h, err := checkpoint.FindHorizon(ctx, q, cfg.CheckpointTable, cfg.Slot)
	var nh *checkpoint.NoHorizonError
	switch {
	case errors.As(err, &nh):
		r.NoHorizon = &nh.Reason
	case err != nil:
		return nil, err
	default:
		r.Horizon = &Horizon{
			HistoryEntry: HistoryEntry{LSN: h.Entry.LSN.String(), SavedAt: h.Entry.SavedAt},
			SnapshotXmin: h.Entry.SnapshotXmin, SnapshotLSN: h.Entry.SnapshotLSN.String(),
		}
		if !h.Entry.LastCommitTime.IsZero() {
			r.Horizon.LastCommitTime = &h.Entry.LastCommitTime
		}
	}
	return r, nil
}

// resumeLSN is where `run` starts without --start-lsn (checkpoint.Start):
// the later of the checkpoint and the slot's confirmed_flush_lsn.
func resumeLSN(cp *Checkpoint, sl *CheckpointSlot) *string {
	var best *string
	var bestLSN pglogrepl.LSN
	consider := func(s *string) {
		if s == nil {
			return
		}
		if v, err := pglogrepl.ParseLSN(*s); err == nil && (best == nil || v > bestLSN) {
			best, bestLSN = s, v
		}
	}
	if cp != nil {
		consider(&cp.LSN)
	}
	if sl != nil {
		consider(sl.ConfirmedFlushLSN)
	}
	return best
}

func queryHistory(ctx context.Context, q Querier, checkpointTable, slot string) (*History, error) {
	cp, err := sql.ParseTable(checkpointTable)
	if err != nil {
		return nil, err
	}
	name := sql.CheckpointHistoryName(cp)
	t, err := resolveTable(ctx, q, name.String())
	if err != nil || t == "" {
		return nil, err
	}
	h := &History{Table: name.String()}
	var (
		oLSN, nLSN       *string
		oCommit, nCommit *time.Time
		oSaved, nSaved   *time.Time
	)
	err = q.QueryRow(ctx, `SELECT (SELECT count(*) FROM `+t+` WHERE slot_name = $1),
       o.lsn::text, o.last_commit_time, o.saved_at, n.lsn::text, n.last_commit_time, n.saved_at
FROM (SELECT 1) x
LEFT JOIN LATERAL (SELECT * FROM `+t+` WHERE slot_name = $1 ORDER BY lsn LIMIT 1) o ON true
LEFT JOIN LATERAL (SELECT * FROM `+t+` WHERE slot_name = $1 ORDER BY lsn DESC LIMIT 1) n ON true`, slot).
		Scan(&h.Count, &oLSN, &oCommit, &oSaved, &nLSN, &nCommit, &nSaved)
	if err != nil {
		return nil, fmt.Errorf("read checkpoint history from %s: %w", t, err)
	}
	if oLSN != nil {
		h.Oldest = &HistoryEntry{LSN: *oLSN, LastCommitTime: oCommit, SavedAt: *oSaved}
		h.Newest = &HistoryEntry{LSN: *nLSN, LastCommitTime: nCommit, SavedAt: *nSaved}
	}
	return h, nil
}

// WriteText writes the report as an aligned two-column table for people.
func (r *CheckpointReport) WriteText(w io.Writer) error {
	tw := NewTable(w)
	row := tw.Row
	row("checked at", r.CheckedAt.UTC().Format(time.RFC3339))
	switch {
	case r.Slot == nil:
		row("slot", r.SlotName+" (does not exist: `outbox-relay setup` creates it)")
	case r.Slot.Active:
		row("slot", r.SlotName+" (active: a relay, or something else, streams it)")
	default:
		row("slot", r.SlotName+" (inactive)")
	}
	if c := r.Checkpoint; c != nil {
		row("checkpoint", c.LSN+"  saved "+timeAgo(c.SavedAt, r.CheckedAt))
		if c.LastCommitTime != nil {
			row("last commit", "the last delivered transaction committed "+timeAgo(c.LastCommitTime, r.CheckedAt))
		} else {
			row("last commit", "unknown")
		}
	} else {
		row("checkpoint", "none saved")
	}
	if r.Slot != nil {
		row("confirmed flush", orNA(r.Slot.ConfirmedFlushLSN))
	}
	if r.ResumeLSN != nil {
		row("resumes at", *r.ResumeLSN+"  (the later of the checkpoint and the slot's confirmed flush)")
	}
	row("current WAL", r.CurrentWALLSN)
	switch h := r.History; {
	case h == nil:
		row("history", "no history table: `outbox-relay setup` creates it (or a relay that may)")
	case h.Oldest == nil:
		row("history", fmt.Sprintf("no rows in %s for this slot", h.Table))
	default:
		row("history", fmt.Sprintf("%d rows in %s", h.Count, h.Table))
		row("  oldest", historyText(*h.Oldest))
		row("  newest", historyText(*h.Newest))
	}
	if hz := r.Horizon; hz != nil {
		row("retention horizon", fmt.Sprintf("%s: rows of transactions older than xid %d are delivered", historyText(hz.HistoryEntry), hz.SnapshotXmin))
	} else if r.NoHorizon != nil {
		row("retention horizon", "none: "+*r.NoHorizon)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write text: %w", err)
	}
	return nil
}

func historyText(e HistoryEntry) string {
	commit := "commit time unknown"
	if e.LastCommitTime != nil {
		commit = "committed " + e.LastCommitTime.UTC().Format(time.RFC3339)
	}
	return e.LSN + "  " + commit + ", saved " + e.SavedAt.UTC().Format(time.RFC3339)
}
