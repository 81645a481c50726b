package checkpoint_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// historyStore is a Store on a fresh database with the checkpoint table;
// MigrateHistory creates the history table, as the relay does at start.
func historyStore(t *testing.T) (*checkpoint.Store, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	if _, err := pool.Exec(ctx, sql.CheckpointTable(sql.Table{Name: sql.DefaultCheckpointTable})); err != nil {
		t.Fatalf("create checkpoint table: %v", err)
	}
	s := checkpoint.New(pool, sql.DefaultCheckpointTable)
	for range 2 { // the second finds both and does nothing
		if err := s.MigrateHistory(ctx); err != nil {
			t.Fatalf("MigrateHistory: %v", err)
		}
	}
	return s, pool
}

func currentWAL(t *testing.T, pool *pgxpool.Pool) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

func TestRecordAndPruneHistory(t *testing.T) {
	ctx := context.Background()
	s, pool := historyStore(t)
	if got, want := s.HistoryTable(), sql.DefaultCheckpointHistoryTable; got != want {
		t.Errorf("HistoryTable() = %q; want %q", got, want)
	}
	commit := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	before := currentWAL(t, pool)
	for i := range 5 {
		if err := s.Record(ctx, "s1", pglogrepl.LSN(0x100+i), commit.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatalf("Record: %v", err)
		}
	}
	if err := s.Record(ctx, "s1", 0x100, time.Time{}); err != nil { // recorded already: nothing changes
		t.Fatalf("Record again: %v", err)
	}
	if err := s.Record(ctx, "s2", 0x100, time.Time{}); err != nil {
		t.Fatalf("Record s2: %v", err)
	}
	var n int
	var minSnap string
	if err := pool.QueryRow(ctx, `SELECT count(*), min(snapshot_lsn)::text FROM outbox_relay_checkpoint_history
WHERE slot_name = 's1' AND last_commit_time IS NOT NULL`).Scan(&n, &minSnap); err != nil {
		t.Fatal(err)
	}
	if snap, _ := pglogrepl.ParseLSN(minSnap); n != 5 || snap < before {
		t.Errorf("history of s1: %d rows, oldest snapshot_lsn %s; want 5 rows, snapshots at or after %s", n, minSnap, before)
	}

	// Age the rows: all but the newest of s1 go, s2's stay.
	if _, err := pool.Exec(ctx, `UPDATE outbox_relay_checkpoint_history SET saved_at = now() - interval '2 days'`); err != nil {
		t.Fatal(err)
	}
	deleted, err := s.PruneHistory(ctx, "s1", 24*time.Hour, 2)
	if err != nil || deleted != 4 {
		t.Errorf("PruneHistory(s1, 24h, batch 2) = %d, %v; want 4 deleted (the newest kept)", deleted, err)
	}
	var left string
	if err := pool.QueryRow(ctx, `SELECT string_agg(slot_name || ' ' || lsn::text, ',' ORDER BY slot_name, lsn)
FROM outbox_relay_checkpoint_history`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if want := "s1 0/104,s2 0/100"; left != want {
		t.Errorf("history after pruning s1 = %q; want %q", left, want)
	}
}

func TestSkip(t *testing.T) {
	ctx := context.Background()
	s, _ := historyStore(t)
	commit := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	if moved, err := s.Skip(ctx, "fresh", 0x500); err != nil || !moved {
		t.Errorf("Skip with nothing saved = %v, %v; want moved", moved, err)
	}
	if err := s.Save(ctx, "s", 0x200, commit); err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		lsn   pglogrepl.LSN
		moved bool
		want  pglogrepl.LSN
	}{{0x100, false, 0x200}, {0x200, false, 0x200}, {0x300, true, 0x300}} {
		moved, err := s.Skip(ctx, "s", st.lsn)
		got, lerr := s.Load(ctx, "s")
		if err != nil || lerr != nil || moved != st.moved || got.LSN != st.want {
			t.Errorf("Skip(%s) = %v, %v; checkpoint %s, %v; want moved %v, checkpoint %s", st.lsn, moved, err, got.LSN, lerr, st.moved, st.want)
		}
		// The last delivered transaction is still the last delivered one.
		if !got.LastCommitTime.Equal(commit) {
			t.Errorf("after Skip(%s): LastCommitTime = %s; want %s (kept)", st.lsn, got.LastCommitTime, commit)
		}
	}
}

// TestHorizon walks a slot from "nothing saved" to a horizon, and checks the
// property retention rests on: a history row written while a transaction is
// open has a snapshot_xmin at or below that transaction's xid, and a row
// written after it committed has one above.
func TestHorizon(t *testing.T) {
	ctx := context.Background()
	s, pool := historyStore(t)
	noHorizon := func(want string) {
		t.Helper()
		h, err := checkpoint.FindHorizon(ctx, pool, sql.DefaultCheckpointTable, "s")
		if !checkpoint.IsNoHorizon(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("FindHorizon = %+v, %v; want a NoHorizonError saying %q", h, err, want)
		}
	}
	noHorizon("no checkpoint is saved for it and the slot does not exist")
	if err := s.Save(ctx, "s", 0x100, time.Time{}); err != nil {
		t.Fatal(err)
	}
	noHorizon("no history row")

	// A transaction that stays open across history rows.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var xidText string
	if err := tx.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&xidText); err != nil {
		t.Fatal(err)
	}
	xid, _ := strconv.ParseUint(xidText, 10, 64)
	if err := s.Record(ctx, "s", 0x100, time.Time{}); err != nil {
		t.Fatal(err)
	}
	// The row's snapshot_lsn is beyond the checkpoint: not yet a horizon.
	noHorizon("has a snapshot_lsn the checkpoint (0/100) has reached")
	if err := s.Save(ctx, "s", currentWAL(t, pool), time.Time{}); err != nil {
		t.Fatal(err)
	}
	h, err := checkpoint.FindHorizon(ctx, pool, sql.DefaultCheckpointTable, "s")
	if err != nil {
		t.Fatalf("FindHorizon: %v", err)
	}
	if h.Entry.LSN != 0x100 || h.Entry.SnapshotXmin > xid || h.Age < 1 || h.Age > checkpoint.MaxHorizonAge {
		t.Errorf("horizon while xid %d is open = %+v; want the row at 0/100 with snapshot_xmin <= %d", xid, h, xid)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// snapshot_xmin is the oldest transaction running on the whole server:
	// other tests' transactions may hold it back for a while.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if err := s.Record(ctx, "s", currentWAL(t, pool), time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := s.Save(ctx, "s", currentWAL(t, pool), time.Time{}); err != nil {
			t.Fatal(err)
		}
		h, err = checkpoint.FindHorizon(ctx, pool, sql.DefaultCheckpointTable, "s")
		if err == nil && h.Entry.SnapshotXmin > xid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("horizon after xid %d committed = %+v, %v; want snapshot_xmin > %d within a minute", xid, h, err, xid)
		}
	}

	// Without a history table there is no horizon, and the error says how
	// to get one.
	if _, err := pool.Exec(ctx, `DROP TABLE outbox_relay_checkpoint_history`); err != nil {
		t.Fatal(err)
	}
	noHorizon("create it (sql/002_relay.sql)")
}
