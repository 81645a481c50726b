package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// fixture is a private schema holding an outbox and a checkpoint table, and a
// logical slot; all are dropped when the test ends.
type fixture struct {
	conn   *pgx.Conn
	dsn    string
	schema string
	cfg    ops.Config
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	// The server first: testenv.Postgres waits while a fault test of another package
	// holds the servers, which must not count against the connect timeout.
	dsn := testenv.Postgres(t).DSN
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	id := testenv.UniqueName(t, "h5ops")
	f := &fixture{conn: conn, dsn: dsn, schema: id, cfg: ops.Config{
		Slot:            id,
		Table:           id + ".outbox",
		CheckpointTable: id + ".outbox_relay_checkpoint",
		RetryTable:      id + ".outbox_relay_retry",
	}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// An inactive slot retains WAL forever: never leave one behind. The
		// slot is released asynchronously after its walsender exits.
		for i := 0; i < 50; i++ {
			_, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", id)
			if err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		conn.Exec(ctx, "DROP PUBLICATION IF EXISTS "+sql.Ident(id))
		conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+sql.Ident(id)+" CASCADE")
		conn.Close(ctx)
	})
	stmts := []string{"CREATE SCHEMA " + sql.Ident(id)}
	stmts = append(stmts, sql.OutboxTable(sql.Table{Schema: id, Name: "outbox"}, sql.Columns{}, sql.LayoutRelay)...)
	stmts = append(stmts, sql.CheckpointTable(sql.Table{Schema: id, Name: "outbox_relay_checkpoint"}))
	// The publication must exist before the slot: pgoutput looks it up with
	// the snapshot of the WAL it decodes, and fails on WAL older than it.
	stmts = append(stmts, sql.CreatePublication(id, sql.Table{Schema: id, Name: "outbox"}), sql.CreateSlot(id))
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("setup %q: %v", s, err)
		}
	}
	return f
}

func (f *fixture) exec(t *testing.T, stmt string, args ...any) {
	t.Helper()
	if _, err := f.conn.Exec(context.Background(), stmt, args...); err != nil {
		t.Fatalf("exec %q: %v", stmt, err)
	}
}

func (f *fixture) table(name string) string { return sql.Ident(f.schema) + "." + sql.Ident(name) }

// insertEvents inserts n events in one transaction, created age ago.
func (f *fixture) insertEvents(t *testing.T, n int, age time.Duration) {
	t.Helper()
	f.exec(t, `INSERT INTO `+f.table("outbox")+` (id, aggregate_type, aggregate_id, event_type, payload, created_at)
		SELECT gen_random_uuid(), 'Order', i::text, 'OrderCreated',
		       jsonb_build_object('i', i, 'pad', repeat('x', 300)), now() - make_interval(secs => $1)
		FROM generate_series(1, $2) i`, age.Seconds(), n)
}

// createRetryTable creates the retry table of issue #4 with the DDL setup uses.
func (f *fixture) createRetryTable(t *testing.T) {
	t.Helper()
	for _, s := range sql.RetryTable(sql.Table{Schema: f.schema, Name: "outbox_relay_retry"}) {
		f.exec(t, s)
	}
}

// insertRetry adds a retry row with the given status that first failed age ago.
func (f *fixture) insertRetry(t *testing.T, status string, age time.Duration) {
	t.Helper()
	f.insertRetryOf(t, f.cfg.Slot, status, age)
}

// insertRetryOf inserts a row of slot into the retry table.
func (f *fixture) insertRetryOf(t *testing.T, slot, status string, age time.Duration) {
	t.Helper()
	f.exec(t, `INSERT INTO `+f.table("outbox_relay_retry")+` (event_key, aggregate, status, next_attempt_at, first_failed_at, slot_name)
		VALUES (gen_random_uuid()::text, 'outbox.event.Order/1', $1, now(), now() - make_interval(secs => $2), $3)`, status, age.Seconds(), slot)
}

func (f *fixture) lag(t *testing.T) *ops.LagReport {
	t.Helper()
	r, err := ops.Lag(context.Background(), f.conn, f.cfg)
	if err != nil {
		t.Fatalf("Lag: %v", err)
	}
	return r
}
