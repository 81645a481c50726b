package retry

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// resolve maps ids to seq numbers inside tx, failing with a *NotFoundError
// that lists every id without a row.
func (s *Store) resolve(ctx context.Context, tx pgx.Tx, ids []string) ([]int64, error) {
	q := fmt.Sprintf(`SELECT u.id, m.seq FROM unnest($1::text[]) WITH ORDINALITY AS u(id, ord)
LEFT JOIN LATERAL (SELECT r.seq FROM %s r WHERE `+matchID+`
    ORDER BY (r.seq::text = u.id) DESC, r.seq LIMIT 1) m ON true
ORDER BY u.ord`, s.table)
	rows, err := tx.Query(ctx, q, ids, s.slot)
	if err != nil {
		return nil, err
	}
	var (
		seqs    []int64
		missing []string
		id      string
		seq     *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
		if seq == nil {
			missing = append(missing, id)
		} else {
			seqs = append(seqs, *seq)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, &NotFoundError{IDs: missing}
	}
	return seqs, nil
}

// change runs stmt (with $1 the seq numbers, $2 the slot) on the slot's
// rows ids name, all or none: if an id has no row, nothing changes and the error is a
// *NotFoundError.
func (s *Store) change(ctx context.Context, what string, ids []string, stmt string) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	seqs, err := s.resolve(ctx, tx, ids)
	if err != nil {
		var nf *NotFoundError
		if errors.As(err, &nf) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rows, err := tx.Query(ctx, stmt, seqs, s.slot)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return changed, nil
}

// requeueSet is what a requeue changes: a fresh start, as if the event had
// just failed, except that the last error stays for the operator to see.
const requeueSet = `status = 'pending', next_attempt_at = now(), attempts = 0,
    first_failed_at = now(), updated_at = now()`

// Requeue makes the rows ids name (seq numbers or event ids) pending and due
// now, with attempts 0 and a fresh max-age window, keeping their last error.
// It returns the seq numbers it changed, in ascending order. If an id has no
// row, nothing changes and the error is a *NotFoundError.
func (s *Store) Requeue(ctx context.Context, ids []string) ([]int64, error) {
	return s.change(ctx, "requeue retry events", ids, fmt.Sprintf(`WITH c AS (
    UPDATE %s SET `+requeueSet+` WHERE seq = ANY($1) AND slot_name = $2 RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table))
}

// RequeueAllDead requeues every dead row of the slot, like Requeue, and returns their seq
// numbers in ascending order.
func (s *Store) RequeueAllDead(ctx context.Context) ([]int64, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`WITH c AS (
    UPDATE %s SET `+requeueSet+` WHERE slot_name = $1 AND status = 'dead' RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table), s.slot)
	if err != nil {
		return nil, fmt.Errorf("requeue dead retry events: %w", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("requeue dead retry events: %w", err)
	}
	return seqs, nil
}

// Drop deletes the rows ids name: those events are then never delivered. It
// returns the seq numbers it deleted, in ascending order. If an id has no row,
// nothing changes and the error is a *NotFoundError. The rows behind a
// dropped one become deliverable.
func (s *Store) Drop(ctx context.Context, ids []string) ([]int64, error) {
	return s.change(ctx, "drop retry events", ids, fmt.Sprintf(`WITH c AS (
    DELETE FROM %s WHERE seq = ANY($1) AND slot_name = $2 RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table))
}

// Unpark deletes the slot's rows of events whose transaction committed at or
// after from (source LSN), and returns how many. For exactly-once delivery at the
// start of a term: those rows were parked in a Kafka transaction that never
// committed (the stream reads their transactions again from the slot and
// parks them again), and left in place they would hold back, behind them,
// events that came before them in the same transaction. Rows without a
// source LSN are kept. hold, when not nil, runs first in the same
// transaction and ends it with its error: the caller's proof that it still
// leads (checkpoint.Store.HoldEpoch), held until the rows are gone, for a
// former leader waking up must not delete what the new one parked.
func (s *Store) Unpark(ctx context.Context, from pglogrepl.LSN, hold func(context.Context, pgx.Tx) error) (int64, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("delete retry rows from %s on: %w", from, s.hint(err))
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if hold != nil {
		if err := hold(ctx, tx); err != nil {
			return 0, err
		}
	}
	tag, err := tx.Exec(ctx, fmt.Sprintf(`DELETE FROM %s WHERE slot_name = $2 AND source_lsn >= $1::text::pg_lsn`, s.table), from.String(), s.slot)
	if err != nil {
		return 0, fmt.Errorf("delete retry rows from %s on: %w", from, s.hint(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("delete retry rows from %s on: %w", from, s.hint(err))
	}
	return tag.RowsAffected(), nil
}
