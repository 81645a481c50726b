package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// RefillProgress is how far a refill of a slot got: every event before
// Position (in its order, of its Table-th outbox table) of a transaction
// older than Xmin was acknowledged by Kafka or stored in the retry table. A
// refill from the same checkpoint (From) that follows a killed one skips
// those (see the refill in internal/relay).
type RefillProgress struct {
	ID       string        `json:"id"`
	From     pglogrepl.LSN `json:"from"` // the checkpoint the refill started from
	Xmin     uint64        `json:"xmin"` // its snapshot's xmin (a full xid)
	Table    int           `json:"table"`
	Position []*string     `json:"position"` // the order's values as text; nil for NULL
	Sent     int64         `json:"sent"`     // events handled, over every refill from From
}

// SaveRefillProgress records p in slot's checkpoint row while epoch leads
// it; it returns ErrFenced when another relay took the slot over.
func (s *Store) SaveRefillProgress(ctx context.Context, slot string, epoch int64, p RefillProgress) error {
	if s.err != nil {
		return s.err
	}
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE `+s.table+` SET refill_progress = $3 WHERE slot_name = $1 AND epoch = $2`, slot, epoch, b)
	if err != nil {
		return fmt.Errorf("record the refill's progress in %s: %w", s.table, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrFenced
	}
	return nil
}

// LoadRefillProgress returns the progress recorded for slot, and false when
// there is none (or the column is missing: a table not yet upgraded).
func (s *Store) LoadRefillProgress(ctx context.Context, slot string) (RefillProgress, bool, error) {
	if s.err != nil {
		return RefillProgress{}, false, s.err
	}
	var b []byte
	err := s.pool.QueryRow(ctx, `SELECT (to_jsonb(c)->'refill_progress')::text FROM `+s.table+` c WHERE slot_name = $1`, slot).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && (b == nil || string(b) == "null")) {
		return RefillProgress{}, false, nil
	}
	if err != nil {
		return RefillProgress{}, false, fmt.Errorf("read the refill's progress in %s: %w", s.table, err)
	}
	var p RefillProgress
	if err := json.Unmarshal(b, &p); err != nil {
		return RefillProgress{}, false, fmt.Errorf("the refill's progress in %s is unreadable (%v): set refill_progress to NULL", s.table, err)
	}
	return p, true, nil
}
