package retention_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/sql"
)

const slot = "retention_test" // no such slot: the checkpoint table alone covers

// env is a database with the outbox, checkpoint and history tables, and
// helpers that play the relay's part: record a history row, save a
// checkpoint that covers everything committed so far.
type env struct {
	pool  *pgxpool.Pool
	store *checkpoint.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	pg := testenv.Postgres(t)
	outbox := sql.Table{Schema: "public", Name: "outbox"}
	for _, s := range sql.OutboxTable(outbox, sql.Columns{}, sql.LayoutRelay) {
		pg.Exec(t, s)
	}
	cp := sql.Table{Name: sql.DefaultCheckpointTable}
	pg.Exec(t, sql.CheckpointTable(cp))
	for _, s := range sql.CheckpointHistoryTable(cp) {
		pg.Exec(t, s)
	}
	pool := pg.Pool(t)
	return &env{pool: pool, store: checkpoint.New(pool, sql.DefaultCheckpointTable)}
}

// insert adds n rows created age ago, committed at once.
func (e *env) insert(t *testing.T, n int, age time.Duration) {
	t.Helper()
	_, err := e.pool.Exec(context.Background(), `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT gen_random_uuid(), 'Order', 'o-' || i, 'Created', '{}', now() - make_interval(secs => $2)
FROM generate_series(1, $1) i`, n, age.Seconds())
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
}

// openInsert inserts a row of aggregate id into table, created age (an SQL
// interval) ago, in a transaction it leaves open; the test commits it or it
// is rolled back when the test ends.
func (e *env) openInsert(t *testing.T, table, id, age string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, `INSERT INTO `+table+` (id, aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES (gen_random_uuid(), 'Order', $1, 'Created', '{}', now() - $2::interval)`, id, age); err != nil {
		t.Fatal(err)
	}
	return tx
}

func (e *env) wal(t *testing.T) pglogrepl.LSN {
	t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(), `SELECT pg_current_wal_insert_lsn()::text`).Scan(&s); err != nil {
		t.Fatal(err)
	}
	lsn, _ := pglogrepl.ParseLSN(s)
	return lsn
}

// checkpointNow records a history row and then saves a checkpoint past its
// snapshot: what a relay does over two saves once everything committed so
// far is delivered.
func (e *env) checkpointNow(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := e.store.Record(ctx, slot, e.wal(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := e.store.Save(ctx, slot, e.wal(t), time.Now()); err != nil {
		t.Fatal(err)
	}
}

// coverAll makes the checkpoint cover every transaction committed so far.
// snapshot_xmin is the oldest transaction running on the whole server, and
// other tests share it: record and save until a history row's snapshot is
// past a transaction started now.
func (e *env) coverAll(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	var x string
	if err := e.pool.QueryRow(ctx, `SELECT pg_current_xact_id()::text`).Scan(&x); err != nil {
		t.Fatal(err)
	}
	want, _ := strconv.ParseUint(x, 10, 64)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		e.checkpointNow(t)
		h, err := checkpoint.FindHorizon(ctx, e.pool, sql.DefaultCheckpointTable, slot)
		if err == nil && h.Entry.SnapshotXmin > want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no horizon past xid %d within a minute (a transaction left open on the server?): %+v, %v", want, h, err)
		}
	}
}

func (e *env) count(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) round(t *testing.T, cfg retention.Config) retention.Result {
	t.Helper()
	cfg.Slot = slot
	if cfg.Retention == 0 {
		cfg.Retention = time.Hour
	}
	res, err := retention.Round(context.Background(), e.pool, cfg)
	if err != nil {
		t.Fatalf("Round: %v", err)
	}
	return res
}

