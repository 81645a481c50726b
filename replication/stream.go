package replication

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// A Stream is one logical replication connection to Postgres with pgoutput
// proto_version 1. Run streams; Confirm and Stats may be called from any
// goroutine while it does.
type Stream struct {
	cfg       Config
	confirmed atomic.Uint64 // highest LSN confirmed (by Confirm or idle advancement)
	stats     counters
	running   atomic.Bool
	lastPID   atomic.Uint32                 // backend pid of the walsender that last streamed for this Stream
	server    atomic.Pointer[pgslot.Server] // what the connections must reach (Config.Server, else the first one's)
	// endSession cancels the current connection's context (Restart); nil
	// between connections.
	endSession atomic.Pointer[context.CancelCauseFunc]
}

// ErrRestarted is the cause of a connection Restart ended.
var ErrRestarted = errors.New("replication connection closed on request (the server is shutting down)")

// Restart ends the current replication connection, as a lost connection
// would: Run reconnects with its backoff and resumes from the confirmed
// position. A no-op between connections. The relay calls it when the server
// refuses its checkpoint save because it is shutting down: a fast shutdown
// waits for every walsender's client to confirm all the WAL it was sent,
// which the relay confirms only once saved, so holding on to the
// connection would hold the shutdown up until pg_ctl gives up.
func (s *Stream) Restart() {
	if end := s.endSession.Load(); end != nil {
		(*end)(ErrRestarted)
	}
}

// New returns a Stream for cfg. It neither connects nor starts goroutines;
// cfg is validated by Run.
func New(cfg Config) *Stream {
	s := &Stream{cfg: cfg.withDefaults()}
	if cfg.Server != nil {
		srv := *cfg.Server
		s.server.Store(&srv)
	}
	return s
}

// Server returns the server the stream streams from (Config.Server, or what
// its first connection reached), nil before it connected.
func (s *Stream) Server() *pgslot.Server { return s.server.Load() }

// Confirm records that every transaction with EndLSN <= lsn has been fully
// handled (for the relay: acknowledged by the sink, and everything before it).
// It never moves the position backwards and is safe for concurrent use. The
// position reaches Postgres with the next standby status update, which comes
// within min(StatusInterval, 1s) once something new was confirmed.
func (s *Stream) Confirm(lsn pglogrepl.LSN) { storeMax(&s.confirmed, uint64(lsn)) }

func storeMax(v *atomic.Uint64, n uint64) bool {
	for {
		old := v.Load()
		if n <= old {
			return false
		}
		if v.CompareAndSwap(old, n) {
			return true
		}
	}
}

// Stats is a snapshot of a Stream's counters since New.
type Stats struct {
	ReceivedTransactions uint64 // transactions emitted (Last batches), including ones without rows
	ReceivedRows         uint64 // rows emitted
	IgnoredUpdates       uint64
	IgnoredDeletes       uint64
	IgnoredTruncates     uint64 // one per truncated relation
	// Messages proto_version 1 does not send, skipped because they carry no
	// row (see the package doc): Stream Aborts, and messages of an unknown
	// type between transactions.
	SkippedStreamAborts    uint64
	SkippedUnknownMessages uint64
	SkippedTransactions    uint64 // already delivered: before the start LSN, or resent after a reconnect
	Reconnects             uint64
	ConfirmedLSN           pglogrepl.LSN // what status updates report to the server
	ServerWALEnd           pglogrepl.LSN // latest WAL end reported by the server
	LastMessageAt          time.Time     // zero before the first message
	Streaming              bool          // a replication connection is up
}

