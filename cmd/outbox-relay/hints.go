package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// hints are the command line's fixes for conditions the packages report.
// The packages say what happened in terms of fields and operations (a slot
// missing, a start LSN beyond the WAL); which command to run, which flag or
// key to change is said here, once, so that renaming a command or a key
// touches one file. The first hint whose condition err matches is printed.
var hints = []struct {
	is  func(error) bool
	fix string
}{
	{isErr(replication.ErrPublicationAfterSlot), `run "outbox-relay check", which prints the server's WAL position, and start past that point with "outbox-relay run --start-lsn <that position> --force", or drop the slot and run "outbox-relay setup" to create slot and publication again`},
	{isErr(replication.ErrPublicationMissing), `create it with "outbox-relay setup", then run "outbox-relay check": a publication created after the slot's position cannot decode what was written before it, and check then prints how to start past that point`},
	{isErr(replication.ErrSlotPlugin), `drop the slot and run "outbox-relay setup", or set postgres.slot to a pgoutput slot`},
	{isErr(replication.ErrSlotDatabase), `set postgres.dsn to the slot's database, or postgres.slot to a slot of this one ("outbox-relay setup" creates it)`},
	// With a checkpoint, a missing slot is a *pgslot.GapError (recover);
	// without one, nothing was delivered from it: create it.
	{isErr(relay.ErrWALLevel), `set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart Postgres, then run "outbox-relay setup"`},
	{isErr(replication.ErrSlotMissing), `run "outbox-relay setup"`},
	{isErr(pgslot.ErrNotFound), `run "outbox-relay setup"`},
	{isErr(sink.ErrIdempotenceNotAllowed), `grant the Kafka principal IdempotentWrite on the cluster, or set kafka.idempotence: false`},
	{isErr(sink.ErrTransactionsNotAllowed), `grant the Kafka principal WRITE and DESCRIBE on TransactionalId prefixed ` + sink.TransactionalIDPrefix + ` (kafka-acls.sh --add --transactional-id ` + sink.TransactionalIDPrefix + ` --resource-pattern-type prefixed), or set delivery: at-least-once; "outbox-relay check" checks it`},
	{isErr(pgslot.ErrFailoverUnsupported), `set postgres.failover: false and postgres.on_slot_loss: refill, or upgrade to Postgres 17 or later`},
	{isErr(relay.ErrOutboxMissing), `run "outbox-relay setup --create-outbox-table", or set outbox.table to your outbox table`},
	{isPgCode("42P01"), `a table the relay needs is missing: run "outbox-relay setup" (as the tables' owner) to create the relay's tables`},
	{isErr(replication.ErrMessagesUnsupported), `upgrade the server to Postgres 14 or later, or set outbox.source: table and write the events to an outbox table`},
	{isErr(replication.ErrNonTransactional), `make the application emit its events with pg_logical_emit_message(true, ...); to skip such messages (they are never sent), set outbox.messages.non_transactional: ignore and restart the relay`},
	{isField("MetricsListen"), `another process holds that address, or it is not this host's: set metrics.listen (flag --metrics-listen, RELAY_METRICS_LISTEN) to a free host:port, or to "" to serve no metrics`},
	{isType[*relay.FutureStartError], `give --start-lsn at or before the server's position, or add --force if that is really meant`},
}

func isErr(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

// isField matches a *field.Error of relay.Config's field f.
func isField(f string) func(error) bool {
	return func(err error) bool {
		var fe *field.Error
		return errors.As(err, &fe) && fe.Field == f
	}
}

func isType[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}

// operatorText is err's text as the operator reads it: every *field.Error
// of the relay's Config in it under its key (keyText).
func operatorText(err error) string {
	msg := err.Error()
	fes, _ := field.All(err)
	for _, fe := range fes {
		msg = strings.Replace(msg, fe.Error(), keyText(fe), 1)
	}
	return msg
}

func isPgCode(code string) func(error) bool {
	return func(err error) bool {
		var pe *pgconn.PgError
		return errors.As(err, &pe) && pe.Code == code
	}
}

// hint is the command line's fix for err, or "".
func hint(err error) string {
	var refill *relay.RefillError
	if errors.As(err, &refill) {
		if refill.NoHistory {
			return fmt.Sprintf(`with the relay stopped: 1. "outbox-relay replay --from %s"; 2. create the slot if it is missing or lost (drop a lost one, then "outbox-relay setup"); `+
				`3. "outbox-relay checkpoint set <the slot's confirmed_flush_lsn, which "outbox-relay check" prints> --yes"; 4. start the relay`, refill.ReplayFrom)
		}
		return ""
	}
	var gap *pgslot.GapError
	if errors.As(err, &gap) {
		return gapFix(gap)
	}
	// The broker refused the relay's own settings: the sink names the
	// field, the operator knows the key.
	var auth *kafkaclient.AuthError
	if errors.As(err, &auth) {
		var fe *field.Error
		errors.As(field.Within("Sink", auth.FieldError()), &fe)
		return keyText(fe)
	}
	for _, h := range hints {
		if h.is(err) {
			return h.fix
		}
	}
	return ""
}

// gapFix is the command line's way to deliver a slot gap's uncovered range:
// recover (or postgres.on_slot_loss: refill) when the checkpoint's positions
// belong to this server's WAL, else replay by time. An old primary
// (CauseSuperseded) is fixed on the servers; the gap says how.
func gapFix(e *pgslot.GapError) string {
	switch {
	case e.Cause == pgslot.CauseSuperseded:
		return ""
	case e.Cause.Refillable():
		return `run "outbox-relay recover" (with the relay stopped, or set postgres.on_slot_loss: refill and the relay does it by itself): ` +
			`it creates the slot again, re-delivers from the outbox table every event the checkpoint does not cover, and the relay streams on from the new slot. ` +
			`"outbox-relay recover --dry-run" says what it would send; "outbox-relay check" warns when the outbox rows or the checkpoint history it needs may be missing` +
			e.Afterwards() + lagAlert(e)
	}
	return fmt.Sprintf(`if postgres.dsn points at the wrong server, fix it. If this server rightly replaced the checkpoint's, with the relay stopped: `+
		`1. "outbox-relay replay --from %s" (re-sends the events committed after the checkpoint, up to when it runs, and some earlier ones again); `+
		`2. delete the checkpoint row, whose positions belong to the other WAL (DELETE FROM <checkpoint.table> WHERE slot_name = %s); 3. start the relay, which then starts at the slot`,
		e.ReplayFrom(), sql.Literal(e.Slot))
}

// lagAlert names the command that would have warned of a slot about to be
// lost.
func lagAlert(e *pgslot.GapError) string {
	if e.Cause == pgslot.CauseSlotLost {
		return ` ("outbox-relay lag --max-bytes" alerts before it is)`
	}
	return ""
}
