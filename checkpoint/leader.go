package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/sql"
)

// # Leadership and fencing
//
// Several relays may run on one slot: the replication slot itself elects the
// leader (Postgres lets one walsender hold it), and the others wait as
// standbys. What the slot cannot do is stop a former leader that froze (or
// lost its network) long enough for the server to drop its walsender and a
// standby to take over, and then woke up with events in flight: its writes
// to Postgres would still succeed. So the checkpoint row carries an epoch.
// A relay that acquired the slot bumps it (TakeOver) before it delivers
// anything, and every checkpoint it saves afterwards is conditional on the
// row still holding its epoch (SaveFenced). A former leader's save then
// fails with a *FencedError instead of moving the checkpoint, and Verify lets
// it ask, before a Kafka write, whether it still leads.

// ErrFenced is wrapped by a *FencedError.
var ErrFenced = errors.New("checkpoint: another relay took over the slot")

// A FencedError says that the slot's checkpoint row holds a newer epoch than
// the caller's: another relay took the slot over.
type FencedError struct {
	Slot          string
	Epoch, Newest int64
	Leader        string // the leader that holds Newest, as it described itself
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("slot %q was taken over by another relay (epoch %d, ours %d; %s): this relay no longer leads and must not deliver or save anything",
		e.Slot, e.Newest, e.Epoch, e.Leader)
}

func (e *FencedError) Unwrap() error { return ErrFenced }

// Leader is the leadership recorded in a slot's checkpoint row.
type Leader struct {
	Epoch  int64     // 0: no relay has led the slot yet
	Leader string    // how the leader described itself (host, pid, start time)
	Since  time.Time // when it took over (database clock); zero with Epoch 0
}

