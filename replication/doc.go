// Package replication reads committed transactions from a Postgres logical
// replication slot with the pgoutput plugin (proto_version 1).
//
// A Stream owns one replication connection. Its Run hands the inserts of each
// committed transaction to the caller as Batches, in commit order; the caller
// calls Confirm with a Last batch's EndLSN once that transaction, and every
// one before it, has been fully handled (acknowledged by the sink). UPDATE,
// DELETE and TRUNCATE are not relayed: they are counted in Stats and logged
// once per kind per Run. The pure decoding and batching (pgoutput bytes →
// Batches, relation cache, skipping, dedup after reconnect) is a deterministic
// core tested on captured byte fixtures; Run is the thin I/O loop around it.
//
// Invariants enforced here:
//
//   - Exactly one goroutine (Stream.Run) owns the replication connection.
//     Confirm and Stats use atomics and are safe from any goroutine.
//   - Standby status updates set write = flush = apply = the confirmed LSN, never
//     zero and never a position the caller has not confirmed with Stream.Confirm.
//     pglogrepl copies the write position into the other two when they are left
//     zero, so all three are set explicitly.
//   - The confirmed position starts at max(start, the slot's confirmed_flush_lsn),
//     read with a query on the replication connection before START_REPLICATION.
//     Reporting the slot's own position is a no-op for the server, and it
//     gives Run(ctx, 0, …) a non-zero position to report from the start;
//     reporting less would move confirmed_flush_lsn backwards (Postgres 15
//     accepts that). If the slot has no position, nothing is reported until
//     one is confirmed.
//   - A transaction's end LSN is confirmed to Postgres only after the caller has
//     called Confirm with it (the caller confirms only what the sink acknowledged,
//     and everything before it).
//   - When every emitted transaction has been confirmed and no transaction is
//     open or partly emitted, a keepalive's ServerWALEnd is confirmed: the
//     walsender has decoded everything before it, so a quiet outbox does not
//     pin WAL. With Config.Idle it is offered to the caller instead, and
//     confirmed only once the caller Confirms it (after recording it).
//   - Every connection identifies the server (IDENTIFY_SYSTEM, and the
//     timeline history after a promotion) and refuses, with a
//     *pgslot.GapError (ErrGap), to stream from another system, from a
//     timeline that forked before the confirmed position, or from a slot
//     confirmed ahead of it: streaming on would skip the transactions in
//     between without a trace (DESIGN invariant 14).
//   - Transactions with CommitLSN < start are skipped whole (the slot can go
//     backwards after a crash); start is passed to START_REPLICATION too, so
//     the server normally skips them first.
//   - After a lost connection Run reconnects with backoff, restarts from the last
//     confirmed LSN and drops what it had already emitted — whole transactions
//     up to the last emitted Last batch, and the rows already emitted of a
//     transaction that was cut mid-way — so the caller sees every transaction
//     once per Run.
//   - While the caller does not take the next Batch (backpressure), status
//     updates keep going every StatusInterval, so wal_sender_timeout does not end
//     the connection; StatusInterval must stay below the server's
//     wal_sender_timeout (default 60s).
//   - The connection is never left unread for longer than Config.MaxUnread
//     (5s), whatever the caller does: a walsender whose client does not read
//     blocks in its socket write, where it cannot exit even when told to
//     (its FATAL cannot be sent), and the checkpointer, which ends the
//     walsender of a slot past max_slot_wal_keep_size, waits for it, and every
//     checkpoint of the server with it. So once the caller has not taken the
//     next Batch for MaxUnread, the stream pauses: it reads and drops what the
//     server sends (answering keepalives, sending status updates, confirming
//     no idle position) until the caller takes the Batch, then reconnects from
//     the confirmed position and drops, as after any reconnect, what it had
//     emitted; the dropped part is read again, in order. Stats.Pauses counts
//     pauses, Stats.PausedSince tells one that lasts. A status update is a
//     write bounded by MaxUnread too.
//   - Row values are copied out of the connection's read buffer: a Batch stays
//     valid for as long as the caller keeps it. Values are pgoutput text (jsonb
//     as its text, bytea as \x hex), nil for NULL.
//   - Bad bytes never panic: they end Run with a *DecodeError.
//   - A message proto_version 1 does not send is skipped only where it cannot
//     hold or retract a row; anywhere else Run stops before confirming
//     anything at or after it (see below).
//   - With Config.MessagePrefixes, pgoutput's messages option is asked for
//     (Postgres 14+; an older server is refused before START_REPLICATION,
//     ErrMessagesUnsupported). A transactional logical decoding message with
//     a listed prefix is a Row of its transaction (Row.Message), in its place
//     among the inserts, under every rule of an insert: it arrives only once
//     its transaction committed (never for a rolled-back transaction or
//     savepoint), is confirmed only with its transaction, and is dropped,
//     not repeated, when a reconnect resends it. A non-transactional one is
//     written whether its transaction commits or not, so it is never handed
//     on: Run stops before it (*NonTransactionalError, the default) or skips
//     it (Config.NonTransactional ignore). Messages of other prefixes are
//     skipped and counted.
//
// # Messages the relay did not ask for
//
// With proto_version 1 and neither streaming nor two_phase requested, every
// row arrives between a Begin and its Commit, and nothing else frames rows.
// Servers do not always keep to that: Postgres 18 sends Stream Abort
// messages to such clients (estuary/connectors#5228). As we read the 18
// source, its reorder buffer discards a large transaction found aborted when
// logical_decoding_work_mem is exceeded, which marks it (or a subtransaction)
// as streamed although no byte of it was sent, and decoding its abort record
// then calls pgoutput's
// stream_abort callback: an 'A' with the top-level and subtransaction xids,
// always between transactions (a committed transaction is sent whole, from
// Begin to Commit, while its commit record is decoded). The rule, per kind:
//
//   - Stream Abort between transactions: skipped, counted
//     (Stats.SkippedStreamAborts) and logged once per Run. No row of the
//     aborted transaction reached the relay (a Stream Start would have
//     stopped it), so there is nothing to retract; the stream stays idle.
//   - A message of an unknown type between transactions: skipped, counted
//     (Stats.SkippedUnknownMessages) and logged once per Run. Its meaning is
//     unknown, so until the next Begin the stream is not idle and no
//     keepalive's WAL end is confirmed past it; an Insert, Update, Delete or
//     Truncate that follows without a Begin still stops Run.
//   - Stream Start, Stream Stop, Stream Commit, and the two-phase messages
//     (Begin Prepare, Prepare, Commit Prepared, Rollback Prepared, Stream
//     Prepare): Run stops with a *DecodeError wrapping ErrUnrequested. They
//     frame rows in a format proto_version 1 did not ask for (streamed
//     changes carry an xid before the relation), which the relay would
//     misread or, skipped, lose with the next confirmation.
//   - A Stream Abort or a message of an unknown type inside a transaction:
//     Run stops the same way, before that transaction's Commit is confirmed;
//     proto_version 1 never sends one there and it might hold or retract rows.
//
// Stopping loses nothing: the confirmed position stays before the message,
// and a restarted relay reads it again from the slot.
package replication
