// Package sqlconn opens the relay's ordinary (SQL) connections to Postgres so
// that they work through a connection pooler such as PgBouncer, in session
// mode and in transaction mode, as well as directly.
//
// Invariants kept by every SQL connection of the relay:
//
//   - No startup parameter but those a pooler forwards (application_name and
//     the DSN's own): PgBouncer refuses the others ("unsupported startup
//     parameter: statement_timeout"). Settings a command needs
//     (statement_timeout, read-only) are set per transaction, with
//     set_config(…, true) or BEGIN READ ONLY.
//   - No named prepared statement: a pooler in transaction mode may run each
//     transaction on another server connection, where a statement prepared on
//     the first is missing, or where another client's of the same name exists
//     (prepared statement "stmtcache_…" already exists). Connections use
//     pgx.QueryExecModeCacheDescribe: unnamed statements, each query parsed,
//     bound and executed in one round trip, with its description cached.
//   - No session state across transactions: advisory locks taken by the relay
//     on SQL connections are transaction-level (pg_advisory_xact_lock); the one
//     session-level lock (a refill's) is taken on a direct connection
//     (postgres.replication_dsn, see Direct).
//
// The replication connection never goes through a pooler: PgBouncer refuses
// it (replication.ErrPooler).
package sqlconn

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ExecMode is the query exec mode of every SQL connection (see the package doc).
const ExecMode = pgx.QueryExecModeCacheDescribe

// ConnConfig parses dsn for a single connection. A default_query_exec_mode
// the DSN sets itself wins.
func ConnConfig(dsn string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if !execModeSet(dsn) {
		cfg.DefaultQueryExecMode = ExecMode
	}
	return cfg, nil
}

// PoolConfig parses dsn for a pool, as ConnConfig does.
func PoolConfig(dsn string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if !execModeSet(dsn) {
		cfg.ConnConfig.DefaultQueryExecMode = ExecMode
	}
	return cfg, nil
}

// Connect opens one SQL connection to dsn. It dials.
func Connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := ConnConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// NewPool returns a pool of SQL connections to dsn.
func NewPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := PoolConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// execModeSet says whether dsn names a default_query_exec_mode (pgx reads it
// and takes it out of the runtime parameters; pgconn leaves it there).
func execModeSet(dsn string) bool {
	pc, err := pgconn.ParseConfig(dsn)
	return err == nil && pc.RuntimeParams["default_query_exec_mode"] != ""
}