// MigrateLeader adds the columns added since the first version (the
// leadership columns, the stop record: sql.CheckpointUpgrade) to a
// checkpoint table made before they existed. It changes nothing (and needs no
// ownership) when they exist.
func (s *Store) MigrateLeader(ctx context.Context) error {
	if s.err != nil {
		return s.err
	}
	var have int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute
WHERE attrelid = $1::regclass AND attname = ANY($2) AND NOT attisdropped`,
		s.table, sql.CheckpointUpgradeColumns).Scan(&have); err != nil {
		return fmt.Errorf("look up the columns of checkpoint table %s: %w", s.table, err)
	}
	if have == len(sql.CheckpointUpgradeColumns) {
		return nil
	}
	if _, err := s.pool.Exec(ctx, sql.CheckpointUpgrade(s.t)); err != nil {
		return fmt.Errorf("add the columns (%s) of this version to checkpoint table %s: as the table's owner, run %q: %w",
			strings.Join(sql.CheckpointUpgradeColumns, ", "), s.table, sql.CheckpointUpgrade(s.t), err)
	}
	return nil
}

// TakeOver records that leader now leads slot, streaming it from srv, and
// returns its epoch, one above any epoch before. The caller must hold the
// slot (its walsender streams it) and must have checked that the checkpoint
// belongs to srv's WAL (pgslot.Verify): from now on the checkpoint's
// positions are srv's. The epoch fences every relay that led before, not
// rivals for the slot. A slot without a checkpoint gets a row at LSN 0/0,
// which Start treats as no checkpoint.
func (s *Store) TakeOver(ctx context.Context, slot, leader string, srv Server) (int64, error) {
	if s.err != nil {
		return 0, s.err
	}
	var epoch int64
	err := s.pool.QueryRow(ctx, `INSERT INTO `+s.table+` AS c (slot_name, lsn, saved_at, epoch, leader, leader_since, system_identifier, timeline_id)
VALUES ($1, '0/0', now(), 1, $2, now(), $3, $4)
ON CONFLICT (slot_name) DO UPDATE SET epoch = c.epoch + 1, leader = EXCLUDED.leader, leader_since = EXCLUDED.leader_since,
    system_identifier = EXCLUDED.system_identifier, timeline_id = EXCLUDED.timeline_id
RETURNING epoch`, slot, leader, nullString(srv.SystemID), nullInt(srv.Timeline)).Scan(&epoch)
	if err != nil {
		return 0, fmt.Errorf("take over slot %q in checkpoint table %s: %w", slot, s.table, err)
	}
	return epoch, nil
}

// SaveFenced is Save for the leader of epoch: it moves the checkpoint forward
// (never backwards) only while the row still holds epoch, and returns a
// *FencedError, changing nothing, when another relay took over since.
func (s *Store) SaveFenced(ctx context.Context, slot string, epoch int64, lsn pglogrepl.LSN, lastCommit time.Time) error {
	if s.err != nil {
		return s.err
	}
	var commit *time.Time
	if !lastCommit.IsZero() {
		commit = &lastCommit
	}
	// One statement: the row lock serialises it with a rival's TakeOver, so
	// a save either lands before the takeover or sees the new epoch.
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` AS c SET
    lsn = CASE WHEN c.lsn < $2::text::pg_lsn THEN $2::text::pg_lsn ELSE c.lsn END,
    last_commit_time = CASE WHEN c.lsn < $2::text::pg_lsn THEN coalesce($3, c.last_commit_time) ELSE c.last_commit_time END,
    saved_at = CASE WHEN c.lsn < $2::text::pg_lsn THEN now() ELSE c.saved_at END,
    stop_reason = CASE WHEN c.stopped_before < $2::text::pg_lsn THEN NULL ELSE c.stop_reason END,
    stopped_before = CASE WHEN c.stopped_before < $2::text::pg_lsn THEN NULL ELSE c.stopped_before END,
    reading = CASE WHEN (c.reading->>'commit_lsn')::pg_lsn < $2::text::pg_lsn THEN NULL ELSE c.reading END
WHERE c.slot_name = $1 AND c.epoch = $4`, slot, lsn.String(), commit, epoch)
	if err != nil {
		return fmt.Errorf("save checkpoint %q at %s: %w", slot, lsn, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return s.fenced(ctx, slot, epoch)
}

// RecordServer records srv as the server of the slot's checkpoint, while the
// row holds epoch (a *FencedError otherwise). The leader calls it when its
// stream moved to a later timeline that it checked continues from the
// confirmed position (a promotion): the positions it saves from then on are
// that timeline's, and a later start verifies them against it. Recorded
// before any such position is saved, it is true of the saved one too, which
// the new timeline contains.
func (s *Store) RecordServer(ctx context.Context, slot string, epoch int64, srv Server) error {
	if s.err != nil {
		return s.err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET system_identifier = $3, timeline_id = $4 WHERE slot_name = $1 AND epoch = $2`,
		slot, epoch, nullString(srv.SystemID), nullInt(srv.Timeline))
	if err != nil {
		return fmt.Errorf("record the server of checkpoint %q: %w", slot, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return s.fenced(ctx, slot, epoch)
}

// Verify returns nil while the slot's row holds epoch, and a *FencedError
// once another relay took over.
func (s *Store) Verify(ctx context.Context, slot string, epoch int64) error {
	if s.err != nil {
		return s.err
	}
	l, err := s.Leader(ctx, slot)
	if err != nil {
		return err
	}
	if l.Epoch != epoch {
		return &FencedError{Slot: slot, Epoch: epoch, Newest: l.Epoch, Leader: l.Leader}
	}
	return nil
}

// HoldEpoch locks the slot's checkpoint row in tx against a takeover (FOR
// SHARE: a rival's TakeOver waits for tx to end) and returns nil while the row
// holds epoch, a *FencedError once another relay took over. What tx writes
// after it is then the leader's, as a SaveFenced is.
func (s *Store) HoldEpoch(ctx context.Context, tx pgx.Tx, slot string, epoch int64) error {
	if s.err != nil {
		return s.err
	}
	var (
		newest int64
		leader *string
	)
	err := tx.QueryRow(ctx, `SELECT epoch, leader FROM `+s.table+` WHERE slot_name = $1 FOR SHARE`, slot).Scan(&newest, &leader)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("lock the checkpoint of slot %q: %w", slot, err)
	}
	if newest != epoch {
		e := &FencedError{Slot: slot, Epoch: epoch, Newest: newest}
		if leader != nil {
			e.Leader = *leader
		}
		return e
	}
	return nil
}

func (s *Store) fenced(ctx context.Context, slot string, epoch int64) error {
	l, err := s.Leader(ctx, slot)
	if err != nil {
		return fmt.Errorf("save checkpoint %q: the row no longer holds epoch %d: %w", slot, epoch, err)
	}
	return &FencedError{Slot: slot, Epoch: epoch, Newest: l.Epoch, Leader: l.Leader}
}