// Stats returns a snapshot of the counters. Safe for concurrent use.
func (s *Stream) Stats() Stats {
	st := Stats{
		ReceivedTransactions:   s.stats.transactions.Load(),
		ReceivedRows:           s.stats.rows.Load(),
		IgnoredUpdates:         s.stats.ignoredUpdates.Load(),
		IgnoredDeletes:         s.stats.ignoredDeletes.Load(),
		IgnoredTruncates:       s.stats.ignoredTruncates.Load(),
		SkippedStreamAborts:    s.stats.unsolicited[unsolicitedStreamAbort].Load(),
		SkippedUnknownMessages: s.stats.unsolicited[unsolicitedUnknown].Load(),
		SkippedTransactions:    s.stats.skipped.Load(),
		Reconnects:             s.stats.reconnects.Load(),
		ConfirmedLSN:           pglogrepl.LSN(s.confirmed.Load()),
		ServerWALEnd:           pglogrepl.LSN(s.stats.serverWALEnd.Load()),
		Streaming:              s.stats.streaming.Load(),
	}
	if ns := s.stats.lastMessageAt.Load(); ns != 0 {
		st.LastMessageAt = time.Unix(0, ns)
	}
	return st
}

// Run streams the committed transactions with CommitLSN >= start into out, in
// commit order, as Batches (see Batch). start 0 means the slot's
// confirmed_flush_lsn; otherwise start is normally the relay's checkpoint, and
// earlier transactions the server sends again (the slot can go backwards after
// a crash) are skipped.
//
// Run blocks until ctx is done, returning an error that wraps ctx.Err(), or
// until a non-retryable error: one wrapping ErrSlotMissing, ErrSlotPlugin,
// ErrSlotDatabase, ErrSlotActive, ErrPublicationMissing, ErrAuth,
// ErrPermission or ErrConfig, or a *DecodeError. Lost connections are retried
// with backoff. Run must not be called again while it runs; a Stream may be
// Run again after Run returned.
func (s *Stream) Run(ctx context.Context, start pglogrepl.LSN, out chan<- Batch) error {
	if err := s.cfg.validate(); err != nil {
		return &fatalError{msg: err.Error(), sentinel: ErrConfig}
	}
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("replication: Run called while already running")
	}
	defer s.running.Store(false)

	storeMax(&s.confirmed, uint64(start))
	log := s.cfg.Logger
	asm := newAssembler(s.cfg, start, &s.stats)
	defer asm.logSkips()
	// Jittered, so that many relays do not reconnect in step.
	bo := backoff.Backoff{Min: s.cfg.ReconnectMin, Max: s.cfg.ReconnectMax}
	for {
		streamed, err := s.session(ctx, asm, out)
		s.stats.streaming.Store(false)
		if ctx.Err() != nil {
			return fmt.Errorf("replication stream: %w", ctx.Err())
		}
		if isFatal(err) {
			return err
		}
		if errors.Is(err, errSlotBusy) && !errors.Is(err, errOwnWalsender) {
			// Someone else holds the slot: a rival relay took over (or
			// holds it since before this Run). This process does not
			// lead now; the caller waits as a standby rather than
			// reconnecting in a loop. (Our own earlier walsender, which
			// the server ends after wal_sender_timeout, is waited for.)
			return &fatalError{
				msg:      fmt.Sprintf("replication slot %q is active for another process", s.cfg.Slot),
				sentinel: ErrSlotActive, cause: err,
			}
		}
		if streamed {
			bo.Reset()
		}
		delay := bo.Next()
		s.stats.reconnects.Add(1)
		log.Warn("replication connection lost, reconnecting", "error", err, "retry_in", delay,
			"slot", s.cfg.Slot, "confirmed_lsn", pglogrepl.LSN(s.confirmed.Load()).String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("replication stream: %w", ctx.Err())
		case <-t.C:
		}
		asm.reset()
	}
}

// readBufferSize is the replication connection's read buffer.
const readBufferSize = 256 << 10

// errSlotBusy: START_REPLICATION found the slot active for another process.
var errSlotBusy = errors.New("replication slot is active for another process")

// errOwnWalsender: the slot is held by the walsender of this Stream's
// earlier connection, which the server has not yet seen die (a network cut
// heals before wal_sender_timeout). Retried: it ends within that timeout.
var errOwnWalsender = errors.New("replication slot is still held by this relay's previous connection")

