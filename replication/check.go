package replication

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

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
		return 0, &fatalError{msg: fmt.Sprintf("publication %q does not exist in database %q: create it; "+
			"a publication created after the slot's position cannot decode what was written before it", s.cfg.Publication, slot.CurrentDatabase), sentinel: ErrPublicationMissing}
	}
	if len(s.cfg.MessagePrefixes) > 0 {
		if err := s.checkMessages(ctx, conn); err != nil {
			return 0, err
		}
	}
	lsn, err := slot.Confirmed()
	if err != nil {
		return 0, fmt.Errorf("check slot: %w", err)
	}
	return lsn, nil
}

// MessagesMinVersion is the first server_version_num whose pgoutput sends
// logical decoding messages (its messages option).
const MessagesMinVersion = 140000

// checkMessages refuses a server whose pgoutput cannot send logical
// decoding messages: Postgres 13 would refuse the option at
// START_REPLICATION with an obscure "unrecognized pgoutput option".
func (s *Stream) checkMessages(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, `SELECT current_setting('server_version_num')`).ReadAll()
	if err != nil {
		return s.classify("check the server version", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 {
		return fmt.Errorf("check the server version: no answer")
	}
	v, err := strconv.Atoi(string(res[0].Rows[0][0]))
	if err != nil {
		return fmt.Errorf("check the server version: %w", err)
	}
	if v < MessagesMinVersion {
		return &fatalError{msg: fmt.Sprintf("the server runs Postgres %d (server_version_num %d), whose pgoutput cannot send logical decoding messages (Postgres 14 and later can): upgrade the server, or read an outbox table instead", v/10000, v),
			sentinel: ErrMessagesUnsupported}
	}
	return nil
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
		"and the slot cannot decode past that point with this publication; start past it (events committed in between are skipped: re-insert or replay them), "+
		"or create the slot (and publication) again", op, s.cfg.Publication, s.cfg.Slot), sentinel: ErrPublicationAfterSlot, cause: err}
}

// classify turns a server or network error into a fatalError with advice when
// reconnecting cannot help, errSlotBusy when waiting may, and otherwise returns
// it wrapped (retryable).
func (s *Stream) classify(op string, err error) error {
	if PoolerRefused(err) {
		return &fatalError{msg: op + ": " + PoolerAdvice, sentinel: ErrPooler, cause: err}
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return fmt.Errorf("%s: %w", op, err)
	}
	switch {
	case strings.HasPrefix(pgErr.Code, "28"): // invalid_authorization_specification, invalid_password
		return &fatalError{msg: op + ": authentication failed: check the DSN's user and password, and that pg_hba.conf has a line for this database, user and host (a logical replication connection matches the database's lines, not the replication keyword's)", sentinel: ErrAuth, cause: err}
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
		return &fatalError{msg: fmt.Sprintf("%s: replication slot %q does not exist", op, s.cfg.Slot), sentinel: ErrSlotMissing, cause: err}
	case pgErr.Code == "55006": // object_in_use
		return fmt.Errorf("%s: %w: %w", op, errSlotBusy, err)
	case pgErr.Code == "55000": // object_not_in_prerequisite_state: e.g. an invalidated slot
		return &fatalError{msg: fmt.Sprintf("%s: replication slot %q cannot be used: create it again and check for lost events", op, s.cfg.Slot), sentinel: ErrSlotMissing, cause: err}
	}
	return fmt.Errorf("%s: %w", op, err)
}

// PoolerAdvice says what a replication connection refused by a connection
// pooler means, and the fix.
const PoolerAdvice = "the replication connection reached a connection pooler (PgBouncer?), which cannot carry logical replication: " +
	"set postgres.replication_dsn to connect to Postgres directly (postgres.dsn may stay on the pooler for SQL); pg_hba.conf is not the cause"

// PoolerRefused says whether err is a connection pooler refusing a
// connection for a startup parameter it does not forward: PgBouncer answers
// "unsupported startup parameter: replication" to a replication connection
// (and so for statement_timeout and the like on an SQL connection). Postgres
// itself never says this.
func PoolerRefused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Message, "unsupported startup parameter")
}

// quoteLiteral quotes s as an SQL string literal (standard_conforming_strings).
func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
