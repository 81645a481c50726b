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
		pauses := s.stats.pauses.Load()
		err := s.emit(ctx, conn, asm, st, out, b)
		now = time.Now() // emit may have waited for the pipeline
		if s.stats.pauses.Load() != pauses {
			deadline = time.Time{} // the pause moved the read deadline
		}
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
		msg, at, err := s.receive(ctx, conn, lastRecv, deadAfter)
		now = at
		if err != nil {
			return err
		}
		if msg == nil {
			continue
		}
		lastRecv = now
		if err := s.message(ctx, conn, asm, st, msg, emit); err != nil {
			return err
		}
	}
}

// message handles one message of the receive loop; an error ends the stream.
func (s *Stream) message(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, msg pgproto3.BackendMessage, emit func(Batch) error) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		return s.copyData(ctx, conn, asm, st, msg.Data, emit)
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
	return nil
}

// copyData handles a CopyData message's payload: a primary keepalive (move
// the idle position, reply if asked) or XLogData.
func (s *Stream) copyData(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, data []byte, emit func(Batch) error) error {
	if len(data) == 0 {
		return &DecodeError{LSN: st.sent, Err: errors.New("empty CopyData")}
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
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
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return &DecodeError{LSN: st.sent, Err: err}
		}
		if err := s.xlogData(asm, xld, emit); err != nil {
			return err
		}
	}
	return nil
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
// status updates, or wal_sender_timeout would end the connection, for at
// most MaxUnread; then it pauses (see pause), so that the connection is never
// left unread for longer. A failed update ends the connection at once,
// without b. When ctx ends first (a Restart while the pipeline waited for
// Kafka), b is not emitted either, and the next connection reads it again.
func (s *Stream) emit(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, out chan<- Batch, b Batch) error {
	select {
	case out <- b:
		asm.emitted()
		return nil
	default:
	}
	// Nothing was read since b's last message: the connection has been
	// unread from now on.
	limit := time.Now().Add(s.cfg.MaxUnread)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		now := time.Now()
		if !now.Before(limit) {
			return s.pause(ctx, conn, asm, st, out, b)
		}
		if s.statusDue(st, now) {
			if err := s.sendStatus(ctx, conn, st, false); err != nil {
				return err
			}
		}
		t.Reset(earliest(s.wake(asm, st, now), limit).Sub(now))
		select {
		case out <- b:
			asm.emitted()
			return nil
		case <-ctx.Done():
			// Not handed on (a Restart, or the end): the assembler does
			// not count b as emitted, so the server's resend is read.
			return ctx.Err()
		case <-t.C:
		}
	}
}

// errResume ends a connection whose pause dropped data: the next
// connection, from the confirmed position, reads it again.
var errResume = errors.New("replication paused and dropped what the server sent meanwhile: reconnecting to read it again")

// pausePoll is how often a pause looks whether the pipeline takes its batch
// while the server sends nothing.
const pausePoll = 100 * time.Millisecond

