package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/sql"
)

func (f *fixture) checkpointShow(t *testing.T) *ops.CheckpointReport {
	t.Helper()
	r, err := ops.CheckpointShow(context.Background(), f.conn, f.cfg)
	if err != nil {
		t.Fatalf("CheckpointShow: %v", err)
	}
	return r
}

func TestCheckpointShow(t *testing.T) {
	f := newFixture(t)
	r := f.checkpointShow(t)
	if r.Checkpoint != nil || r.History != nil || r.Horizon != nil || r.Slot == nil || r.Slot.Active ||
		r.ResumeLSN == nil || *r.ResumeLSN != *r.Slot.ConfirmedFlushLSN ||
		r.NoHorizon == nil || !strings.Contains(*r.NoHorizon, "history table") {
		t.Errorf("CheckpointShow on a fresh slot = %+v; want no checkpoint, no history, resume at the slot, no horizon for want of a history table", r)
	}
	golden(t, "checkpoint_fresh.json", normalisedJSON(t, r))

	cp := sql.Table{Schema: f.schema, Name: "outbox_relay_checkpoint"}
	for _, s := range sql.CheckpointHistoryTable(cp) {
		f.exec(t, s)
	}
	hist := f.table("outbox_relay_checkpoint_history")
	record := func(lsn string, commit bool) {
		t.Helper()
		f.exec(t, `INSERT INTO `+hist+` (slot_name, lsn, last_commit_time, saved_at, snapshot_xmin, snapshot_lsn)
VALUES ($1, $2::pg_lsn, CASE WHEN $3 THEN now() END, now(), pg_snapshot_xmin(pg_current_snapshot()), pg_current_wal_insert_lsn())`,
			f.cfg.Slot, lsn, commit)
	}
	record("0/100", true)
	record("0/200", false)
	f.exec(t, `INSERT INTO `+f.table("outbox_relay_checkpoint")+` (slot_name, lsn, last_commit_time) VALUES ($1, 'FF/0', now())`, f.cfg.Slot)
	r = f.checkpointShow(t)
	if r.Checkpoint == nil || r.Checkpoint.LSN != "FF/0" || r.ResumeLSN == nil || *r.ResumeLSN != "FF/0" {
		t.Errorf("CheckpointShow with a checkpoint ahead of the slot: checkpoint %+v, resume %v; want FF/0 both", r.Checkpoint, r.ResumeLSN)
	}
	if h := r.History; h == nil || h.Count != 2 || h.Oldest.LSN != "0/100" || h.Oldest.LastCommitTime == nil ||
		h.Newest.LSN != "0/200" || h.Newest.LastCommitTime != nil || h.Table != f.schema+".outbox_relay_checkpoint_history" {
		t.Errorf("History = %+v; want 2 rows, 0/100 (with a commit time) to 0/200 (without)", h)
	}
	if hz := r.Horizon; hz == nil || hz.LSN != "0/200" || hz.SnapshotXmin == 0 || r.NoHorizon != nil {
		t.Errorf("Horizon = %+v (missing: %v); want the newest row, 0/200", hz, r.NoHorizon)
	}
	golden(t, "checkpoint_show.json", normalisedJSON(t, r))
}

func TestCheckpointShowText(t *testing.T) {
	commit := now.Add(-time.Hour)
	r := &ops.CheckpointReport{
		SlotName: "outbox_relay", CheckedAt: now, Checkpoint: checkpoint,
		Slot:      &ops.CheckpointSlot{ConfirmedFlushLSN: ptr("0/4F00000")},
		ResumeLSN: ptr("0/5000000"), CurrentWALLSN: "0/6000000",
		History: &ops.History{Table: "outbox_relay_checkpoint_history", Count: 1440,
			Oldest: &ops.HistoryEntry{LSN: "0/100000", LastCommitTime: &commit, SavedAt: now.Add(-24 * time.Hour)},
			Newest: &ops.HistoryEntry{LSN: "0/5000000", SavedAt: now.Add(-time.Minute)}},
		Horizon: &ops.Horizon{HistoryEntry: ops.HistoryEntry{LSN: "0/4E00000", LastCommitTime: &commit, SavedAt: now.Add(-2 * time.Minute)},
			SnapshotXmin: 4711, SnapshotLSN: "0/4E00100"},
	}
	var b strings.Builder
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "checkpoint_show.txt", []byte(b.String()))

	none := &ops.CheckpointReport{SlotName: "outbox_relay", CheckedAt: now, CurrentWALLSN: "0/6000000",
		NoHorizon: ptr("no checkpoint is saved for it and the slot does not exist: nothing is known to be delivered")}
	b.Reset()
	if err := none.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	golden(t, "checkpoint_none.txt", []byte(b.String()))
}
