package replication

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// statusState is what the last standby status update said, and when.
type statusState struct {
	sent pglogrepl.LSN
	at   time.Time
}

// fastStatus is the status cadence while confirmations are expected, so that
// confirmed_flush_lsn follows the relay's progress within a tenth of a second
// (a status update is a 34-byte message; the slot's position is what `lag`,
// the benchmark and WAL retention see).
func (s *Stream) fastStatus() time.Duration { return min(s.cfg.StatusInterval, 100*time.Millisecond) }

// statusDue reports whether a status update should be sent now: a new
// confirmed position after fastStatus, or anything after StatusInterval.
func (s *Stream) statusDue(st *statusState, now time.Time) bool {
	since := now.Sub(st.at)
	if pglogrepl.LSN(s.confirmed.Load()) > st.sent && since >= s.fastStatus() {
		return true
	}
	return since >= s.cfg.StatusInterval
}

// wake returns when to look at the status next: at StatusInterval, or sooner
// while something emitted may get confirmed (a Confirm cannot interrupt a
// blocked receive, so it is polled).
func (s *Stream) wake(asm *assembler, st *statusState, now time.Time) time.Time {
	next := st.at.Add(s.cfg.StatusInterval)
	if asm.lastEnd > st.sent || !asm.idle() || pglogrepl.LSN(s.confirmed.Load()) > st.sent {
		if fast := now.Add(s.fastStatus()); fast.Before(next) {
			next = fast
		}
	}
	if next.Before(now) {
		next = now
	}
	return next
}

// sendStatus reports the confirmed position as written, flushed and applied.
// All three are set: pglogrepl fills zero ones from the write position, and a
// position must never be reported that was not confirmed. Nothing is sent
// while the position is unknown (0).
func (s *Stream) sendStatus(ctx context.Context, conn *pgconn.PgConn, st *statusState, reply bool) error {
	lsn := pglogrepl.LSN(s.confirmed.Load())
	if lsn == 0 {
		return nil
	}
	now := time.Now()
	// pglogrepl ignores ctx: a server that reads nothing (a dead network)
	// must not hold the receive loop in this write, away from the socket.
	if err := conn.Conn().SetWriteDeadline(now.Add(s.cfg.MaxUnread)); err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: lsn,
		WALFlushPosition: lsn,
		WALApplyPosition: lsn,
		ClientTime:       now,
		ReplyRequested:   reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	st.sent, st.at = lsn, now
	return nil
}