// Leader returns the leadership recorded for slot; Epoch 0 when none.
func (s *Store) Leader(ctx context.Context, slot string) (Leader, error) {
	if s.err != nil {
		return Leader{}, s.err
	}
	var (
		l      Leader
		leader *string
		since  *time.Time
	)
	err := s.pool.QueryRow(ctx, `SELECT epoch, leader, leader_since FROM `+s.table+` WHERE slot_name = $1`, slot).
		Scan(&l.Epoch, &leader, &since)
	if errors.Is(err, pgx.ErrNoRows) {
		return Leader{}, nil
	}
	if err != nil {
		return Leader{}, fmt.Errorf("read the leader of slot %q: %w", slot, err)
	}
	if leader != nil {
		l.Leader = *leader
	}
	if since != nil {
		l.Since = *since
	}
	return l, nil
}

// A Stop is the record of why the relay last stopped before a transaction
// it must not confirm past: Before is that transaction's commit LSN.
type Stop struct {
	Before pglogrepl.LSN
	Reason string
}

// RecordStop records why the relay of slot stopped before the transaction
// committed at before. SaveFenced clears the record once the checkpoint
// passes that transaction.
func (s *Store) RecordStop(ctx context.Context, slot string, before pglogrepl.LSN, reason string) error {
	if s.err != nil {
		return s.err
	}
	_, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET stopped_before = $2::text::pg_lsn, stop_reason = $3 WHERE slot_name = $1`,
		slot, before.String(), reason)
	if err != nil {
		return fmt.Errorf("record the stop of slot %q in checkpoint table %s: %w", slot, s.table, err)
	}
	return nil
}

// RecordRefill records what the last refill of slot's lost slot did (one
// line, for status), in the row of the leader of epoch.
func (s *Store) RecordRefill(ctx context.Context, slot string, epoch int64, what string) error {
	if s.err != nil {
		return s.err
	}
	_, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET last_refill = $3 WHERE slot_name = $1 AND epoch = $2`, slot, epoch, what)
	if err != nil {
		return fmt.Errorf("record the refill of slot %q in checkpoint table %s: %w", slot, s.table, err)
	}
	return nil
}

// Reading is a transaction the relay has been reading from the slot and not
// yet confirmed: the server decodes a transaction whole before it sends it,
// and the relay confirms the positions it reports meanwhile (nothing is in
// flight), so the slot's lag in bytes does not count it. For lag.
type Reading struct {
	CommitLSN pglogrepl.LSN // its commit LSN (from its Begin)
	Since     time.Time     // when the relay began to read it
	Events    int64         // rows (events) read of it so far
	Bytes     int64         // their bytes, as pgoutput sent them
}

type readingJSON struct {
	CommitLSN string    `json:"commit_lsn"`
	Since     time.Time `json:"since"`
	Events    int64     `json:"events"`
	Bytes     int64     `json:"bytes"`
}

// RecordReading records r as the transaction the leader of epoch is reading
// (saved_at-like: the column reading, with the time of the update). A save
// of the checkpoint past r.CommitLSN clears it. Nothing changes when the row
// holds another epoch (a former leader's figures are not the slot's).
func (s *Store) RecordReading(ctx context.Context, slot string, epoch int64, r Reading) error {
	if s.err != nil {
		return s.err
	}
	_, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET reading = jsonb_set($3::jsonb, '{updated_at}', to_jsonb(now()))
WHERE slot_name = $1 AND epoch = $2 AND lsn < $4::text::pg_lsn`,
		slot, epoch, readingJSON{CommitLSN: r.CommitLSN.String(), Since: r.Since.UTC(), Events: r.Events, Bytes: r.Bytes}, r.CommitLSN.String())
	if err != nil {
		return fmt.Errorf("record the transaction being read of slot %q in checkpoint table %s: %w", slot, s.table, err)
	}
	return nil
}

// Stopped returns the stop recorded for slot, or nil when there is none.
func (s *Store) Stopped(ctx context.Context, slot string) (*Stop, error) {
	if s.err != nil {
		return nil, s.err
	}
	var before, reason *string
	err := s.pool.QueryRow(ctx, `SELECT stopped_before::text, stop_reason FROM `+s.table+` WHERE slot_name = $1`, slot).Scan(&before, &reason)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && (before == nil || reason == nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the stop record of slot %q: %w", slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(*before)
	if err != nil {
		return nil, fmt.Errorf("read the stop record of slot %q: %w", slot, err)
	}
	return &Stop{Before: lsn, Reason: *reason}, nil
}

func nullString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullInt(n int32) *int32 {
	if n == 0 {
		return nil
	}
	return &n
}