func isFatal(err error) bool {
	var f *fatalError
	var d *DecodeError
	var g *gapError
	var sg *pgslot.GapError
	return errors.As(err, &f) || errors.As(err, &d) || errors.As(err, &g) || errors.As(err, &sg)
}

// session runs one connection: connect, check the slot, START_REPLICATION,
// stream. streamed reports whether replication started, which resets backoff.
func (s *Stream) session(parent context.Context, asm *assembler, out chan<- Batch) (streamed bool, err error) {
	ctx, end := context.WithCancelCause(parent)
	s.endSession.Store(&end)
	defer func() {
		s.endSession.Store(nil)
		if parent.Err() == nil && errors.Is(context.Cause(ctx), ErrRestarted) {
			err = ErrRestarted
		}
		end(nil)
	}()
	conn, err := s.connect(ctx)
	if err != nil {
		return false, err
	}
	st := &statusState{}
	defer func() {
		// Closing is also the shutdown path, where ctx is done: give the final
		// status update and Terminate a moment of their own.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if streamed && !conn.IsClosed() {
			_ = s.sendStatus(cctx, conn, st, false)
		}
		_ = conn.Close(cctx)
	}()

	slotLSN, err := s.checkSlot(ctx, conn)
	if err != nil {
		return false, err
	}
	if err := s.checkServer(ctx, conn, slotLSN); err != nil {
		return false, err
	}
	// Confirming the slot's own position is a no-op for the server, and it
	// gives status updates a non-zero value when Run started at 0. Never send
	// less: Postgres 15 lets confirmed_flush_lsn move backwards.
	storeMax(&s.confirmed, uint64(slotLSN))
	from := pglogrepl.LSN(s.confirmed.Load())
	err = pglogrepl.StartReplication(ctx, conn, s.cfg.Slot, from, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(s.cfg.Publication)},
	})
	if err != nil {
		err = s.classify("start replication", err)
		if errors.Is(err, errSlotBusy) && s.lastPID.Load() != 0 {
			// Taken between the check and the start: look again, which
			// tells our own lingering walsender from a rival.
			return false, fmt.Errorf("%w: %w", errOwnWalsender, err)
		}
		return false, err
	}
	s.stats.streaming.Store(true)
	s.lastPID.Store(conn.PID())
	if s.cfg.Started != nil {
		s.cfg.Started()
	}
	s.cfg.Logger.Info("replication started", "slot", s.cfg.Slot, "publication", s.cfg.Publication, "start_lsn", from.String())
	return true, s.stream(ctx, conn, asm, out, st)
}

func (s *Stream) connect(ctx context.Context) (*pgconn.PgConn, error) {
	pcfg, err := pgconn.ParseConfig(s.cfg.DSN)
	if err != nil {
		// ParseConfigError redacts passwords only best effort: keep the DSN out.
		return nil, &fatalError{msg: "replication: DSN cannot be parsed: check its syntax", sentinel: ErrConfig, cause: errors.Unwrap(err)}
	}
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = s.cfg.ApplicationName
	if s.cfg.WalSenderTimeout > 0 {
		pcfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(s.cfg.WalSenderTimeout.Milliseconds(), 10)
	}
	if pcfg.ConnectTimeout == 0 {
		pcfg.ConnectTimeout = 10 * time.Second
	}
	// pgproto3 reads at most 8 KiB per read call: on a backlog that was a
	// system call per ~20 rows. A larger buffer under it reads what the
	// socket holds at once.
	pcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		return pgproto3.NewFrontend(bufio.NewReaderSize(r, readBufferSize), w)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, s.classify("connect", err)
	}
	return conn, nil
}

