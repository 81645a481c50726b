package retention_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/sql"
)

const day = 24 * time.Hour

// partitionedEnv adds public.pobox, an outbox partitioned BY RANGE
// (created_at) with partitions relative to now (retention 7 days):
//
//	pobox_p1  [-30d, -20d)  due
//	pobox_p2  [-20d, -10d)  due
//	pobox_p3  [-10d,  -5d)  not due: its range ends after now() - 7d
//	pobox_p4  [ -5d, +30d)  recent
//	pobox_p5  [+30d, +60d)  created ahead, empty, not due
//	pobox_def DEFAULT       anything else (here: rows 400 days old)
func partitionedEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.exec(t, `CREATE TABLE pobox (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
  event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`)
	for i, r := range [][2]int{{-30, -20}, {-20, -10}, {-10, -5}, {-5, 30}, {30, 60}} {
		e.exec(t, fmt.Sprintf(`DO $$ BEGIN EXECUTE format('CREATE TABLE pobox_p%d PARTITION OF pobox FOR VALUES FROM (%%L) TO (%%L)',
  now() + make_interval(days => %d), now() + make_interval(days => %d)); END $$`, i+1, r[0], r[1]))
	}
	e.exec(t, `CREATE TABLE pobox_def PARTITION OF pobox DEFAULT`)
	return e
}

func (e *env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("exec %q: %v", q, err)
	}
}

// insertInto adds n rows created age ago to pobox (tuple routing picks the
// partition), committed at once.
func (e *env) insertInto(t *testing.T, n int, age time.Duration) {
	t.Helper()
	e.exec(t, `INSERT INTO pobox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT gen_random_uuid(), 'Order', 'o-' || i, 'Created', '{}', now() - make_interval(secs => $2)
FROM generate_series(1, $1) i`, n, age.Seconds())
}

