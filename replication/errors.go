package replication

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// Conditions that Run cannot fix by reconnecting. Run returns an error that
// wraps one of them (test with errors.Is) and says how to fix it.
var (
	// ErrSlotMissing: the replication slot does not exist.
	ErrSlotMissing = errors.New("replication slot does not exist")
	// ErrSlotPlugin (pgslot.ErrPlugin): the slot is physical or uses an
	// output plugin other than pgoutput.
	ErrSlotPlugin = pgslot.ErrPlugin
	// ErrSlotDatabase (pgslot.ErrDatabase): the slot was created in another
	// database than the DSN's.
	ErrSlotDatabase = pgslot.ErrDatabase
	// ErrSlotActive: another process holds the slot (another relay leads,
	// or the server has not yet noticed that this process's earlier
	// connection died). Run returns it at once, not retrying: a relay waits
	// as a standby until the slot is free.
	ErrSlotActive = errors.New("replication slot is active for another process")
	// ErrPublicationMissing: the publication does not exist (or did not yet
	// exist at the slot's position).
	ErrPublicationMissing = errors.New("publication does not exist")
	// ErrPublicationAfterSlot (which wraps ErrPublicationMissing): the
	// publication exists, but not at the slot's position (created, or
	// dropped and recreated, after it), so the slot cannot decode past that
	// point: start past it, or create the slot again.
	ErrPublicationAfterSlot = fmt.Errorf("%w at the slot's position", ErrPublicationMissing)
	// ErrAuth: the server rejected the credentials.
	ErrAuth = errors.New("authentication failed")
	// ErrPooler: the replication connection reached a connection pooler
	// (PgBouncer) instead of Postgres; poolers cannot carry logical
	// replication. See PoolerRefused.
	ErrPooler = errors.New("connection pooler in the way of the replication connection")
	// ErrPermission: the role may not replicate or read what the stream needs.
	ErrPermission = errors.New("permission denied")
	// ErrConfig: the Config is invalid (see the message for the field).
	ErrConfig = errors.New("invalid replication config")
	// ErrUnrequested: the server sent a message proto_version 1 does not
	// send, where skipping it could lose rows (a Stream Start, Stop or
	// Commit, a two-phase message, or an unknown message inside a
	// transaction). It comes wrapped in a *DecodeError.
	ErrUnrequested = errors.New("pgoutput message not requested")
	// ErrGap (pgslot.ErrGap): a connection reached a slot or a server that
	// does not continue from what this stream confirmed: the slot was
	// confirmed ahead of it by something else, or the server is another
	// system, or on a timeline that forked before it. The error is a
	// *pgslot.GapError that names the uncovered range and the fix.
	ErrGap = pgslot.ErrGap
	// ErrMessagesUnsupported: Config.MessagePrefixes asks for logical
	// decoding messages, which pgoutput sends from Postgres 14 on; the
	// server is older.
	ErrMessagesUnsupported = errors.New("pgoutput sends logical decoding messages from Postgres 14 on")
	// ErrNonTransactional: a non-transactional logical decoding message
	// with a configured prefix arrived and Config.NonTransactional is
	// NonTransactionalStop. It comes wrapped in a *NonTransactionalError.
	ErrNonTransactional = errors.New("non-transactional logical decoding message")
)

// A NonTransactionalError stops Run at a non-transactional logical decoding
// message with a configured prefix (Config.NonTransactional stop). Such a
// message is written to the WAL at once, whether its transaction commits or
// rolls back, so it is no event; nothing at or after LSN was confirmed.
type NonTransactionalError struct {
	LSN    pglogrepl.LSN
	Prefix string
	Size   int // bytes of content
}

func (e *NonTransactionalError) Error() string {
	return fmt.Sprintf("a non-transactional logical decoding message with prefix %q (%d bytes) at %s: it is written whether its transaction commits or rolls back, so it is not sent as an event; "+
		"emit events with pg_logical_emit_message(true, ...), and skip such messages or stop at them by configuration; nothing at or after it was confirmed",
		e.Prefix, e.Size, e.LSN)
}

func (e *NonTransactionalError) Unwrap() error { return ErrNonTransactional }

// SkippedPublication reports whether a notice from the server says that pgoutput
// decoded a change without the publication, because the publication did not exist
// at that point in the WAL (dropped and recreated, or created after the slot).
// Postgres 18 warns so ("skipped loading publication", SQLSTATE 55000) and never
// sends that change; Postgres 17 and older fail with "publication does not exist"
// instead. Either way the change is lost unless the relay stops before it
// confirms past it.
func SkippedPublication(n *pgconn.Notice) bool {
	return n != nil && n.Code == "55000" && strings.HasPrefix(n.Message, "skipped loading publication")
}

// DecodeError reports a pgoutput message that could not be decoded. It is not
// retried: the same bytes would arrive again after a reconnect.
type DecodeError struct {
	LSN pglogrepl.LSN
	Err error
}

func (e *DecodeError) Error() string { return fmt.Sprintf("decode at %s: %v", e.LSN, e.Err) }
func (e *DecodeError) Unwrap() error { return e.Err }

// fatalError is a non-retryable error with an actionable message. It wraps
// both the sentinel callers branch on and the cause (often a *pgconn.PgError).
type fatalError struct {
	msg      string
	sentinel error
	cause    error
}

func (e *fatalError) Error() string {
	if e.cause == nil {
		return e.msg
	}
	return e.msg + ": " + e.cause.Error()
}

func (e *fatalError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.sentinel}
	}
	return []error{e.sentinel, e.cause}
}
