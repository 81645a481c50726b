// Package eos is the relay's exactly-once delivery (delivery:
// exactly-once): one term's Kafka transactions and their checkpoint record
// (Session), and the watch over transactions that outlive their timeout
// (Timeouts). The writer of package relay drives a Session chunk by chunk.
//
// The stream's events are written in Kafka transactions, each holding whole
// Postgres transactions and, as its last record, the checkpoint: a record
// keyed by the slot in a compacted topic the relay owns (CheckpointTopic),
// whose value says up to which transaction end the events are in Kafka
// (the checkpoint record). The events and their checkpoint become visible to
// read_committed consumers together, or not at all. So:
//
//   - The Kafka checkpoint is the truth of what was delivered. It is written
//     in the same transaction as the events; the Postgres checkpoint is
//     saved, and the position confirmed to the slot, only after the Kafka
//     commit (the committer gets a chunk only then). Whatever crashes when,
//     the Kafka checkpoint is at or past the Postgres one.
//   - A term starts by taking the transactional id (one per slot,
//     relay.TransactionalID): InitProducerId finishes or aborts the transaction
//     the id left open (a former leader's, or this relay's before a crash)
//     and bumps the id's epoch, fencing every former producer in Kafka
//     itself, beside the checkpoint row's epoch in Postgres. Only then it
//     reads the Kafka checkpoint (read_committed: settled by the takeover)
//     and drops every event of a transaction at or before it: the stream
//     resumes from the Postgres checkpoint, which may be behind (Kafka
//     committed, Postgres not saved), and those events are in Kafka already.
//   - A transaction that cannot commit (the broker lost the producer's
//     state) is aborted and the term starts again from the checkpoint: its
//     events are read from the slot again and written in a new transaction.
//     A fenced producer (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) has lost
//     its leadership: the term stands by, and never takes the id again by
//     itself. Unless the transaction had been open longer than its timeout
//     and the lease shows this relay still leads: then the coordinator
//     aborted it on its timeout, which bumps the epoch too, and
//     Timeouts decides (write it again with a timeout raised to the
//     broker's cap, or stop with the fix), reporting it meanwhile.
//   - Events the pipeline parks in the retry table are stored before the
//     commit that covers their transaction, and the retry worker delivers
//     them only once that commit is done (WorkerConfig.Committed). A term
//     deletes the rows parked in a Kafka transaction that never committed
//     (retry.Store.Unpark): their transactions are read again and parked
//     again, in order, behind nothing that came after them. The retry
//     worker, replay, refill and the WAL buffer's drain (relay's eosbuffer.go)
//     write outside transactions: at least once, and their messages carry
//     event.HeaderDelivery.
//   - A Kafka transaction holds whole Postgres transactions: it is
//     committed at the end of each chunk that ends one (chunks are bounded
//     by the relay's TransactionMaxEvents and TransactionMaxBytes), and a Postgres
//     transaction larger than a chunk keeps it open until its end, so that
//     a checkpoint never falls inside a Postgres transaction.
package eos
