package main

import (
	"errors"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sink"
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
	{isErr(replication.ErrSlotMissing), `run "outbox-relay setup"`},
	{isErr(pgslot.ErrNotFound), `run "outbox-relay setup"`},
	{isErr(sink.ErrIdempotenceNotAllowed), `or set kafka.idempotence: false`},
	{isType[*relay.FutureStartError], `give --start-lsn at or before the server's position, or add --force if that is really meant`},
}

func isErr(target error) func(error) bool {
	return func(err error) bool { return errors.Is(err, target) }
}

func isType[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}

// hint is the command line's fix for err, or "". A *pgslot.GapError says its
// own fix.
func hint(err error) string {
	if isType[*pgslot.GapError](err) {
		return ""
	}
	for _, h := range hints {
		if h.is(err) {
			return h.fix
		}
	}
	return ""
}