// rowsIn counts the rows of one table (a partition, or a detached one).
func (e *env) rowsIn(t *testing.T, table string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

// partitionNames lists pobox's partitions.
func (e *env) partitionNames(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'pobox'::regclass ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	return names
}

func (e *env) tableExists(t *testing.T, name string) bool {
	t.Helper()
	var ok bool
	if err := e.pool.QueryRow(context.Background(), `SELECT to_regclass($1) IS NOT NULL`, name).Scan(&ok); err != nil {
		t.Fatal(err)
	}
	return ok
}

// fillPartitioned puts delivered rows in p1, p2, p3 and the default
// partition, then undelivered ones in p2 and the default partition, and
// recent ones in p4.
func fillPartitioned(t *testing.T, e *env) {
	t.Helper()
	e.insertInto(t, 4, 25*day)  // p1
	e.insertInto(t, 3, 15*day)  // p2
	e.insertInto(t, 2, 8*day)   // p3: older than the retention, but its partition is not due
	e.insertInto(t, 5, 400*day) // default
	e.coverAll(t)
	e.insertInto(t, 1, 15*day)  // p2: not covered
	e.insertInto(t, 1, 400*day) // default: not covered
	e.insertInto(t, 2, time.Hour)
	want := map[string]int{"pobox_p1": 4, "pobox_p2": 4, "pobox_p3": 2, "pobox_p4": 2, "pobox_p5": 0, "pobox_def": 6}
	for p, n := range want {
		if got := e.rowsIn(t, p); got != n {
			t.Fatalf("set-up: %s holds %d rows; want %d", p, got, n)
		}
	}
}

func partitionRound(t *testing.T, e *env, mode retention.PartitionMode, dryRun bool) retention.Result {
	t.Helper()
	return e.round(t, retention.Config{Table: "public.pobox", Retention: 7 * day, Partitions: mode, DryRun: dryRun, Pause: time.Millisecond})
}

func gone(res retention.Result) (gone []string, kept map[string]string) {
	kept = map[string]string{}
	for _, p := range res.Partitions {
		if p.Gone {
			gone = append(gone, p.Name)
		} else {
			kept[p.Name] = p.Kept
		}
	}
	return gone, kept
}

// TestPartitionDrop: a due partition whose rows are all delivered is
// dropped; a due one holding one undelivered row is kept whole; a partition
// not yet due, a partition created ahead and the default partition are
// never dropped; the default partition's delivered old rows are deleted.
// The dry run lists the same and changes nothing.
func TestPartitionDrop(t *testing.T) {
	e := partitionedEnv(t)
	fillPartitioned(t, e)

	res := partitionRound(t, e, retention.PartitionsDrop, true)
	g, kept := gone(res)
	if !slices.Equal(g, []string{"public.pobox_p1"}) || !strings.Contains(kept["public.pobox_p2"], "1 of its 4 rows are not known to be delivered") || len(kept) != 1 {
		t.Errorf("dry run partitions = %+v; want pobox_p1 would go, pobox_p2 kept for 1 undelivered row of 4, nothing else considered", res.Partitions)
	}
	if res.Deleted != 4+5 || res.Batches != 0 {
		t.Errorf("dry run = would delete %d rows in %d batches; want 9 (4 in pobox_p1, 5 in the default partition), no batch", res.Deleted, res.Batches)
	}
	if names := e.partitionNames(t); len(names) != 6 || e.rowsIn(t, "pobox") != 18 {
		t.Fatalf("after the dry run: partitions %v, %d rows; want all 6 and all 18 rows", names, e.rowsIn(t, "pobox"))
	}

	var reported int64
	res = e.round(t, retention.Config{Table: "public.pobox", Retention: 7 * day, Partitions: retention.PartitionsDrop, Pause: time.Millisecond,
		Deleted: func(n int64) { reported += n }})
	g, kept = gone(res)
	if !slices.Equal(g, []string{"public.pobox_p1"}) || len(kept) != 1 || kept["public.pobox_p2"] == "" {
		t.Errorf("round partitions = %+v; want pobox_p1 dropped, pobox_p2 kept", res.Partitions)
	}
	// The default partition's undelivered row is 400 days old.
	if res.Overdue < 392*day || res.Overdue > 394*day {
		t.Errorf("round overdue = %s; want about 393 days (the default partition's undelivered row)", res.Overdue)
	}
	if res.Deleted != 9 || reported != 9 {
		t.Errorf("round deleted %d (reported %d); want 9: pobox_p1's 4 rows and 5 of the default partition", res.Deleted, reported)
	}
	if e.tableExists(t, "pobox_p1") {
		t.Errorf("pobox_p1 still exists; want it dropped")
	}
	want := map[string]int{"pobox_p2": 4, "pobox_p3": 2, "pobox_p4": 2, "pobox_p5": 0, "pobox_def": 1}
	for p, n := range want {
		if got := e.rowsIn(t, p); got != n {
			t.Errorf("after the round %s holds %d rows; want %d", p, got, n)
		}
	}
	if names := e.partitionNames(t); !slices.Equal(names, []string{"pobox_def", "pobox_p2", "pobox_p3", "pobox_p4", "pobox_p5"}) {
		t.Errorf("partitions after the round = %v; want all but pobox_p1", names)
	}

	// Once the checkpoint covers the last row of pobox_p2, it goes too.
	e.coverAll(t)
	res = partitionRound(t, e, retention.PartitionsDrop, false)
	if g, _ := gone(res); !slices.Equal(g, []string{"public.pobox_p2"}) || e.tableExists(t, "pobox_p2") || e.rowsIn(t, "pobox_def") != 0 {
		t.Errorf("round once covered: partitions %+v, default rows %d; want pobox_p2 dropped and the default partition emptied", res.Partitions, e.rowsIn(t, "pobox_def"))
	}
	// pobox_p3's rows are 8 days old, but its range is not yet 7 days past:
	// not overdue (retention_lag_seconds would otherwise alert on every
	// partition's oldest rows).
	if res.Overdue != 0 || res.OldestExpired != nil {
		t.Errorf("round once covered: overdue %s (oldest %v); want 0: nothing left that a partition round removes now", res.Overdue, res.OldestExpired)
	}
}

// TestPartitionDetach: detach leaves the partition, rows and all, as a
// table of its own.
func TestPartitionDetach(t *testing.T) {
	e := partitionedEnv(t)
	fillPartitioned(t, e)
	res := partitionRound(t, e, retention.PartitionsDetach, false)
	if g, _ := gone(res); !slices.Equal(g, []string{"public.pobox_p1"}) {
		t.Errorf("round partitions = %+v; want pobox_p1 detached", res.Partitions)
	}
	if names := e.partitionNames(t); slices.Contains(names, "pobox_p1") || !slices.Contains(names, "pobox_p2") {
		t.Errorf("partitions after detach = %v; want pobox_p1 gone from them, pobox_p2 kept", names)
	}
	if n := e.rowsIn(t, "pobox_p1"); n != 4 {
		t.Errorf("detached pobox_p1 holds %d rows; want its 4 rows kept", n)
	}
	if n := e.rowsIn(t, "pobox"); n != 18-4-5 {
		t.Errorf("outbox rows after detach = %d; want %d", n, 18-4-5)
	}
}

// TestPartitionRowDelete: row deletion through a partitioned outbox deletes
// exactly the rows the rule allows. Every partition's first row has ctid
// (0,1): a DELETE by ctid alone through the parent deletes them all.
func TestPartitionRowDelete(t *testing.T) {
	e := partitionedEnv(t)
	fillPartitioned(t, e)
	res := partitionRound(t, e, retention.PartitionsDelete, false)
	if res.Deleted != 4+3+2+5 || len(res.Partitions) != 0 {
		t.Errorf("row delete = %d rows, partitions %+v; want 14 (every covered row older than 7d), no partition removed", res.Deleted, res.Partitions)
	}
	want := map[string]int{"pobox_p1": 0, "pobox_p2": 1, "pobox_p3": 0, "pobox_p4": 2, "pobox_def": 1}
	for p, n := range want {
		if got := e.rowsIn(t, p); got != n {
			t.Errorf("after the round %s holds %d rows; want %d", p, got, n)
		}
	}
	if names := e.partitionNames(t); len(names) != 6 {
		t.Errorf("partitions after row delete = %v; want all 6", names)
	}
}

// TestPartitionDropWaitsForWriters: an insert into a due partition still in
// progress (its row invisible to the round) keeps the partition: the round
// cannot lock it within the lock timeout.
func TestPartitionDropWaitsForWriters(t *testing.T) {
	ctx := context.Background()
	e := partitionedEnv(t)
	fillPartitioned(t, e)
	e.coverAll(t)
	tx := e.openInsert(t, "pobox", "late", "25 days")
	start := time.Now()
	res := partitionRound(t, e, retention.PartitionsDrop, false)
	_, kept := gone(res)
	if !strings.Contains(kept["public.pobox_p1"], "lock was not obtained") || !e.tableExists(t, "pobox_p1") {
		t.Errorf("round with an insert into pobox_p1 in progress: partitions %+v; want pobox_p1 kept, its lock not obtained", res.Partitions)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("round took %s; want it bounded by the lock timeout", took)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed but not covered: still kept, now for that row.
	res = partitionRound(t, e, retention.PartitionsDrop, false)
	if _, kept := gone(res); !strings.Contains(kept["public.pobox_p1"], "1 of its 5 rows") {
		t.Errorf("round after the insert committed: partitions %+v; want pobox_p1 kept for 1 undelivered row of 5", res.Partitions)
	}
}

func TestCheckPartitions(t *testing.T) {
	ctx := context.Background()
	e := partitionedEnv(t)
	e.exec(t, `CREATE TABLE hashed (id int, created_at timestamptz) PARTITION BY HASH (id)`)
	tests := []struct {
		table string
		mode  retention.PartitionMode
		want  string // "" for nil
	}{
		{"public.pobox", retention.PartitionsDrop, ""},
		{"public.pobox", retention.PartitionsDetach, ""},
		{"public.outbox", retention.PartitionsDelete, ""},
		{"public.outbox", retention.PartitionsDrop, "Partitions: drop, but the outbox table public.outbox is not partitioned: set Partitions to delete"},
		{"public.hashed", retention.PartitionsDetach, "not partitioned BY RANGE (created_at) alone"},
	}
	for _, tt := range tests {
		err := retention.CheckPartitions(ctx, e.pool, tt.table, tt.mode)
		if (tt.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("CheckPartitions(%s, %s) = %v; want %q", tt.table, tt.mode, err, tt.want)
		}
	}
	// A round in drop mode on a table it cannot work on fails, saying why.
	e.coverAll(t)
	_, err := retention.Round(ctx, e.pool, retention.Config{Slot: slot, Table: "public.outbox", Retention: time.Hour, Partitions: retention.PartitionsDrop})
	if err == nil || !strings.Contains(err.Error(), "is not partitioned") {
		t.Errorf("Round(drop) on a plain outbox = %v; want an error saying it is not partitioned", err)
	}
	cfg := retention.Config{Slot: slot, Retention: time.Hour, Partitions: "truncate"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `Partitions: "truncate" is not one of delete`) {
		t.Errorf("Validate(Partitions: truncate) = %v; want an error naming the values", err)
	}
}

// TestPartitionDropWaitsForOtherSlots: a due partition whose rows this slot
// delivered but another slot has not passed is kept, naming that slot;
// once the slot passes them, it is dropped.
func TestPartitionDropWaitsForOtherSlots(t *testing.T) {
	e := partitionedEnv(t)
	e.insertInto(t, 2, 25*day) // p1: delivered by this slot only
	e.coverAll(t)
	other := testenv.UniqueName(t, "pto")
	e.exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other)
	e.insertInto(t, 3, 15*day) // p2: committed after the other slot's start
	e.coverAll(t)

	res := partitionRound(t, e, retention.PartitionsDrop, false)
	gonePs, kept := gone(res)
	if !slices.Equal(gonePs, []string{"public.pobox_p1"}) || !strings.Contains(kept["public.pobox_p2"], strconv.Quote(other)) || e.rowsIn(t, "pobox_p2") != 3 {
		t.Fatalf("round with slot %s behind p2's rows: gone %v, kept %v, p2 rows %d; want p1 dropped, p2 kept naming the slot",
			other, gonePs, kept, e.rowsIn(t, "pobox_p2"))
	}
	e.exec(t, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, other)
	e.coverAll(t)
	res = partitionRound(t, e, retention.PartitionsDrop, false)
	if gonePs, kept := gone(res); !slices.Equal(gonePs, []string{"public.pobox_p2"}) || e.tableExists(t, "pobox_p2") {
		t.Errorf("round once slot %s passed p2's rows: gone %v, kept %v; want p2 dropped", other, gonePs, kept)
	}
}

// TestPartitionDropWaitsForBuffer: a partition holding rows of a
// transaction whose events the relay's WAL buffer still holds is not
// dropped, whatever its age, until the buffer is delivered.
func TestPartitionDropWaitsForBuffer(t *testing.T) {
	e := partitionedEnv(t)
	buf := sql.WALBufferTable(sql.Table{Name: sql.DefaultRetryTable})
	for _, s := range walbuffer.CreateTable(buf) {
		e.exec(t, s)
	}
	e.insertInto(t, 2, 25*day) // p1: delivered
	e.coverAll(t)
	held := e.wal(t)
	e.insertInto(t, 3, 15*day) // p2: its events in the buffer
	e.exec(t, `INSERT INTO `+buf.Quoted()+` (slot_name, commit_lsn, pos, event) VALUES ($1, $2::pg_lsn, 1, '\x01')`, slot, (held + 1).String())
	e.coverAll(t)

	round := func() retention.Result {
		return e.round(t, retention.Config{Table: "public.pobox", Retention: 7 * day, Partitions: retention.PartitionsDrop,
			Pause: time.Millisecond, BufferTable: buf.String()})
	}
	gonePs, kept := gone(round())
	if !slices.Equal(gonePs, []string{"public.pobox_p1"}) || !strings.Contains(kept["public.pobox_p2"], "WAL buffer") || e.rowsIn(t, "pobox_p2") != 3 {
		t.Fatalf("round with p2's events in the WAL buffer: gone %v, kept %v, p2 rows %d; want p1 dropped, p2 kept for the WAL buffer",
			gonePs, kept, e.rowsIn(t, "pobox_p2"))
	}
	e.exec(t, `DELETE FROM `+buf.Quoted())
	if gonePs, kept := gone(round()); !slices.Equal(gonePs, []string{"public.pobox_p2"}) || e.tableExists(t, "pobox_p2") {
		t.Errorf("round once the buffer was delivered: gone %v, kept %v; want p2 dropped", gonePs, kept)
	}
}
