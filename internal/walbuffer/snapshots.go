package walbuffer

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
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
// Postgres 16 added pg_log_standby_snapshot(), which logs such a record at
// once (meant for logical decoding on standbys, valid on a primary). A relay
// whose slot retains NudgeFraction of its bound while it has confirmed most
// of that WAL (so the record would let the slot move) asks for one every
// NudgeEvery: the slot then keeps seconds of WAL, not 15 to 45. Each call
// writes one small WAL record and makes every logical walsender of the
// server serialize a snapshot (a small file); at one per NudgeEvery per
// relay near its bound, that is noise. Without the function (Postgres 13
// to 15) or without EXECUTE on it, the bound must leave room for 45 s of
// the server's WAL (docs/wal-buffer.md, `check`).
const (
	NudgeEvery    = 2 * time.Second
	NudgeFraction = 0.25
)

// LogSnapshotsFunc is the function a relay calls, and the one its role needs
// EXECUTE on.
const LogSnapshotsFunc = "pg_log_standby_snapshot()"

// CanLogSnapshots reports whether the connected role may log running-xacts
// records: a primary (not in recovery) of Postgres 16 or later, with
// EXECUTE on pg_log_standby_snapshot(). exists says whether the server has
// the function at all (Postgres 16 or later), for check's advice.
func CanLogSnapshots(ctx context.Context, db DB) (can, exists bool, err error) {
	err = db.QueryRow(ctx, `SELECT to_regprocedure('pg_log_standby_snapshot()') IS NOT NULL,
       CASE WHEN to_regprocedure('pg_log_standby_snapshot()') IS NULL OR pg_is_in_recovery() THEN false
            ELSE has_function_privilege(to_regprocedure('pg_log_standby_snapshot()'), 'EXECUTE') END`).Scan(&exists, &can)
	return can, exists, err
}

// LogSnapshot logs an xl_running_xacts record (pg_log_standby_snapshot()).
func LogSnapshot(ctx context.Context, db DB) error {
	_, err := db.Exec(ctx, `SELECT pg_log_standby_snapshot()`)
	return err
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
