package pgslot

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sql"
)

// Peeking decodes a slot's changes with pg_logical_slot_peek_binary_changes
// on an ordinary connection, as pgoutput would stream them (proto_version 1),
// without confirming anything: the slot does not move. Decoding can take as
// long as the WAL it reads, so each peek runs in a transaction of its own
// under a statement timeout.

// A Beginner starts a transaction: *pgx.Conn and *pgxpool.Pool satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ErrPeekTimeout is wrapped by a peek's error when the decoding did not
// finish within its timeout.
var ErrPeekTimeout = errors.New("decoding took longer than its timeout")

// Peek decodes the slot's changes up to the server's current WAL position
// with the publication, the name passed as the stream passes it, and returns
// the server's error if the slot cannot decode them (a publication that did
// not exist at a change: "publication ... does not exist"). Up to the current
// position, not just the first change: pgoutput looks publications up again
// after every catalog change, so a change written while the publication was
// missing fails even after earlier ones decoded.
func Peek(ctx context.Context, db Beginner, slot, publication string, timeout time.Duration) error {
	return peek(ctx, db, timeout, func(tx pgx.Tx) error {
		var n int64
		return tx.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, pg_current_wal_lsn(), NULL,
	'proto_version', '1', 'publication_names', $2)`, slot, publication).Scan(&n)
	})
}

// CountInserts decodes the slot's changes up to to with the publication and
// counts the inserts into the table whose OID is rel in the transactions that
// end after from and at or before to, and those transactions: what a
// checkpoint moved from from to to would skip.
func CountInserts(ctx context.Context, db Beginner, slot, publication string, rel uint32, from, to pglogrepl.LSN, timeout time.Duration) (events, txns int64, err error) {
	// pgoutput v1, binary: an insert is 'I' (73) then the relation's OID;
	// a commit is 'C' (67), and its row's lsn is the transaction's end.
	var oid [4]byte
	binary.BigEndian.PutUint32(oid[:], rel)
	err = peek(ctx, db, timeout, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT coalesce(sum(n), 0), count(*) FROM (
    SELECT count(*) FILTER (WHERE get_byte(data, 0) = 73 AND substring(data FROM 2 FOR 4) = $5) AS n,
           max(lsn) FILTER (WHERE get_byte(data, 0) = 67) AS end_lsn
    FROM pg_logical_slot_peek_binary_changes($1, $2::text::pg_lsn, NULL, 'proto_version', '1', 'publication_names', $3)
    GROUP BY xid) t
WHERE n > 0 AND end_lsn > $4::text::pg_lsn AND end_lsn <= $2::text::pg_lsn`,
			slot, to.String(), sql.Ident(publication), from.String(), oid[:]).Scan(&events, &txns)
	})
	return events, txns, err
}

// peek runs query in a transaction of its own under a statement timeout; a
// query the timeout cancelled gives an error wrapping ErrPeekTimeout.
func peek(ctx context.Context, db Beginner, timeout time.Duration, query func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT set_config('statement_timeout', $1, true)`, fmt.Sprint(timeout.Milliseconds())); err != nil {
		return err
	}
	err = query(tx)
	var pgErr *pgconn.PgError
	if err != nil && ctx.Err() == nil && errors.As(err, &pgErr) && pgErr.Code == "57014" { // query_canceled
		return fmt.Errorf("%w (%s)", ErrPeekTimeout, timeout)
	}
	return err
}
