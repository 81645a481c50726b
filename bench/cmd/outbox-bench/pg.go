package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// aggregateTypes are the five aggregate types events are spread over; each
// bench phase prefixes them so that every phase routes to fresh topics.
var aggregateTypes = []string{"order", "payment", "customer", "shipment", "invoice"}

// outboxDDL is the default outbox table of DESIGN.md. `outbox-relay setup
// --create-outbox-table` creates it too; the bench creates it only if setup
// did not, so that the producer half works before the relay does.
const outboxDDL = `CREATE TABLE IF NOT EXISTS public.outbox (
	id uuid PRIMARY KEY,
	aggregate_type text NOT NULL,
	aggregate_id text NOT NULL,
	event_type text NOT NULL,
	payload jsonb,
	headers jsonb,
	created_at timestamptz NOT NULL DEFAULT now())`

// insertSQL generates a transaction's events on the server: generating them in
// Go and shipping them over the wire would make the producer, not the relay,
// the bottleneck on two cores. An implicit transaction per Exec means the Exec
// returns right after COMMIT.
//
// $1 aggregate types, $2 first sequence number, $3 aggregate count, $4 txn
// number, $5 ts_ns (wall time the INSERT was sent), $6 padding bytes, $7 rows.
const insertSQL = `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(),
	($1::text[])[((($2::bigint + g) % $3::bigint) % 5) + 1],
	'agg-' || (($2::bigint + g) % $3::bigint),
	'created',
	jsonb_build_object('txn', $4::bigint, 'seq', $2::bigint + g, 'ts_ns', $5::bigint, 'pad', repeat('x', $6::int))
FROM generate_series(0, $7::int - 1) AS g`

// payloadOverhead is the length of jsonb's text output for the payload above
// without the padding, so that -payload-bytes is the size the consumer sees.
// Example: {"pad": "", "seq": 123456, "txn": 1234, "ts_ns": 1760000000000000000}
const payloadOverhead = 72

// benchDB is one fresh database holding the outbox, its publications and the
// slots of one workload of one run.
type benchDB struct {
	Name           string
	AdminDSN       string // the database named by RELAY_POSTGRES_DSN
	CleanupDSN     string // drops slots and the database: -cleanup-dsn, else AdminDSN
	DSN            string // the fresh database
	Publication    string
	RelaySlot      string
	EOSSlot        string // the exactly-once relay's in a drain
	RecvSlot       string
	DbzPublication string // Debezium's own, so that its slot reads what the others read
	DbzSlot        string
	ExtraSlots     []string // a workload's own slots (the tables workload's)
}

// withDatabase returns dsn (URL or key=value form) pointed at database name.
func withDatabase(dsn, name string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse dsn: %w", err)
		}
		u.Path = "/" + name
		return u.String(), nil
	}
	return dsn + " dbname=" + name, nil
}

// createDatabase creates the database; setupObjects fills it.
func createDatabase(ctx context.Context, adminDSN, cleanupDSN, name string) (*benchDB, error) {
	dsn, err := withDatabase(adminDSN, name)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %q: %w", name, err)
	}
	if cleanupDSN == "" {
		cleanupDSN = adminDSN
	}
	return &benchDB{
		Name:           name,
		AdminDSN:       adminDSN,
		CleanupDSN:     cleanupDSN,
		DSN:            dsn,
		Publication:    name + "_pub",
		RelaySlot:      name + "_relay",
		EOSSlot:        name + "_eos",
		RecvSlot:       name + "_recv",
		DbzPublication: name + "_dbzpub",
		DbzSlot:        name + "_dbz",
	}, nil
}

