package walbuffer

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// Postgres moves a logical slot's restart_lsn only when its walsender decodes
// an xl_running_xacts record, which the bgwriter logs every 15 s on a busy
// server, and then only to the snapshot serialized before the oldest
// transaction still in progress at that record (its restart_decoding_lsn).
// A transaction open across a record, however short, costs the slot that
// record's move: the slot keeps 15 s of the server's WAL between records,
// 30 s or more when a record finds a transaction open, whatever the relay
// confirms. Measured on Postgres 18 at 2.5 MB/s of WAL (TestWALBufferKafkaOutage,
// exactly-once): 37 MB before each move, 75 MB when one record found an
// insert in progress, 96.7 MB with the drain's burst on top, against a
// 96 MB limit.
//
// A relay whose slot retains NudgeFraction of its bound while it has
// confirmed most of that WAL (so that a record would let the slot move) logs
// one every NudgeEvery: the slot then keeps seconds of WAL, not 15 to 45.
// Two ways, by what the role may do (SnapshotMethodOf):
//
//   - pg_log_standby_snapshot() (Postgres 16+, EXECUTE granted: setup
//     --print-sql grants it): one small WAL record, nothing else.
//   - Else, on any version, a temporary logical slot created and dropped at
//     once (the relay's role has REPLICATION): Postgres logs the record
//     when a logical slot reserves its WAL, and again once the transactions
//     open at that record ended. It needs a free entry of
//     max_replication_slots for a moment, waits at most slotLockTimeout for
//     open transactions (the record is logged before that wait), and the
//     server logs "logical decoding found consistent point" each time.
//
// Each record makes every logical walsender of the server save a small
// snapshot file; at one per NudgeEvery per relay near its bound, that is
// noise.
const (
	NudgeEvery    = 2 * time.Second
	NudgeFraction = 0.25
)

// slotLockTimeout bounds how long a temporary slot's creation waits for the
// transactions open at its record: the record is in the WAL by then, and a
// transaction open that long holds the relay's slot anyway.
const slotLockTimeout = time.Second

// A SnapshotMethod is how a role logs running-xacts records.
type SnapshotMethod int

const (
	// NoSnapshots: a standby, or a role with neither way.
	NoSnapshots SnapshotMethod = iota
	// SnapshotFunction: pg_log_standby_snapshot().
	SnapshotFunction
	// SnapshotSlot: a temporary logical slot created and dropped.
	SnapshotSlot
)

func (m SnapshotMethod) String() string {
	switch m {
	case SnapshotFunction:
		return "pg_log_standby_snapshot()"
	case SnapshotSlot:
		return "a temporary logical slot"
	}
	return "none"
}

// SnapshotMethodOf returns how the connected role can log running-xacts
// records, and whether the server has pg_log_standby_snapshot() (16+), for
// check's advice.
func SnapshotMethodOf(ctx context.Context, db DB) (m SnapshotMethod, function bool, err error) {
	var granted, recovery, replication bool
	err = db.QueryRow(ctx, `SELECT to_regprocedure('pg_log_standby_snapshot()') IS NOT NULL,
       CASE WHEN to_regprocedure('pg_log_standby_snapshot()') IS NULL THEN false
            ELSE has_function_privilege(to_regprocedure('pg_log_standby_snapshot()'), 'EXECUTE') END,
       pg_is_in_recovery(),
       coalesce((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)`).Scan(&function, &granted, &recovery, &replication)
	switch {
	case err != nil || recovery:
		return NoSnapshots, function, err
	case granted:
		return SnapshotFunction, function, nil
	case replication:
		return SnapshotSlot, function, nil
	}
	return NoSnapshots, function, nil
}

// LogSnapshot logs an xl_running_xacts record with pg_log_standby_snapshot().
func LogSnapshot(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, `SELECT pg_log_standby_snapshot()`)
	return err
}

// LogSnapshotBySlot logs an xl_running_xacts record by creating a temporary
// logical slot named name and dropping it, on conn, a connection of the
// caller's own: a temporary slot belongs to its session, so a caller whose
// call failed must close conn, which drops any slot left (one that lingered
// on a pooled connection would hold WAL for as long as it lives).
func LogSnapshotBySlot(ctx context.Context, conn *pgx.Conn, name string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	ms := strconv.FormatInt(slotLockTimeout.Milliseconds(), 10)
	if _, err := tx.Exec(ctx, `SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)`, ms, strconv.FormatInt(2*slotLockTimeout.Milliseconds(), 10)); err != nil {
		return err
	}
	if err := pgslot.CreateTemporary(ctx, tx, name); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, name); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// SlotWAL returns what the slot makes the server keep (pg_current_wal_lsn()
// - restart_lsn) and how much of it the slot's client has not confirmed
// (pg_current_wal_lsn() - confirmed_flush_lsn); ok is false when the slot
// does not exist or the server is in recovery.
func SlotWAL(ctx context.Context, db DB, slot string) (retained, unconfirmed int64, ok bool, err error) {
	var r, u *int64
	err = db.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN NULL ELSE (pg_current_wal_lsn() - restart_lsn)::bigint END,
       CASE WHEN pg_is_in_recovery() THEN NULL ELSE (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint END
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&r, &u)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, 0, false, nil
	}
	if err != nil || r == nil || u == nil {
		return 0, 0, false, err
	}
	return *r, *u, true, nil
}

// ShouldNudge reports whether a relay whose slot retains retained bytes of
// WAL, unconfirmed of them not yet confirmed, should log a running-xacts
// record: the slot retains NudgeFraction of bound, and the relay confirmed
// more than half of it (else the slot waits for the relay, not for a
// record, and a record would not move it).
func ShouldNudge(retained, unconfirmed, bound int64) bool {
	return bound > 0 && float64(retained) >= NudgeFraction*float64(bound) && unconfirmed < retained/2
}
