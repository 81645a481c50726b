// Package replication reads committed transactions from a Postgres logical
// replication slot with the pgoutput plugin (proto_version 1).
//
// Invariants enforced here:
//
//   - Exactly one goroutine (Stream.Run) owns the replication connection.
//   - Standby status updates set write = flush = apply = the confirmed LSN, never
//     zero and never a position the caller has not confirmed with Stream.Confirm.
//     pglogrepl copies the write position into the other two when they are left
//     zero, so all three are set explicitly.
//   - A transaction's end LSN is confirmed to Postgres only after the caller has
//     called Confirm with it (the caller confirms only what the sink acknowledged,
//     and everything before it).
//   - When every emitted transaction has been confirmed and no transaction is
//     open, a keepalive's ServerWALEnd is confirmed: the walsender has decoded
//     everything before it, so a quiet outbox does not pin WAL.
//   - After a lost connection Run reconnects with backoff, restarts from the last
//     confirmed LSN and drops what it had already emitted, so the caller sees every
//     transaction once per Run.
package replication
