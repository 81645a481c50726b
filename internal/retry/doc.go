// Package retry keeps the events that could not be delivered to Kafka in a
// Postgres table, retries them with backoff, and lets an operator list,
// requeue and drop them.
//
// The pipeline diverts an event here when Kafka refused it for a reason of its
// own (unknown topic, too large, unroutable), and every later event of the same
// aggregate while an earlier one is here (Event.Waiting). Insert is durable
// when it returns nil, so the pipeline may then confirm the event's LSN: the
// table, not the WAL, holds it from then on. A broker-wide outage is not a
// reason to insert anything: the sink blocks through it and the pipeline holds
// its LSN.
//
// Invariants enforced here:
//
//   - Every row belongs to one replication slot, the relay's identity
//     (column slot_name, set by Insert from the Store's slot). Every
//     statement of a Store, and so of its Worker, reads, claims, delivers,
//     requeues, drops, lists and counts only rows of its slot: relays of
//     other slots (other services, or a second slot on the same outbox
//     table) may share the table and never see each other's rows; relays of
//     one slot (a leader and its standbys) share them. An event is stored
//     once per slot (the event key is unique per slot). Rows of an earlier
//     version have no slot: Adopt gives them the Store's slot when nothing
//     else can own them, and otherwise says how to assign them.
//   - Per-aggregate order survives failures. Rows of one aggregate (see
//     Event.Aggregate) are delivered in seq order, and seq is insertion order.
//     The Worker delivers only the head of an aggregate (no lower seq of the
//     same aggregate in the table, whatever its status), then the rows behind
//     it, stopping at the first failure. A dead row blocks its aggregate until
//     the operator requeues or drops it.
//   - No row is delivered by two workers at once: a worker claims a head with
//     SELECT … FOR UPDATE SKIP LOCKED and deletes what it delivered in the same
//     transaction, so several relay processes may share one table. Delivery is
//     at least once: a crash between Kafka's acknowledgement and the commit
//     sends the rows again, and so does a batch in which a later row was
//     acknowledged after an earlier one failed (it stays, to arrive after it).
//   - A broker outage is not a failure of the event, and one event's trouble
//     is not an outage. An attempt that runs out of AttemptTimeout is rolled
//     back (attempts do not grow, nothing goes dead) only when Kafka then
//     fails a ping too; otherwise it is the row's own failure, retried with
//     backoff, so that a topic that can never be written (colliding name,
//     no leader) does not hold the Worker on one row. A failing head waits
//     out its backoff while the heads of other aggregates are claimed.
//   - Inserting is idempotent on Event.EventKey, which is deterministic (the
//     event's position in the WAL: PositionKey), so the pipeline may insert
//     again what a crash made it read again.
//   - The table accepts every event. No btree index holds unbounded text
//     (the aggregate is indexed by its md5, and every lookup compares both the
//     digest and the text), headers are stored losslessly whatever their
//     bytes, and an event that Postgres still refuses for reasons of its data
//     is kept as a last-resort record: dead, in its aggregate (so it blocks
//     the events behind it), the whole event in a JSON document. The Worker
//     never delivers a last-resort record, even requeued: its columns do not
//     hold the event.
//   - A message's headers are built as the pipeline builds them
//     (router.Headers): the relay's own id, event_type and aggregate_type from
//     the row's columns, then the stored extra headers minus any of those
//     names (rows of earlier versions stored them too).
//
// Nothing here dials or starts goroutines on construction; Worker.Run blocks
// until its context is done.
package retry
