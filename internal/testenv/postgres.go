package testenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
)

// PG is a database of its own for one test.
type PG struct {
	DSN      string // the test's fresh database
	AdminDSN string // the server's default database, as the role that created DSN's
}

// Postgres returns a fresh database for this test, created with CREATE DATABASE under
// a unique name and dropped at cleanup after its backends are terminated and its
// replication slots dropped. It holds the servers shared (see Exclusive) until t ends.
func Postgres(t testing.TB) *PG {
	t.Helper()
	admin := postgresAdminDSN(t)
	useServers(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: Postgres at %s: %v; %s", redact(admin), err, howToStart)
	}
	defer conn.Close(context.Background())
	name := UniqueName(t, "db")
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database %s: %v", name, err)
	}
	p := &PG{DSN: withDatabase(admin, name), AdminDSN: admin}
	t.Cleanup(func() {
		if err := dropDatabase(admin, name); err != nil {
			t.Errorf("testenv: %v", err)
		}
	})
	return p
}

// connectRetry connects, retrying briefly: a server just restarted by a fault test may
// still be in recovery.
func connectRetry(ctx context.Context, dsn string) (*pgx.Conn, error) {
	for {
		conn, err := pgx.Connect(ctx, dsn)
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil || !retryableConnect(err) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func retryableConnect(err error) bool {
	s := err.Error()
	return strings.Contains(s, "the database system is starting up") ||
		strings.Contains(s, "the database system is in recovery mode") ||
		strings.Contains(s, "the database system is shutting down")
}

func dropDatabase(admin, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, admin)
	if err != nil {
		return fmt.Errorf("drop database %s: %w", name, err)
	}
	defer conn.Close(context.Background())
	// Walsenders of a test's replication connections hold its slots active, and a
	// database with slots cannot be dropped: end them, then drop the slots, retrying
	// while a terminated walsender is still exiting.
	for {
		_, err = conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = $1 AND pid <> pg_backend_pid()`, name)
		if err == nil {
			_, err = conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name)
				FROM pg_replication_slots WHERE database = $1`, name)
		}
		if err == nil {
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		}
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drop database %s: %w", name, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// withDatabase returns dsn with its database replaced by db.
func withDatabase(dsn, db string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		if u, err := url.Parse(dsn); err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	// keyword=value form: a later keyword overrides an earlier one.
	return dsn + " dbname=" + db
}

// redact hides a URL DSN's password in messages.
func redact(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxx")
			return u.String()
		}
	}
	return dsn
}

// Exec runs sql (several statements are allowed when there are no args) in the test's
// database and fails the test on error.
func (p *PG) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: Exec(%q): connect: %v", sql, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("testenv: Exec(%q): %v", sql, err)
	}
}

// DropSlot drops the replication slot, waiting up to 30 s while it is still
// active: a walsender ends a moment after its client closed the connection
// (longer on a loaded machine), and pg_drop_replication_slot refuses an
// active slot.
func (p *PG) DropSlot(t testing.TB, slot string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: drop slot %s: connect: %v", slot, err)
	}
	defer conn.Close(context.Background())
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		var pgErr *pgconn.PgError
		if err == nil {
			return
		}
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" || time.Now().After(deadline) {
			t.Fatalf("testenv: drop slot %s: %v", slot, err)
		}
	}
}

// OID returns the OID of table (any name regclass reads: "public.outbox"),
// as pgoutput's relations carry it.
func (p *PG) OID(t testing.TB, table string) uint32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := connectRetry(ctx, p.DSN)
	if err != nil {
		t.Fatalf("testenv: OID(%s): connect: %v", table, err)
	}
	defer conn.Close(context.Background())
	var oid uint32
	if err := conn.QueryRow(ctx, `SELECT $1::regclass::oid`, table).Scan(&oid); err != nil {
		t.Fatalf("testenv: OID(%s): %v", table, err)
	}
	return oid
}

// Pool returns a pool on the test's database, closed at cleanup.
func (p *PG) Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), p.DSN)
	if err != nil {
		t.Fatalf("testenv: Pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// ---------------------------------------------------------------- Kafka

// StopPostgres shuts Postgres down immediately (pg_ctl stop -m immediate: a crash, with
// recovery at the next start, or an immediate container stop) and returns once it is
// down. The caller must hold Exclusive.
func StopPostgres(t testing.TB) {
	t.Helper()
	postgresFault(t, "StopPostgres", "pg-stop-immediate", stopContainer)
}

// StartPostgres starts Postgres again and returns once it accepts connections. The
// caller must hold Exclusive.
func StartPostgres(t testing.TB) {
	t.Helper()
	admin := postgresFault(t, "StartPostgres", "pg-start", startContainer)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		conn, err := connectRetry(ctx, admin)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.Background())
			if err == nil {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: StartPostgres: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// postgresFault is the shape of the Postgres fault helpers, as kafkaFault is
// of Kafka's: check Exclusive, act on the container or run the dev script
// (after checking it is the dev server). It returns the admin DSN.
func postgresFault(t testing.TB, name, devCmd string, container func(testing.TB, testcontainers.Container)) string {
	t.Helper()
	requireExclusive(t, name)
	admin := postgresAdminDSN(t)
	if c := containers.postgres; c != nil {
		container(t, c)
	} else {
		checkDevPort(t, "RELAY_DEV_PG_PORT", defaultDevPGPort, dsnPort(t, admin))
		runDev(t, devCmd)
	}
	return admin
}

func dsnPort(t testing.TB, dsn string) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatalf("testenv: parse %s: %v", envPostgresDSN, err)
	}
	return strconv.Itoa(int(cfg.Port))
}
