// Package faults is outbox-relay's fault-injection suite (`make test-faults`): it
// asserts the guarantees of docs/guarantees.md under crashes and outages of the relay, Kafka
// and Postgres, and holds the two tools it needs, a cuttable TCP Proxy and the Check
// that compares Kafka and the retry table with the outbox table.
//
// TestFaultSuite runs a producer (an application writing outbox events continuously,
// about 500 a second in transactions of 1 to 50 over 20 aggregates of 3 aggregate types,
// each payload with its aggregate's next sequence number, and now and then a poison
// event: an aggregate type that makes an invalid topic name, or a payload above
// kafka.batch_bytes) and the outbox-relay binary as a subprocess, with
// pipeline.max_in_flight_events = 1000 and Postgres reached through a Proxy. Meanwhile
// it injects faults in a random order drawn from a seed that it logs
// (RELAY_FAULTS_SEED=<n> replays the order and the durations; the timing of the
// processes themselves is not replayed): the relay SIGKILLed at random moments, also in
// the middle of an outage, and restarted; the relay stopped with SIGTERM, which must exit
// 0; Kafka killed (kill -9) and restarted; Kafka frozen for 10s (SIGSTOP, then SIGCONT:
// connections hang as in a partition); Postgres stopped immediately (a crash) and
// restarted; the Postgres network cut and restored through the Proxy. Every fault ends
// with all servers running; a failed run restores them too. A supervisor restarts a relay
// that exits by itself, as systemd would.
//
// Then it stops the producer, restarts the relay cleanly, waits until the slot and the
// relay's checkpoint are past the last outbox commit (its exact end LSN comes from a
// test_decoding probe slot) and no retry row is pending, and reports, as a table in the
// test log:
//
//   - LOST: outbox rows neither in Kafka nor in the retry table with a reason. Must be 0.
//     The outbox table is the truth: a producer transaction whose COMMIT outcome was
//     unknown counts if and only if its rows are there.
//   - DUPLICATES: messages beyond the first of their event id. At most
//     (SIGKILLs + relay exits not asked for) × max_in_flight_events, for what a crash
//     resends, plus max_in_flight_events per Kafka kill and twice that per Kafka pause:
//     the allowance dates from a producer that was not idempotent (a request the broker
//     appended but whose acknowledgement was lost was stored again) and stays the bound:
//     the producer (kgo) is idempotent, so its own resends are stored once, and what is
//     left is what the relay writes again after a crash or a term that ended. Each such
//     write holds at most the in-flight events. Postgres faults get no allowance: after
//     a reconnect the relay drops what the server resends.
//   - ORDER violations: per aggregate (topic + key), in offset order after dropping
//     repeated ids, a sequence number not above the previous one, judged against the
//     table. Must be 0.
//   - retry rows written for non-poison events: an audit trigger records every row ever
//     inserted into the retry table; only the poison events may be there (a Kafka outage
//     is not a poison message). Must be 0. Each poison event must be dead with its
//     reason.
//
// It also checks that the table's sequence numbers are exactly 1..n per aggregate, which
// holds only when the producer judged every unknown commit right (it reuses the numbers
// of a transaction that did not commit).
//
// Two sizes. Reduced (the default, part of `make test`): 10 SIGKILLs, one of each other
// fault, about 50 seconds of faults and a minute in all on a 2-core machine (plus the
// wait for Exclusive). Full (RELAY_FAULTS=full, set by `make test-faults`): 40
// SIGKILLs, 3 SIGTERMs, 5 Kafka kills, 4 Kafka pauses, 5 Postgres crashes and 6
// network cuts, with longer outages and gaps, about 7 minutes and 200,000 events. The
// suite calls testenv.Exclusive first: it stops the servers every other test uses.
package faults