// TestRoundDeletesCoveredExpiredRows: expired rows go once a checkpoint
// covers them, in batches of the batch size; recent rows stay.
func TestRoundDeletesCoveredExpiredRows(t *testing.T) {
	e := newEnv(t)
	e.insert(t, 25, 2*time.Hour)
	e.insert(t, 3, time.Minute)

	res := e.round(t, retention.Config{})
	if res.Deleted != 0 || res.Horizon != nil || !strings.Contains(res.NoHorizon, "no checkpoint is saved") {
		t.Errorf("Round before any checkpoint = %+v; want nothing deleted, saying no checkpoint is saved", res)
	}
	if res.OldestExpired == nil || res.Overdue < 59*time.Minute || res.Overdue > 61*time.Minute {
		t.Errorf("Round before any checkpoint: overdue %s (oldest %v); want about 1h", res.Overdue, res.OldestExpired)
	}

	e.coverAll(t)
	var batches []int64
	res = e.round(t, retention.Config{BatchSize: 10, Pause: time.Millisecond, Deleted: func(n int64) { batches = append(batches, n) }})
	if res.Deleted != 25 || res.Batches != 3 || len(batches) != 3 || batches[0] != 10 || batches[1] != 10 || batches[2] != 5 {
		t.Errorf("Round = deleted %d in %d batches %v; want 25 in batches of 10, 10, 5", res.Deleted, res.Batches, batches)
	}
	if res.Horizon == nil || res.OldestExpired != nil || res.Overdue != 0 {
		t.Errorf("Round = %+v; want a horizon and nothing overdue left", res)
	}
	if n := e.count(t); n != 3 {
		t.Errorf("rows left = %d; want the 3 recent ones", n)
	}

	// A batch that deletes exactly the batch size is followed by one more,
	// which finds nothing.
	e.insert(t, 10, 2*time.Hour)
	e.coverAll(t)
	res = e.round(t, retention.Config{BatchSize: 10, Pause: time.Millisecond})
	if res.Deleted != 10 || res.Batches != 2 {
		t.Errorf("Round of exactly one batch = deleted %d in %d batches; want 10 in 2", res.Deleted, res.Batches)
	}
}

