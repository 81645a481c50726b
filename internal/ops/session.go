package ops

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
)

// A Session is the ordinary connection lag, status and checkpoint show read
// over (a Querier). It dials on first use and again after the connection is
// lost, so that a watch survives a server restart. Each query runs in a
// transaction of its own that is read-only (BEGIN READ ONLY) and bounded in
// time (statement_timeout, lock_timeout, set for that transaction), so that
// a check can neither change anything nor hang behind a lock. They are set
// per transaction rather than as startup parameters because a connection
// pooler refuses those (PgBouncer: "unsupported startup parameter") and, in
// transaction mode, keeps no session setting from one transaction to the
// next (package sqlconn). Not safe for concurrent use.
type Session struct {
	cfg      *pgx.ConnConfig
	redacted string
	conn     *pgx.Conn
}

// The bounds of a Session's queries.
const (
	sessionStatementTimeout = "10s"
	sessionLockTimeout      = "5s"
)

// NewSession returns a Session with the DSN dsn, named applicationName on the
// server; redacted is the DSN without its password, for messages. It does not
// dial.
func NewSession(dsn, redacted, applicationName string) (*Session, error) {
	cfg, err := sqlconn.ConnConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = applicationName
	return &Session{cfg: cfg, redacted: redacted}, nil
}

// QueryRow implements Querier, dialling first when not connected. The
// returned Row must be scanned: Scan ends the query's transaction.
func (s *Session) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.conn == nil || s.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, s.cfg)
		if err != nil {
			return errRow{fmt.Errorf("connect to postgres %s: %w", s.redacted, err)}
		}
		s.conn = conn
	}
	tx, err := s.conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return errRow{err}
	}
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true), set_config('lock_timeout', $2, true)`,
		sessionStatementTimeout, sessionLockTimeout); err != nil {
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the error that matters is err
		return errRow{err}
	}
	return txRow{ctx: ctx, tx: tx, row: tx.QueryRow(ctx, sql, args...)}
}

// Close closes the connection, if any.
func (s *Session) Close(ctx context.Context) {
	if s.conn != nil {
		s.conn.Close(ctx)
	}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// txRow is a row read in a transaction of its own, which Scan ends.
type txRow struct {
	ctx context.Context
	tx  pgx.Tx
	row pgx.Row
}

func (r txRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	// Read-only: nothing to commit. A rollback that fails leaves the
	// connection broken, and the next query dials again.
	r.tx.Rollback(context.WithoutCancel(r.ctx)) //nolint:errcheck // see above
	return err
}