// checkSlot checks before START_REPLICATION what would otherwise fail later or
// obscurely, and returns the slot's confirmed_flush_lsn.
func (s *Stream) checkSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	slot, err := pgslot.Read(ctx, pgslot.ReplicationConn(conn), s.cfg.Slot)
	switch {
	case errors.Is(err, pgslot.ErrNotFound):
		if confirmed := pglogrepl.LSN(s.confirmed.Load()); confirmed != 0 {
			// Gone while this stream had a position in it (dropped, or
			// the server failed over to one that never had it): what
			// committed since was never sent (DESIGN invariant 14).
			return 0, &pgslot.GapError{Slot: s.cfg.Slot, Cause: pgslot.CauseSlotMissing, From: confirmed}
		}
		return 0, &fatalError{msg: err.Error(), sentinel: ErrSlotMissing}
	case err != nil:
		return 0, s.classify("check slot", err)
	}
	if err := slot.Usable(); err != nil {
		return 0, &fatalError{msg: err.Error(), sentinel: errors.Unwrap(err)} // ErrSlotPlugin or ErrSlotDatabase
	}
	if slot.Lost() {
		// Invalidated while this stream was away from it: it cannot
		// stream again, and what it had not decoded is gone.
		return 0, &pgslot.GapError{Slot: s.cfg.Slot, Cause: pgslot.CauseSlotLost, From: pglogrepl.LSN(s.confirmed.Load())}
	}
	if slot.Active && slot.ActivePID != nil {
		if own := s.lastPID.Load(); own != 0 && uint32(*slot.ActivePID) == own {
			return 0, fmt.Errorf("check slot: %w: %w (walsender pid %d)", errSlotBusy, errOwnWalsender, own)
		}
		return 0, fmt.Errorf("check slot: %w (walsender pid %d)", errSlotBusy, *slot.ActivePID)
	}
	// A walsender accepts only the simple query protocol: literals, not parameters.
	res, err := conn.Exec(ctx, `SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = `+quoteLiteral(s.cfg.Publication)).ReadAll()
	if err != nil {
		return 0, s.classify("check publication", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return 0, &fatalError{msg: fmt.Sprintf("publication %q does not exist in database %q: create it with \"outbox-relay setup\", then run \"outbox-relay check\": "+
			"a publication created after the slot's position cannot decode what was written before it, and check then prints how to start past that point", s.cfg.Publication, slot.CurrentDatabase), sentinel: ErrPublicationMissing}
	}
	lsn, err := slot.Confirmed()
	if err != nil {
		return 0, fmt.Errorf("check slot: %w", err)
	}
	return lsn, nil
}

// checkServer refuses a connection on which streaming would not continue
// from what this stream confirmed (DESIGN invariant 14): after a failover or
// a DSN that now resolves elsewhere, another system, a timeline that forked
// before the confirmed position, or a slot confirmed ahead of it (a slot of
// the same name created on the new server, or advanced by another client).
// The relay checks its checkpoint before Run (pgslot.Verify); this covers
// the reconnections of a running stream.
func (s *Stream) checkServer(ctx context.Context, conn *pgconn.PgConn, slotLSN pglogrepl.LSN) error {
	srv, err := pgslot.Identify(ctx, conn)
	if err != nil {
		return s.classify("identify the server", err)
	}
	want := s.server.Load()
	if want == nil {
		s.server.CompareAndSwap(nil, &srv)
		want = &srv
	}
	confirmed := pglogrepl.LSN(s.confirmed.Load())
	gap := &pgslot.GapError{Slot: s.cfg.Slot, From: confirmed, To: slotLSN, Recorded: want.Server, Now: srv.Server}
	switch ok, fork := srv.Continues(want.Timeline, confirmed); {
	case srv.SystemID != want.SystemID:
		gap.Cause = pgslot.CauseOtherSystem
	case srv.Timeline < want.Timeline:
		// The timeline went back: this server is the one the stream's
		// server was promoted from, brought back (split brain).
		if err := pgslot.Superseded(s.cfg.Slot, confirmed, srv, *want, "the server the relay streamed from until this reconnection"); err != nil {
			return err
		}
		gap.Cause, gap.Fork = pgslot.CauseForked, fork
	case confirmed != 0 && !ok:
		gap.Cause, gap.Fork = pgslot.CauseForked, fork
	case confirmed != 0 && slotLSN > confirmed:
		gap.Cause = pgslot.CauseSlotAhead
	default:
		if srv.Timeline != want.Timeline {
			s.cfg.Logger.Info("the server is on a new timeline that continues from the confirmed position (a promotion)",
				"slot", s.cfg.Slot, "timeline", srv.Timeline, "previous_timeline", want.Timeline, "confirmed_lsn", confirmed.String())
			s.server.Store(&srv)
		}
		return nil
	}
	return gap
}

