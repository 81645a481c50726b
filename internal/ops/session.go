package ops

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// A Session is the ordinary connection lag, status and checkpoint show read
// over (a Querier). It dials on first use and again after the connection is
// lost, so that a watch survives a server restart. It is read-only
// (default_transaction_read_only) and bounded in time (statement_timeout,
// lock_timeout), so that a check can neither change anything nor hang
// behind a lock. Not safe for concurrent use.
type Session struct {
	cfg      *pgx.ConnConfig
	redacted string
	conn     *pgx.Conn
}

// NewSession returns a Session with the DSN dsn, named applicationName on the
// server; redacted is the DSN without its password, for messages. It does not
// dial.
func NewSession(dsn, redacted, applicationName string) (*Session, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	rp := cfg.RuntimeParams
	rp["application_name"] = applicationName
	rp["default_transaction_read_only"] = "on"
	rp["statement_timeout"] = "10s"
	rp["lock_timeout"] = "5s"
	return &Session{cfg: cfg, redacted: redacted}, nil
}

// QueryRow implements Querier, dialling first when not connected.
func (s *Session) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if s.conn == nil || s.conn.IsClosed() {
		conn, err := pgx.ConnectConfig(ctx, s.cfg)
		if err != nil {
			return errRow{fmt.Errorf("connect to postgres %s: %w", s.redacted, err)}
		}
		s.conn = conn
	}
	return s.conn.QueryRow(ctx, sql, args...)
}

// Close closes the connection, if any.
func (s *Session) Close(ctx context.Context) {
	if s.conn != nil {
		s.conn.Close(ctx)
	}
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
