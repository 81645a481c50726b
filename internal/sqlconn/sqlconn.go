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
//   - No named prepared statement through a pooler: a pooler in transaction
//     mode may run each transaction on another server connection, where a
//     statement prepared on the first is missing, or where another client's
//     of the same name exists (prepared statement "stmtcache_…" already
//     exists). Single connections (commands) always use
//     pgx.QueryExecModeCacheDescribe: unnamed statements, each query parsed,
//     bound and executed in one round trip, with its description cached. A
//     pool (the relay's, whose checkpoint saves are the hot path) keeps pgx's
//     default, named prepared statements, which measured about twice as fast
//     per save here, unless NewHotPool finds a pooler in front of Postgres
//     (Pooled), or cannot tell.
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
	"time"

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

// NewPool returns a pool of SQL connections to dsn in ExecMode, for a
// command. It does not dial.
func NewPool(ctx context.Context, dsn string) (*pgxpool.Pool, error) {
	cfg, err := PoolConfig(dsn)
	if err != nil {
		return nil, err
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// probeTimeout bounds NewHotPool's question: a server that does not answer
// then is asked by the relay's own start, with its own messages.
const probeTimeout = 10 * time.Second

// NewHotPool returns the pool of a long-running relay. It dials once, to ask
// whether a pooler is in front of Postgres (Pooled): then, or when that
// fails, the pool uses ExecMode; otherwise pgx's default, named prepared
// statements (pgx.QueryExecModeCacheStatement), which the hot path's
// checkpoint saves are faster with. pooled says whether a pooler was found;
// err is only a configuration's error.
func NewHotPool(ctx context.Context, dsn string) (pool *pgxpool.Pool, pooled bool, err error) {
	cfg, err := PoolConfig(dsn)
	if err != nil {
		return nil, false, err
	}
	if !execModeSet(dsn) {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		p, perr := Pooled(pctx, cfg.ConnConfig)
		cancel()
		pooled = p
		if perr == nil && !p {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
		}
	}
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	return pool, pooled, err
}

// Pooled connects with cfg and says whether a connection pooler answered
// instead of Postgres: the process id the server announced at start-up
// (BackendKeyData) is not the one serving the session (pg_backend_pid()).
// PgBouncer, like other poolers, makes up the key data it hands its
// clients, since a cancel request must reach it, not a server connection
// of its choosing.
func Pooled(ctx context.Context, cfg *pgx.ConnConfig) (bool, error) {
	c := cfg.Copy()
	c.DefaultQueryExecMode = ExecMode
	conn, err := pgx.ConnectConfig(ctx, c)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var pid uint32
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		return false, err
	}
	return pid != conn.PgConn().PID(), nil
}

// execModeSet says whether dsn names a default_query_exec_mode (pgx reads it
// and takes it out of the runtime parameters; pgconn leaves it there).
func execModeSet(dsn string) bool {
	pc, err := pgconn.ParseConfig(dsn)
	return err == nil && pc.RuntimeParams["default_query_exec_mode"] != ""
}
