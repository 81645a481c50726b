package replication

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
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
	// reader is the current connection's reader (connect), which the
	// receive loop tells when to linger.
	reader atomic.Pointer[lingerReader]
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
	ReceivedRows         uint64 // rows emitted (inserts and messages)
	ReceivedMessages     uint64 // of them, transactional messages with a configured prefix
	// Logical decoding messages skipped: of other prefixes, and
	// non-transactional ones of a configured prefix
	// (Config.NonTransactional ignore).
	SkippedMessages         uint64
	SkippedNonTransactional uint64
	IgnoredUpdates          uint64
	IgnoredDeletes          uint64
	IgnoredTruncates        uint64 // one per truncated relation
	// Messages proto_version 1 does not send, skipped because they carry no
	// row (see the package doc): Stream Aborts, and messages of an unknown
	// type between transactions.
	SkippedStreamAborts    uint64
	SkippedUnknownMessages uint64
	SkippedTransactions    uint64        // already delivered: before the start LSN, or resent after a reconnect
	Reconnects             uint64        // connections lost and made again (not those a pause ends)
	ConfirmedLSN           pglogrepl.LSN // what status updates report to the server
	ServerWALEnd           pglogrepl.LSN // latest WAL end reported by the server
	LastMessageAt          time.Time     // zero before the first message
	Streaming              bool          // a replication connection is up
	Reading                Reading       // the last transaction a row came of
	// Pauses counts the times the caller did not take a Batch within
	// Config.MaxUnread and the stream paused (see the package doc);
	// PausedSince is when the current pause began, zero while not paused.
	Pauses      uint64
	PausedSince time.Time
}

// Reading is the last transaction the stream read a row of (its Commit may
// have come too), skipped ones aside: not merely the last Begin, since before
// Postgres 15 every transaction of the database comes as an empty Begin and
// Commit. The server decodes a
// transaction whole before it sends it, so its WAL may lie before the
// confirmed position (see Config.Idle): until ConfirmedLSN passes CommitLSN
// these figures are what is known of it. CommitLSN is 0 before any.
type Reading struct {
	CommitLSN pglogrepl.LSN
	Rows      int64 // rows (inserts and messages) emitted of it so far
	Bytes     int64 // their bytes as pgoutput sent them
}

// Stats returns a snapshot of the counters. Safe for concurrent use.
func (s *Stream) Stats() Stats {
	st := Stats{
		ReceivedTransactions:    s.stats.transactions.Load(),
		ReceivedRows:            s.stats.rows.Load(),
		ReceivedMessages:        s.stats.messages.Load(),
		SkippedMessages:         s.stats.otherMessages.Load(),
		SkippedNonTransactional: s.stats.nonTransactional.Load(),
		IgnoredUpdates:          s.stats.ignoredUpdates.Load(),
		IgnoredDeletes:          s.stats.ignoredDeletes.Load(),
		IgnoredTruncates:        s.stats.ignoredTruncates.Load(),
		SkippedStreamAborts:     s.stats.unsolicited[unsolicitedStreamAbort].Load(),
		SkippedUnknownMessages:  s.stats.unsolicited[unsolicitedUnknown].Load(),
		SkippedTransactions:     s.stats.skipped.Load(),
		Reconnects:              s.stats.reconnects.Load(),
		Pauses:                  s.stats.pauses.Load(),
		ConfirmedLSN:            pglogrepl.LSN(s.confirmed.Load()),
		ServerWALEnd:            pglogrepl.LSN(s.stats.serverWALEnd.Load()),
		Streaming:               s.stats.streaming.Load(),
		Reading: Reading{CommitLSN: pglogrepl.LSN(s.stats.readingCommit.Load()),
			Rows: s.stats.readingRows.Load(), Bytes: s.stats.readingBytes.Load()},
	}
	if ns := s.stats.lastMessageAt.Load(); ns != 0 {
		st.LastMessageAt = time.Unix(0, ns)
	}
	if ns := s.stats.pausedSince.Load(); ns != 0 {
		st.PausedSince = time.Unix(0, ns)
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
// ErrSlotDatabase, ErrSlotActive, ErrPublicationMissing, ErrAuth, ErrPooler,
// ErrPermission, ErrConfig or ErrMessagesUnsupported, or a *DecodeError or
// *NonTransactionalError. Lost connections are retried
// with backoff. Run must not be called again while it runs; a Stream may be
// Run again after Run returned.
func (s *Stream) Run(ctx context.Context, start pglogrepl.LSN, out chan<- Batch) error {
	if err := s.cfg.validate(); err != nil {
		return &fatalError{msg: "replication config", sentinel: ErrConfig, cause: err}
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
		if !errors.Is(err, errResume) { // a pause is counted, and logged its end, itself
			s.stats.reconnects.Add(1)
			log.Warn("replication connection lost, reconnecting", "error", err, "retry_in", delay,
				"slot", s.cfg.Slot, "confirmed_lsn", pglogrepl.LSN(s.confirmed.Load()).String())
		}
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
	var nt *NonTransactionalError
	return errors.As(err, &f) || errors.As(err, &d) || errors.As(err, &g) || errors.As(err, &sg) || errors.As(err, &nt)
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
		PluginArgs: s.pluginArgs(),
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

// pluginArgs are pgoutput's options: proto_version 1, the publication, and
// logical decoding messages when the stream reads them.
func (s *Stream) pluginArgs() []string {
	args := []string{"proto_version '1'", "publication_names " + quoteLiteral(s.cfg.Publication)}
	if len(s.cfg.MessagePrefixes) > 0 {
		args = append(args, "messages 'true'")
	}
	return args
}

func (s *Stream) connect(ctx context.Context) (*pgconn.PgConn, error) {
	pcfg, err := pgconn.ParseConfig(s.cfg.ReplicationConnDSN())
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
	lr := &lingerReader{}
	pcfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		lr.r = r
		return pgproto3.NewFrontend(bufio.NewReaderSize(lr, readBufferSize), w)
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return nil, s.classify("connect", err)
	}
	s.reader.Store(lr)
	return conn, nil
}

// A lingerReader reads the replication connection. After a transaction that
// arrived less than Config.ReceiveLinger after the one before it (a stream of
// small transactions), the next read waits until ReceiveLinger after that
// transaction: the read then takes the transactions the walsender sent
// meanwhile at once, and the relay routes them into one chunk and one produce
// request, instead of paying a system call, a wake-up of each stage and a
// produce request per transaction (at 5,000 one-event transactions per second
// system calls alone were over a third of the relay's CPU profile). A
// sparse stream, and a large transaction's rows, are read as they come.
type lingerReader struct {
	r io.Reader
	// due is the time (Unix nanoseconds) before which the next read
	// waits; 0: none. Atomic: pgconn may read from its own goroutine.
	due   atomic.Int64
	reads atomic.Int64 // read calls, for tests
}

func (l *lingerReader) Read(p []byte) (int, error) {
	if due := l.due.Swap(0); due != 0 {
		if d := time.Until(time.Unix(0, due)); d > 0 {
			time.Sleep(d)
		}
	}
	l.reads.Add(1)
	return l.r.Read(p)
}

// lingerAfter makes the next read wait until linger after now.
func (l *lingerReader) lingerAfter(now time.Time, linger time.Duration) {
	if l != nil {
		l.due.Store(now.Add(linger).UnixNano())
	}
}
