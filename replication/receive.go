package replication

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// stream is the receive loop of one connection.
func (s *Stream) stream(ctx context.Context, conn *pgconn.PgConn, asm *assembler, out chan<- Batch, st *statusState) error {
	// The server may stay silent while we keep replying; a status update asks
	// for a reply after StatusInterval of silence, and no answer by deadAfter
	// means the network is gone (TCP alone would take many minutes to tell).
	deadAfter := max(3*s.cfg.StatusInterval, 15*time.Second)
	lastRecv := time.Now()
	if err := s.sendStatus(ctx, conn, st, false); err != nil {
		return err
	}
	// Receives use a socket read deadline and context.Background(): a
	// context per receive (pgconn watches it with a goroutine hand-off)
	// cost more than decoding the row. Cancelling ctx sets an immediate
	// deadline; the loop checks ctx after setting each deadline, so a cancel
	// is never lost between the two.
	stopCancelWatch := context.AfterFunc(ctx, func() { conn.Conn().SetReadDeadline(time.Now()) })
	defer stopCancelWatch()
	// The deadline is moved only when it must come sooner, or has passed: a
	// deadline that comes early only wakes the loop early, and setting one
	// per message (a backlog's rows each arrive as a message) cost as much
	// as decoding it.
	var deadline time.Time
	now := time.Now()
	var lastCommit time.Time // when the previous transaction's end was read
	emit := func(b Batch) error {
		if b.Last && s.cfg.ReceiveLinger > 0 {
			// Transactions coming close behind each other: let the next
			// read take several at once (lingerReader).
			if now.Sub(lastCommit) < s.cfg.ReceiveLinger {
				s.reader.Load().lingerAfter(now, s.cfg.ReceiveLinger)
			}
			lastCommit = now
		}
		err := s.emit(ctx, conn, asm, st, out, b)
		now = time.Now() // emit may have waited for the pipeline
		return err
	}
	for {
		if s.statusDue(st, now) {
			if err := s.sendStatus(ctx, conn, st, now.Sub(lastRecv) > s.cfg.StatusInterval); err != nil {
				return err
			}
		}
		if wake := s.wake(asm, st, now); wake.Before(deadline) || !deadline.After(now) {
			if err := conn.Conn().SetReadDeadline(wake); err != nil {
				return fmt.Errorf("set read deadline: %w", err)
			}
			deadline = wake
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		msg, err := conn.ReceiveMessage(context.Background())
		now = time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if pgconn.Timeout(err) {
				if silent := now.Sub(lastRecv); silent > deadAfter {
					return fmt.Errorf("no message from the server for %s", silent.Round(time.Second))
				}
				continue
			}
			return s.classify("receive", err)
		}
		lastRecv = now
		s.stats.lastMessageAt.Store(lastRecv.UnixNano())

		switch msg := msg.(type) {
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				return &DecodeError{LSN: st.sent, Err: errors.New("empty CopyData")}
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return &DecodeError{LSN: st.sent, Err: err}
				}
				s.advanceIdle(asm, pkm.ServerWALEnd)
				if pkm.ReplyRequested {
					if err := s.sendStatus(ctx, conn, st, false); err != nil {
						return err
					}
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return &DecodeError{LSN: st.sent, Err: err}
				}
				if err := s.xlogData(asm, xld, emit); err != nil {
					return err
				}
			}
		case *pgproto3.NoticeResponse:
			// Postgres 18 leaves out a change written while the publication did not
			// exist, with a warning, where 17 and older fail: the warning arrives
			// before the transaction's commit, so stopping here confirms nothing
			// past the change, and every start stops the same way, as on 17.
			if n := (*pgconn.Notice)(pgconn.ErrorResponseToPgError((*pgproto3.ErrorResponse)(msg))); SkippedPublication(n) {
				return s.publicationAtSlotError("stream", (*pgconn.PgError)(n))
			}
		case *pgproto3.ErrorResponse:
			return s.classify("stream", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return errors.New("server ended the replication stream")
		}
	}
}

// xlogData handles one XLogData message of the receive loop: decode it, hand
// a ready Batch to emit, then confirm the server's WAL end if the stream is
// idle. A decode error returns before anything is confirmed past the message.
func (s *Stream) xlogData(asm *assembler, xld pglogrepl.XLogData, emit func(Batch) error) error {
	b, ok, err := asm.handle(xld.WALStart, xld.WALData)
	if err != nil {
		return err
	}
	if ok {
		if err := emit(b); err != nil {
			return err
		}
	}
	s.advanceIdle(asm, xld.ServerWALEnd)
	return nil
}

// advanceIdle confirms the server's WAL end when nothing is in flight (DESIGN
// invariant 3): no transaction open or partly emitted, every emitted one
// confirmed. The walsender has then decoded everything before walEnd, and a
// quiet outbox in a busy database does not pin WAL.
func (s *Stream) advanceIdle(asm *assembler, walEnd pglogrepl.LSN) {
	storeMax(&s.stats.serverWALEnd, uint64(walEnd))
	confirmed := pglogrepl.LSN(s.confirmed.Load())
	if !asm.idle() || confirmed < asm.lastEnd || walEnd <= confirmed {
		return
	}
	if s.cfg.Idle != nil {
		s.cfg.Idle(walEnd) // recorded, then confirmed, by the caller
		return
	}
	storeMax(&s.confirmed, uint64(walEnd))
}

// emit hands b to out and then tells the assembler that it did. While out is
// full (the pipeline waits for Kafka, maybe for minutes) it keeps sending
// status updates, or wal_sender_timeout would end the connection. A failed
// update does not drop b: it is delivered first, then the error ends the
// connection. When ctx ends first (a Restart while the pipeline waited for
// Kafka), b is not emitted, and the next connection reads it again.
func (s *Stream) emit(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, out chan<- Batch, b Batch) error {
	select {
	case out <- b:
		asm.emitted()
		return nil
	default:
	}
	var connErr error
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		now := time.Now()
		if connErr == nil && s.statusDue(st, now) {
			connErr = s.sendStatus(ctx, conn, st, false)
		}
		t.Reset(s.wake(asm, st, now).Sub(now))
		select {
		case out <- b:
			asm.emitted()
			return connErr
		case <-ctx.Done():
			// Not handed on (a Restart, or the end): the assembler does
			// not count b as emitted, so the server's resend is read.
			return ctx.Err()
		case <-t.C:
		}
	}
}
