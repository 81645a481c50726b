package sql_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/sql"
)

func TestCheckpointHistoryName(t *testing.T) {
	long := strings.Repeat("c", 60)
	tests := []struct {
		in   sql.Table
		want sql.Table
	}{
		{sql.Table{Name: sql.DefaultCheckpointTable}, sql.Table{Name: sql.DefaultCheckpointHistoryTable}},
		{sql.Table{Schema: "My App", Name: "relay checkpoint"}, sql.Table{Schema: "My App", Name: "relay checkpoint_history"}},
		// PostgreSQL would truncate the name to 63 bytes with a NOTICE; the
		// builder does it itself so that every caller finds the same table.
		{sql.Table{Name: long}, sql.Table{Name: long[:55] + "_history"}},
	}
	for _, tt := range tests {
		if got := sql.CheckpointHistoryName(tt.in); got != tt.want {
			t.Errorf("CheckpointHistoryName(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestCheckpointHistoryTable creates the history table under awkward names,
// twice, and writes a row as the relay does.
func TestCheckpointHistoryTable(t *testing.T) {
	ctx := context.Background()
	conn := connect(t, newDatabase(t))
	if _, err := conn.Exec(ctx, `CREATE SCHEMA "My App"`); err != nil {
		t.Fatal(err)
	}
	cp := sql.Table{Schema: "My App", Name: `relay "checkpoint"`}
	for range 2 {
		for _, s := range sql.CheckpointHistoryTable(cp) {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}
	h := sql.CheckpointHistoryName(cp).Quoted()
	for range 2 { // the second is a conflict: nothing happens
		if _, err := conn.Exec(ctx, `INSERT INTO `+h+` (slot_name, lsn, last_commit_time, saved_at, snapshot_xmin, snapshot_lsn)
VALUES ($1, $2::text::pg_lsn, NULL, now(), pg_snapshot_xmin(pg_current_snapshot()), pg_current_wal_insert_lsn())
ON CONFLICT DO NOTHING`, "s", "0/16B3748"); err != nil {
			t.Fatalf("insert a history row: %v", err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM `+h+` WHERE snapshot_lsn > lsn`).Scan(&n); err != nil || n != 1 {
		t.Errorf("history rows with snapshot_lsn past their lsn = %d, %v; want 1", n, err)
	}
	got := catalog(t, conn)
	for _, want := range []string{
		`column My App.relay "checkpoint"_history.snapshot_lsn pg_lsn not_null=t default=`,
		`column My App.relay "checkpoint"_history.saved_at timestamp with time zone not_null=t default=now()`,
	} {
		if !slices.Contains(got, want) {
			t.Errorf("catalog lacks %q; has:\n%s", want, strings.Join(got, "\n"))
		}
	}
}