// ensureObjects creates whatever `outbox-relay setup` did not: the outbox
// table, the publication and both slots. Both slots exist before the first
// insert, so both see the whole backlog.
func (db *benchDB) ensureObjects(ctx context.Context, publications, slots []string) error {
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, outboxDDL); err != nil {
		return fmt.Errorf("create outbox table: %w", err)
	}
	var n int
	for _, pub := range publications {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_publication WHERE pubname = $1", pub).Scan(&n); err != nil {
			return fmt.Errorf("look up publication: %w", err)
		}
		if n > 0 {
			continue
		}
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{pub}.Sanitize()+" FOR TABLE public.outbox WITH (publish = 'insert')"); err != nil {
			return fmt.Errorf("create publication %q: %w", pub, err)
		}
	}
	for _, slot := range slots {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&n); err != nil {
			return fmt.Errorf("look up slot %q: %w", slot, err)
		}
		if n > 0 {
			continue
		}
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			return fmt.Errorf("create slot %q: %w", slot, err)
		}
	}
	return nil
}

// drop removes the slots and the database. Slots first: a database with slots
// cannot be dropped, and an inactive slot left behind would retain WAL forever.
// It waits a little for a slot that is still active (a process just stopped).
// It connects with CleanupDSN (-cleanup-dsn: the dev superuser if given).
func (db *benchDB) drop(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, db.CleanupDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	var errs []error
	for _, slot := range db.slots() {
		if err := dropSlot(ctx, conn, slot); err != nil {
			errs = append(errs, err)
		}
	}
	if err := dropDatabase(ctx, conn, db.Name); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// slots are every slot a run may create in db.
func (db *benchDB) slots() []string {
	return append([]string{db.RelaySlot, db.EOSSlot, db.RecvSlot, db.DbzSlot}, db.ExtraSlots...)
}

// dropRetryFor bounds dropDatabase's retries: an autovacuum worker that has
// just started on a million-row table may take seconds to notice a cancel.
const dropRetryFor = 45 * time.Second

// dropDatabase drops the database as the connected role, also when it is not
// a superuser. DROP DATABASE … WITH (FORCE) terminates every session in the
// database and, as a non-superuser, refuses when one of them belongs to
// another role ("must be a member of the role whose process is being
// terminated or member of pg_signal_backend"): an autovacuum worker, which a
// backlog of a million rows makes likely. A plain DROP DATABASE instead
// cancels autovacuum workers itself and waits for them (up to 5 s), and
// refuses only for sessions of real clients. So as a non-superuser the bench
// ends its own sessions (a role may always signal its own backends), forbids
// new ones, and drops without FORCE, retrying "being accessed by other users"
// and privilege refusals until dropRetryFor; as a superuser it uses FORCE.
func dropDatabase(ctx context.Context, conn *pgx.Conn, name string) error {
	ident := pgx.Identifier{name}.Sanitize()
	var super bool
	if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		return fmt.Errorf("drop database %q: look up role: %w", name, err)
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return fmt.Errorf("drop database %q: %w", name, err)
	}
	if !exists {
		return nil
	}
	// Owner or superuser may: a relay that is still restarting cannot reconnect.
	_, _ = conn.Exec(ctx, "ALTER DATABASE "+ident+" WITH ALLOW_CONNECTIONS false")
	stmt := "DROP DATABASE IF EXISTS " + ident
	if super {
		stmt += " WITH (FORCE)"
	}
	deadline := time.Now().Add(dropRetryFor)
	for attempt := 1; ; attempt++ {
		if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid() AND usename = current_user`, name); err != nil {
			return fmt.Errorf("drop database %q: end own sessions: %w", name, err)
		}
		_, err := conn.Exec(ctx, stmt)
		if err == nil {
			return nil
		}
		var pgErr *pgconn.PgError
		retry := errors.As(err, &pgErr) && (pgErr.Code == "55006" || pgErr.Code == "42501") // object_in_use, insufficient_privilege
		if !retry || time.Now().After(deadline) {
			return fmt.Errorf("drop database %q (attempt %d; run the bench with -cleanup-dsn set to a superuser DSN, "+
				"or drop it by hand: DROP DATABASE %s WITH (FORCE)): %w", name, attempt, ident, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %q: %w", name, ctx.Err())
		case <-time.After(min(time.Duration(attempt)*250*time.Millisecond, 2*time.Second)):
		}
	}
}

// dropSlot drops one slot now, so that it retains no WAL while the run goes on.
func (db *benchDB) dropSlot(ctx context.Context, slot string) error {
	conn, err := pgx.Connect(ctx, db.CleanupDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	return dropSlot(ctx, conn, slot)
}

func dropSlot(ctx context.Context, conn *pgx.Conn, slot string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var pid *int32
		err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("look up slot %q: %w", slot, err)
		}
		if pid != nil && time.Now().After(deadline) {
			// Whatever holds it is ours (pg_recvlogical or the relay) and
			// failed to exit: end its walsender so the slot can go.
			if _, err := conn.Exec(ctx, "SELECT pg_terminate_backend($1)", *pid); err != nil {
				return fmt.Errorf("terminate walsender of slot %q: %w", slot, err)
			}
		}
		if pid == nil {
			if _, err := conn.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
				return fmt.Errorf("drop slot %q: %w", slot, err)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop slot %q: %w", slot, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// backlogProc commits txns transactions of per events each on the server, one
// COMMIT per transaction (a procedure may commit between statements): a backlog of
// a million one-event transactions costs no client round trips. Its parameters
// are insertSQL's, plus the number of transactions.
const backlogProc = `CREATE OR REPLACE PROCEDURE public.outbox_bench_backlog(
	types text[], seq0 bigint, aggs bigint, txn0 bigint, pad int, per int, txns int)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 0 .. txns - 1 LOOP
		INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(),
			types[(((seq0 + i::bigint * per + g) % aggs) % 5) + 1],
			'agg-' || ((seq0 + i::bigint * per + g) % aggs),
			'created',
			jsonb_build_object('txn', txn0 + i, 'seq', seq0 + i::bigint * per + g,
				'ts_ns', (extract(epoch FROM clock_timestamp()) * 1e9)::bigint, 'pad', repeat('x', pad))
		FROM generate_series(0, per - 1) AS g;
		COMMIT;
	END LOOP;
END $$`

// producer inserts events into the bench database over one or more
// connections; sequence and transaction numbers are unique across them.
type producer struct {
	conns      []*pgx.Conn
	types      []string
	aggregates int
	pad        int
	seq        atomic.Int64
	txn        atomic.Int64
}

// newProducer connects conns times (at least once).
func newProducer(ctx context.Context, dsn, typePrefix string, aggregates, payloadBytes, conns int) (*producer, error) {
	types := make([]string, len(aggregateTypes))
	for i, t := range aggregateTypes {
		types[i] = typePrefix + t
	}
	p := &producer{types: types, aggregates: aggregates, pad: max(payloadBytes-payloadOverhead, 0)}
	for range max(conns, 1) {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			p.close(ctx)
			return nil, fmt.Errorf("connect producer: %w", err)
		}
		p.conns = append(p.conns, conn)
	}
	return p, nil
}

func (p *producer) close(ctx context.Context) {
	for _, c := range p.conns {
		c.Close(ctx)
	}
}

// reserve takes n sequence numbers and one transaction number.
func (p *producer) reserve(n int) (txn, seq0 int64) {
	return p.txn.Add(1), p.seq.Add(int64(n)) - int64(n)
}

// insertTxn commits one transaction of n events on connection c and returns
// its number and the wall time right after COMMIT returned. Connections may be
// used concurrently, each by one goroutine.
func (p *producer) insertTxn(ctx context.Context, c, n int) (txn int64, committed time.Time, err error) {
	txn, seq0 := p.reserve(n)
	sent := time.Now()
	if _, err := p.conns[c].Exec(ctx, insertSQL, p.types, seq0, p.aggregates, txn, sent.UnixNano(), p.pad, n); err != nil {
		return 0, time.Time{}, fmt.Errorf("insert txn %d: %w", txn, err)
	}
	return txn, time.Now(), nil
}

// insertBacklog commits txns transactions of per events on the server
// (backlogProc), with asynchronous commit: the WAL is the same, the wait for
// each commit's flush is not part of the backlog under test.
func (p *producer) insertBacklog(ctx context.Context, per, txns int) error {
	if txns <= 0 {
		return nil
	}
	c := p.conns[0]
	if _, err := c.Exec(ctx, backlogProc); err != nil {
		return fmt.Errorf("create backlog procedure: %w", err)
	}
	if _, err := c.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		return fmt.Errorf("backlog: %w", err)
	}
	defer c.Exec(context.WithoutCancel(ctx), "RESET synchronous_commit") //nolint:errcheck // the session ends soon after
	txn0, seq0 := p.reserve(per * txns)
	p.txn.Add(int64(txns - 1))
	if _, err := c.Exec(ctx, "CALL public.outbox_bench_backlog($1, $2, $3, $4, $5, $6, $7)",
		p.types, seq0, p.aggregates, txn0, p.pad, per, txns); err != nil {
		return fmt.Errorf("insert backlog: %w", err)
	}
	return nil
}

// walLSN returns pg_current_wal_lsn().
func (p *producer) walLSN(ctx context.Context) (pglogrepl.LSN, error) {
	var s string
	if err := p.conns[0].QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("current wal lsn: %w", err)
	}
	return pglogrepl.ParseLSN(s)
}

// insertLastTxn commits the final backlog transaction and returns an LSN taken
// inside it after its inserts. The commit record of that transaction starts
// after this LSN, and a relay confirms only transaction end LSNs (or, when
// idle, the server's WAL end), so a confirmed_flush_lsn above it means the
// whole backlog was confirmed, even while other databases write WAL.
func (p *producer) insertLastTxn(ctx context.Context, n int) (beforeCommit pglogrepl.LSN, err error) {
	tx, err := p.conns[0].Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx)
	txn, seq0 := p.reserve(n)
	if _, err := tx.Exec(ctx, insertSQL, p.types, seq0, p.aggregates, txn, time.Now().UnixNano(), p.pad, n); err != nil {
		return 0, fmt.Errorf("insert txn %d: %w", txn, err)
	}
	var s string
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, fmt.Errorf("wal insert lsn: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit txn %d: %w", txn, err)
	}
	return pglogrepl.ParseLSN(s)
}

// payloadBytes returns the total size of the payloads as the relay forwards
// them (jsonb's text output).
func (p *producer) payloadBytes(ctx context.Context) (int64, error) {
	var n int64
	if err := p.conns[0].QueryRow(ctx, "SELECT coalesce(sum(octet_length(payload::text)), 0) FROM public.outbox").Scan(&n); err != nil {
		return 0, fmt.Errorf("sum payload bytes: %w", err)
	}
	return n, nil
}

// confirmedFlushLSN returns the slot's confirmed_flush_lsn.
func confirmedFlushLSN(ctx context.Context, conn *pgx.Conn, slot string) (pglogrepl.LSN, error) {
	var s *string
	if err := conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s); err != nil {
		return 0, fmt.Errorf("slot %q position: %w", slot, err)
	}
	if s == nil {
		return 0, nil
	}
	return pglogrepl.ParseLSN(*s)
}

// leftoverSlots lists inactive slots of earlier bench invocations, which an
// invocation killed with SIGKILL could not drop. They retain WAL until dropped.
func leftoverSlots(ctx context.Context, adminDSN string) ([]string, error) {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE slot_name LIKE 'outbox\_bench\_%' AND NOT active ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list slots: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// leftoverDatabases lists outbox_bench_* databases of earlier invocations that
// their clean-up could not drop.
func leftoverDatabases(ctx context.Context, adminDSN string) ([]string, error) {
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT datname::text FROM pg_database WHERE datname LIKE 'outbox\_bench\_%' ORDER BY 1`)
	if err != nil {
		return nil, fmt.Errorf("list databases: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
