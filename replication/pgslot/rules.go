package pgslot

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
)

// The rules a slot must meet for the relay, each written once: the stream's
// start checks, setup and check, migrate, and checkpoint set ask them here.

// Plugin is the output plugin the relay decodes: a slot created with
// another one cannot stream to it.
const Plugin = "pgoutput"

// Conditions a slot can fail (test with errors.Is).
var (
	// ErrPlugin: the slot is physical, or decodes with another output
	// plugin than pgoutput.
	ErrPlugin = errors.New("replication slot does not use pgoutput")
	// ErrDatabase: the slot was created in another database than the
	// connection's.
	ErrDatabase = errors.New("replication slot belongs to another database")
)

// An UnusableError says why a slot cannot stream to the relay from the
// database Read ran in. It wraps ErrPlugin or ErrDatabase.
type UnusableError struct {
	Slot   string
	Reason string // what is wrong, after the slot's name: `uses plugin "wal2json", not pgoutput`
	Fix    string // how to fix it
	Err    error  // ErrPlugin or ErrDatabase
}

func (e *UnusableError) Error() string {
	return fmt.Sprintf("replication slot %q %s: %s", e.Slot, e.Reason, e.Fix)
}

func (e *UnusableError) Unwrap() error { return e.Err }

// Usable returns nil when the slot can stream to the relay from the database
// Read ran in: a logical slot, decoding with pgoutput, of this database.
// Otherwise it returns an *UnusableError.
func (s Slot) Usable() error {
	const recreate = "drop it and create it with pgoutput, or use a pgoutput slot"
	switch {
	case s.Type != "logical":
		return &UnusableError{Slot: s.Name, Reason: fmt.Sprintf("is a %s slot, not a logical one", s.Type), Fix: recreate, Err: ErrPlugin}
	case s.Plugin != Plugin:
		return &UnusableError{Slot: s.Name, Reason: fmt.Sprintf("uses plugin %q, not %s", s.Plugin, Plugin), Fix: recreate, Err: ErrPlugin}
	case s.Database != s.CurrentDatabase:
		return &UnusableError{Slot: s.Name, Reason: fmt.Sprintf("belongs to database %q, not %q", s.Database, s.CurrentDatabase),
			Fix: "fix the DSN's database or the slot name", Err: ErrDatabase}
	}
	return nil
}

// A BeyondWALError refuses a position the server's WAL has not reached yet:
// starting or checkpointing there would skip every event committed until the
// WAL reaches it, including events not written yet.
type BeyondWALError struct {
	LSN, Current pglogrepl.LSN
}

func (e *BeyondWALError) Error() string {
	return fmt.Sprintf("%s is beyond the server's current WAL position %s: every event committed until the WAL reaches it would be skipped",
		e.LSN, e.Current)
}

// Reached returns nil when the server's WAL, as Read saw it, has reached
// lsn, and a *BeyondWALError when it has not.
func (s Slot) Reached(lsn pglogrepl.LSN) error {
	cur, err := s.CurrentWAL()
	if err != nil {
		return err
	}
	return reached(lsn, cur)
}

// CurrentWAL returns the server's current WAL position as Read saw it (the
// replay position on a standby).
func (s Slot) CurrentWAL() (pglogrepl.LSN, error) {
	cur, err := pglogrepl.ParseLSN(s.CurrentWALLSN)
	if err != nil {
		return 0, fmt.Errorf("the server's current WAL position %q: %w", s.CurrentWALLSN, err)
	}
	return cur, nil
}

// ReachedNow asks the server for its current WAL position (the replay
// position on a standby) and returns nil when it has reached lsn, a
// *BeyondWALError when it has not, or the error of asking.
func ReachedNow(ctx context.Context, q Querier, lsn pglogrepl.LSN) error {
	current, _, err := ReadWAL(ctx, q)
	if err != nil {
		return err
	}
	cur, err := pglogrepl.ParseLSN(current)
	if err != nil {
		return fmt.Errorf("the server's current WAL position %q: %w", current, err)
	}
	return reached(lsn, cur)
}

// ReadWAL returns the server's current WAL position (the replay position on
// a standby), as Read's Slot.CurrentWALLSN, and the server's clock.
func ReadWAL(ctx context.Context, q Querier) (lsn string, now time.Time, err error) {
	if err := q.QueryRow(ctx, `SELECT now(), (`+currentWAL+`)::text`).Scan(&now, &lsn); err != nil {
		return "", time.Time{}, fmt.Errorf("read the server's WAL position: %w", err)
	}
	return lsn, now, nil
}

func reached(lsn, cur pglogrepl.LSN) error {
	if lsn > cur {
		return &BeyondWALError{LSN: lsn, Current: cur}
	}
	return nil
}
