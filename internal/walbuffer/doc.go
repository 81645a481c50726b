// Package walbuffer is the WAL buffer: the table where a relay that cannot
// deliver keeps, in the exact WAL commit order, full copies of the events it
// has read, so that it can confirm its replication slot past them and
// Postgres need not keep the WAL of the whole database for it (DESIGN
// invariant 7, postgres.max_retained_wal).
//
// # The mode
//
// A relay streams live (the pipeline writes to Kafka) while Kafka takes its
// events. When delivery is blocked (the broker unreachable, or the confirmed
// position not moving) and the slot's retained WAL (pg_current_wal_lsn() -
// restart_lsn) reaches EnterFraction of the bound, the relay drops its
// pipeline and leads again from its checkpoint in buffer mode: every event it
// reads goes, in commit order, into this table, and the INSERT's commit is
// the "acknowledgement" that lets the checkpoint and the slot move on. Beside
// it a Drainer reads the table in order, page by page, and hands the pages to
// the relay's live writer (the same gate, retry table and fencing as live
// events), deleting rows once Kafka acknowledged them or the retry table
// stored them. While the table holds rows of the slot, new events keep
// appending behind them: nothing read later overtakes what is buffered. When
// the drainer finds the table nearly empty and Kafka answering, and the slot
// has just moved (LeaveGate), the relay stops the buffering pipeline at a transaction boundary (its checkpoint
// saved), drains the rest before it streams again, and then streams live
// from the checkpoint.
//
// # Invariants
//
//   - Order: a row's key is its transaction's commit LSN and its position in
//     the transaction (the order the relay read from the WAL, never a clock),
//     and the Drainer reads and delivers in key order. A row appended twice
//     (a transaction read again after a crash or a takeover) is stored once.
//   - Nothing is confirmed that is not durable: Append returns only once the
//     rows are committed, and the relay acknowledges a chunk to its committer
//     only after that.
//   - Nothing is lost: a row is deleted only after the relay's writer
//     finished it (acknowledged by Kafka, or stored in the retry table).
//     Rows delivered and not yet deleted when the relay stops are delivered
//     again: duplicates, at most the Drainer's pages in flight.
//   - A crash at any moment: the next term of the slot that finds rows of
//     its slot buffers (and drains) before it streams live.
//   - Fencing: the relay asks its lease before every Append and Delete, as it
//     does before every other write; a row a deposed leader still appends is
//     keyed by its WAL position, so it can only duplicate, never reorder.
//
// Postgres moves a slot's restart_lsn only at xl_running_xacts records, to
// the snapshot before the oldest transaction open at the record; a relay near
// its bound logs such records itself (snapshots.go), so that
// the slot follows what it confirms.
//
// The buffer is a delay line in front of the relay's writer, not a second
// delivery path: what is stored is exactly what the writer would have been
// handed (routed events and router failures, in order), and the drain hands
// it to the same writer later. So the gate (an aggregate with rows in the
// retry table keeps its later events behind them), the retry table and
// fencing apply at delivery time as they would have live, and a buffered
// event that Kafka refuses is parked like a live one. A relay that enters
// the mode leads again from its checkpoint (rather than diverting its
// pipeline in place) because the pipeline is stuck on Kafka: produce
// requests in flight are abandoned (they may still land: duplicates, at
// most the in-flight window, as after any restart), and the new term reads
// the WAL again from the checkpoint into the buffer.
//
// With exactly-once delivery the buffered range is delivered at least once
// (the relay's drain writes outside Kafka transactions and marks each
// message; internal/relay/eosbuffer.go says why): the exactly-once
// checkpoint travels in each Kafka transaction, and the buffered range has
// no checkpoint of its own there.
//
// Full copies are stored (topic, key, value, headers, the event's identity
// and its router failure, if any) rather than pointers to outbox rows: a
// logical-message outbox has no rows, and an application may delete its rows
// in the same transaction or by a purge job. Retention still keeps the rows
// of buffered transactions (Store.Oldest): replay and refill read them.
package walbuffer