// publicationAtSlotError is the error for a publication that did not exist at a
// change the slot must decode: Postgres 17 and older fail there ("publication does
// not exist"), 18 leaves the change out with a warning (SkippedPublication).
func (s *Stream) publicationAtSlotError(op string, err error) error {
	return &fatalError{msg: fmt.Sprintf("%s: publication %q does not exist at the slot's position: it was created (or dropped and recreated) after slot %q's confirmed position, "+
		"and the slot cannot decode past that point with this publication; start past it with "+
		"\"outbox-relay run --start-lsn <pg_current_wal_lsn() now> --force\" (\"outbox-relay check\" prints that position; events committed in between are skipped: re-insert or replay them), "+
		"or drop the slot and run \"outbox-relay setup\" to create slot (and publication) again", op, s.cfg.Publication, s.cfg.Slot), sentinel: ErrPublicationMissing, cause: err}
}

// classify turns a server or network error into a fatalError with advice when
// reconnecting cannot help, errSlotBusy when waiting may, and otherwise returns
// it wrapped (retryable).
func (s *Stream) classify(op string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "28"): // invalid_authorization_specification, invalid_password
		return &fatalError{msg: op + ": authentication failed: check the DSN's user and password, and that pg_hba.conf allows replication connections for it", sentinel: ErrAuth, cause: err}
	case pgErr.Code == "42501": // insufficient_privilege
		return &fatalError{msg: op + ": permission denied: the role needs the REPLICATION attribute (ALTER ROLE ... REPLICATION)", sentinel: ErrPermission, cause: err}
	case pgErr.Code == "3D000": // invalid_catalog_name
		return &fatalError{msg: op + ": database does not exist: fix the DSN", sentinel: ErrConfig, cause: err}
	case pgErr.Code == "42704" && strings.Contains(pgErr.Message, "publication"): // undefined_object
		// The walsender decodes with the catalog as it was at each change: a
		// publication created (or dropped and recreated) after the slot's
		// position does not exist there, and the slot cannot move past it.
		// "setup" cannot help: it finds the publication and the slot in place.
		return s.publicationAtSlotError(op, err)
	case pgErr.Code == "42704":
		return &fatalError{msg: fmt.Sprintf("%s: replication slot %q does not exist: run \"outbox-relay setup\"", op, s.cfg.Slot), sentinel: ErrSlotMissing, cause: err}
	case pgErr.Code == "55006": // object_in_use
		return fmt.Errorf("%s: %w: %w", op, errSlotBusy, err)
	case pgErr.Code == "55000": // object_not_in_prerequisite_state: e.g. an invalidated slot
		return &fatalError{msg: fmt.Sprintf("%s: replication slot %q cannot be used: recreate it with \"outbox-relay setup\" and check for lost events", op, s.cfg.Slot), sentinel: ErrSlotMissing, cause: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

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
	emit := func(b Batch) error {
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

// emit hands b to out. While out is full (the pipeline waits for Kafka, maybe
// for minutes) it keeps sending status updates, or wal_sender_timeout would
// end the connection. A failed update does not drop b: it is delivered first,
// then the error ends the connection.
func (s *Stream) emit(ctx context.Context, conn *pgconn.PgConn, asm *assembler, st *statusState, out chan<- Batch, b Batch) error {
	select {
	case out <- b:
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
			return connErr
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