// pause keeps the connection read while the pipeline does not take b: it
// reads what the server sends and drops it, answering keepalives and sending
// status updates as the receive loop does, until out takes b. The walsender
// thus never blocks in a write to this client, where Postgres cannot end it
// (its FATAL cannot be sent either): the checkpointer, which ends the
// walsender of a slot past max_slot_wal_keep_size, would wait on it, and
// every checkpoint of the server with it (issue 35: 9 minutes without a
// checkpoint while Kafka was frozen).
//
// Nothing is lost: what was dropped was neither handed on nor confirmed,
// and once out takes b the connection ends (errResume) so that the next one,
// from the confirmed position, reads it again, the assembler dropping what
// was emitted already. If nothing was dropped the connection streams on. No
// idle position is confirmed while paused: b is not emitted yet. Memory stays
// bounded: what is dropped is not kept.
func (s *Stream) pause(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, out chan<- Batch, b Batch) error {
	began := time.Now()
	s.stats.pauses.Add(1)
	s.stats.pausedSince.Store(began.UnixNano())
	defer s.stats.pausedSince.Store(0)
	log := s.cfg.Logger
	log.Warn("replication paused: the pipeline took no batch for "+s.cfg.MaxUnread.String()+
		"; reading and dropping what the server sends, so that its walsender never blocks (a blocked walsender holds up checkpoints), and reading it again once the pipeline moves",
		"slot", s.cfg.Slot, "confirmed_lsn", pglogrepl.LSN(s.confirmed.Load()).String(), "batch_commit_lsn", b.CommitLSN.String())
	var dropped, droppedBytes int64
	deadAfter := max(3*s.cfg.StatusInterval, 15*time.Second)
	lastRecv := began
	for {
		select {
		case out <- b:
			asm.emitted()
			paused := time.Since(began).Round(time.Millisecond)
			if dropped == 0 {
				log.Info("replication resumed: the pipeline took the batch, nothing was dropped", "slot", s.cfg.Slot, "paused_for", paused)
				return nil
			}
			log.Info("replication resuming: the pipeline took the batch; reconnecting to read again what was dropped",
				"slot", s.cfg.Slot, "paused_for", paused, "dropped_messages", dropped, "dropped_bytes", droppedBytes)
			return errResume
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		now := time.Now()
		if s.statusDue(st, now) {
			if err := s.sendStatus(ctx, conn, st, now.Sub(lastRecv) > s.cfg.StatusInterval); err != nil {
				return err
			}
		}
		if err := conn.Conn().SetReadDeadline(earliest(now.Add(pausePoll), s.wake(asm, st, now))); err != nil {
			return fmt.Errorf("set read deadline: %w", err)
		}
		if ctx.Err() != nil { // a cancel before the deadline above would be lost
			return ctx.Err()
		}
		msg, now, err := s.receive(ctx, conn, lastRecv, deadAfter)
		if err != nil {
			return err
		}
		if msg == nil {
			continue
		}
		lastRecv = now
		n, err := s.pausedMessage(ctx, conn, st, msg)
		if err != nil {
			return err
		}
		if n > 0 {
			dropped++
			droppedBytes += int64(n)
		}
	}
}

// receive reads one message under the read deadline already set, and
// returns when it was read. A deadline that passed is no error (nil
// message) unless the server has been silent for more than deadAfter since
// lastRecv: TCP alone would take many minutes to tell that the network is
// gone. Both the receive loop and the paused loop read through it.
func (s *Stream) receive(ctx context.Context, conn *pgconn.PgConn, lastRecv time.Time, deadAfter time.Duration) (pgproto3.BackendMessage, time.Time, error) {
	msg, err := conn.ReceiveMessage(context.Background())
	now := time.Now()
	if err == nil {
		s.stats.lastMessageAt.Store(now.UnixNano())
		return msg, now, nil
	}
	if ctx.Err() != nil {
		return nil, now, ctx.Err()
	}
	if pgconn.Timeout(err) {
		if silent := now.Sub(lastRecv); silent > deadAfter {
			return nil, now, fmt.Errorf("no message from the server for %s", silent.Round(time.Second))
		}
		return nil, now, nil
	}
	return nil, now, s.classify("receive", err)
}

// pausedMessage handles a message read while paused: a keepalive is
// answered (its WAL end is not confirmed: the stream is not idle), the
// size of an XLogData message, dropped, is returned, and an error or the
// end of the stream ends the connection.
func (s *Stream) pausedMessage(ctx context.Context, conn *pgconn.PgConn, st *statusState, msg pgproto3.BackendMessage) (int, error) {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return 0, &DecodeError{LSN: st.sent, Err: errors.New("empty CopyData")}
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			pkm, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return 0, &DecodeError{LSN: st.sent, Err: err}
			}
			storeMax(&s.stats.serverWALEnd, uint64(pkm.ServerWALEnd))
			if pkm.ReplyRequested {
				return 0, s.sendStatus(ctx, conn, st, false)
			}
		case pglogrepl.XLogDataByteID:
			return len(msg.Data), nil
		}
	case *pgproto3.ErrorResponse:
		// The walsender ended (pg_terminate_backend, its slot
		// invalidated, a shutdown): the next connection says why.
		return 0, s.classify("stream", pgconn.ErrorResponseToPgError(msg))
	case *pgproto3.CopyDone:
		return 0, errors.New("server ended the replication stream")
	}
	return 0, nil
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