// TestRoundKeepsUncoveredRows: an expired row inserted after the horizon's
// snapshot, or by a transaction that stayed open across it, stays until a
// later history row is covered by the checkpoint.
func TestRoundKeepsUncoveredRows(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.checkpointNow(t)

	// A long transaction: its row's created_at is old when it commits.
	tx := e.openInsert(t, "outbox", "long", "3 hours")
	// Many checkpoints and rounds while it is open. The rows committed
	// meanwhile are newer than it, and are held back with it: the horizon
	// cannot pass the oldest transaction still running.
	for range 5 {
		e.insert(t, 2, 2*time.Hour)
		e.checkpointNow(t)
		if res := e.round(t, retention.Config{}); res.Deleted != 0 || res.Horizon == nil {
			t.Fatalf("Round while a transaction is open = %+v; want a horizon and nothing deleted", res)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	// Committed, and even saved past (as if delivered): but the newest
	// covered history row was written while it was open.
	if err := e.store.Save(ctx, slot, e.wal(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	res := e.round(t, retention.Config{})
	if n := e.count(t); n != 11 || res.Deleted != 0 {
		t.Fatalf("after the long transaction committed: %d rows left, %d deleted; want its row and the 10 after it kept", n, res.Deleted)
	}
	// A history row written now, not yet covered: still kept.
	if err := e.store.Record(ctx, slot, e.wal(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	if res := e.round(t, retention.Config{}); res.Deleted != 0 {
		t.Fatalf("with the newest history row not covered: deleted %d; want 0", res.Deleted)
	}
	// Covered: gone.
	e.coverAll(t)
	if res := e.round(t, retention.Config{}); res.Deleted != 11 || e.count(t) != 0 {
		t.Fatalf("once covered: deleted %d, %d left; want all 11 deleted", res.Deleted, e.count(t))
	}
}

// TestRoundFrozenRows: VACUUM FREEZE keeps a row's xmin, so a frozen row is
// judged as before: covered ones go, uncovered ones stay.
func TestRoundFrozenRows(t *testing.T) {
	e := newEnv(t)
	e.insert(t, 4, 2*time.Hour)
	e.coverAll(t)
	e.insert(t, 3, 2*time.Hour) // after the horizon's snapshot
	if _, err := e.pool.Exec(context.Background(), `VACUUM (FREEZE) outbox`); err != nil {
		t.Fatal(err)
	}
	var frozen int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox WHERE age(xmin) < 1000`).Scan(&frozen); err != nil || frozen != 7 {
		t.Fatalf("rows with a recent xmin after VACUUM FREEZE = %d, %v; want 7 (the raw xmin kept)", frozen, err)
	}
	if res := e.round(t, retention.Config{}); res.Deleted != 4 || e.count(t) != 3 {
		t.Errorf("Round over frozen rows: deleted %d, %d left; want the 4 covered deleted, 3 kept", res.Deleted, e.count(t))
	}
}

// TestDryRun counts what a round would delete and deletes nothing.
func TestDryRun(t *testing.T) {
	e := newEnv(t)
	e.insert(t, 12, 2*time.Hour)
	e.insert(t, 2, time.Minute)
	e.coverAll(t)
	e.insert(t, 5, 2*time.Hour) // not covered
	res := e.round(t, retention.Config{DryRun: true, BatchSize: 5})
	if res.Deleted != 12 || res.Batches != 0 || e.count(t) != 19 {
		t.Errorf("dry run = would delete %d in %d batches, %d rows left; want 12 counted, none deleted", res.Deleted, res.Batches, e.count(t))
	}
	if res := e.round(t, retention.Config{BatchSize: 5}); res.Deleted != 12 {
		t.Errorf("real round after the dry run deleted %d; want the 12 the dry run counted", res.Deleted)
	}
}

func TestCheckTable(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	if err := retention.CheckTable(ctx, e.pool, "public.outbox"); err != nil {
		t.Errorf("CheckTable(public.outbox) = %v; want nil", err)
	}
	if _, err := e.pool.Exec(ctx, `CREATE TABLE plain (id uuid PRIMARY KEY, payload jsonb)`); err != nil {
		t.Fatal(err)
	}
	for table, want := range map[string]string{
		"public.plain":   `has no "created_at" column`,
		"public.missing": "does not exist",
	} {
		if err := retention.CheckTable(ctx, e.pool, table); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("CheckTable(%s) = %v; want an error saying %q", table, err, want)
		}
	}
}

// TestRoundWaitsForOtherSlots: another logical slot of the database (a
// second relay, Debezium beside it) may read the outbox too; rows it has
// not passed stay, whatever this slot's checkpoint covers, until it passes
// them or is listed in IgnoreSlots. A checkpoint row of another relay
// whose slot is gone (lost, awaiting a refill) keeps them as well.
func TestRoundWaitsForOtherSlots(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	other := testenv.UniqueName(t, "rto")
	if _, err := e.pool.Exec(ctx, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, other); err != nil {
		t.Fatal(err)
	}
	e.insert(t, 10, 2*time.Hour)
	e.coverAll(t)

	// Behind every history row: nothing may go.
	res := e.round(t, retention.Config{DryRun: true})
	if res.Deleted != 0 || res.NoHorizonKind != retention.HeldBySlot || res.KeptForReaders != 10 ||
		!strings.Contains(res.NoHorizon, strconv.Quote(other)) || !strings.Contains(res.NoHorizon, "outbox.retention_ignore_slots") {
		t.Errorf("dry run with slot %s behind all history = would delete %d, kept %d for it, %s %q; want 0, 10 kept, naming the slot and outbox.retention_ignore_slots",
			other, res.Deleted, res.KeptForReaders, res.NoHorizonKind, res.NoHorizon)
	}
	if res := e.round(t, retention.Config{}); res.Deleted != 0 || e.count(t) != 10 || len(res.HeldBy) != 1 || res.HeldBy[0].Slot != other {
		t.Fatalf("Round with slot %s behind all history: deleted %d, %d left, held by %+v; want 0 deleted, held by it", other, res.Deleted, e.count(t), res.HeldBy)
	}

	// Once it has read past them, they go.
	if _, err := e.pool.Exec(ctx, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, other); err != nil {
		t.Fatal(err)
	}
	if res := e.round(t, retention.Config{}); res.Deleted != 10 || len(res.HeldBy) != 0 {
		t.Fatalf("Round once slot %s passed them: deleted %d, held by %+v; want all 10 deleted", other, res.Deleted, res.HeldBy)
	}

	// Rows this slot delivered and the other has not: kept, and counted.
	e.insert(t, 5, 2*time.Hour)
	e.coverAll(t)
	res = e.round(t, retention.Config{})
	if res.Deleted != 0 || res.Horizon == nil || res.KeptForReaders != 5 || len(res.HeldBy) != 1 || res.HeldBy[0].Slot != other || e.count(t) != 5 {
		t.Fatalf("Round with slot %s behind this one: deleted %d, kept %d for %+v, %d left; want 0 deleted, 5 kept for it", other, res.Deleted, res.KeptForReaders, res.HeldBy, e.count(t))
	}
	// Acknowledged as not reading the outbox: they go.
	if res := e.round(t, retention.Config{IgnoreSlots: []string{other}}); res.Deleted != 5 {
		t.Fatalf("Round ignoring slot %s: deleted %d; want 5", other, res.Deleted)
	}

	// Another relay's checkpoint whose slot is gone: its refill needs the rows.
	e.insert(t, 3, 2*time.Hour)
	e.coverAll(t)
	if err := e.store.Save(ctx, "gone_relay", 1, time.Now()); err != nil {
		t.Fatal(err)
	}
	res = e.round(t, retention.Config{IgnoreSlots: []string{other}})
	if res.Deleted != 0 || res.NoHorizonKind != retention.HeldBySlot || !strings.Contains(res.NoHorizon, `"gone_relay"`) ||
		!strings.Contains(res.NoHorizon, "does not exist") || !strings.Contains(res.NoHorizon, "outbox-relay recover") {
		t.Errorf("Round with another relay's checkpoint and no slot = deleted %d, %s %q; want nothing deleted, naming gone_relay, its missing slot and recover",
			res.Deleted, res.NoHorizonKind, res.NoHorizon)
	}
}

// TestRoundKeepsBufferedRows: rows of transactions the relay's WAL buffer
// still holds events of are not delivered: retention keeps them (a dry run
// says how many, and for what), and deletes them once the buffer is
// delivered.
func TestRoundKeepsBufferedRows(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	buf := sql.WALBufferTable(sql.Table{Name: sql.DefaultRetryTable})
	for _, s := range walbuffer.CreateTable(buf) {
		if _, err := e.pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	e.insert(t, 5, 2*time.Hour)
	e.coverAll(t)
	// The next transaction's events went to the buffer: its commit comes
	// after this position.
	buffered := e.wal(t)
	e.insert(t, 4, 2*time.Hour)
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+buf.Quoted()+` (slot_name, commit_lsn, pos, event) VALUES ($1, $2::pg_lsn, 1, '\x01')`,
		slot, (buffered + 1).String()); err != nil {
		t.Fatal(err)
	}
	e.coverAll(t) // the checkpoint passes them: the buffer made that so

	cfg := retention.Config{BufferTable: buf.String()}
	dry := cfg
	dry.DryRun = true
	res := e.round(t, dry)
	if res.Deleted != 5 || res.KeptForReaders != 4 || len(res.HeldBy) != 1 || !res.HeldBy[0].Buffer ||
		!strings.Contains(res.HeldBy[0].State(), "WAL buffer") {
		t.Errorf("dry run with 4 rows' events in the WAL buffer = would delete %d, keep %d for %+v; want 5 deleted, 4 kept for the WAL buffer",
			res.Deleted, res.KeptForReaders, res.HeldBy)
	}
	if res := e.round(t, cfg); res.Deleted != 5 || e.count(t) != 4 {
		t.Fatalf("Round with 4 rows' events in the WAL buffer: deleted %d, %d left; want 5 deleted, 4 left", res.Deleted, e.count(t))
	}
	// Delivered: the buffer is empty, and they go.
	if _, err := e.pool.Exec(ctx, `DELETE FROM `+buf.Quoted()); err != nil {
		t.Fatal(err)
	}
	if res := e.round(t, cfg); res.Deleted != 4 || len(res.HeldBy) != 0 {
		t.Fatalf("Round once the buffer was delivered: deleted %d, held by %+v; want 4 deleted", res.Deleted, res.HeldBy)
	}
}
