// Package hostile is outbox-relay's seeded hostile-data test: it runs the whole
// pipeline (relay.New and Run in this process, real Postgres, real Kafka) over
// outbox rows made to break it, with operator actions at random points, and
// checks with Check that every event ends delivered exactly as the router's
// contract says, or in the retry table with a reason, or dropped by the operator.
//
// The outbox table here has nullable columns of wide types (id is text; the
// headers and payload columns are jsonb, json or text, one kind per subtest).
// The generator mixes valid events over many aggregates (each row carries its
// aggregate's sequence number in an unmapped column, and in the payload when
// that is an object) with hostile ones: NULL and empty values in every column,
// aggregate ids of 8–20 KB of incompressible text, payloads beyond
// kafka.batch_bytes, unicode and control characters in every text column,
// aggregate types that make invalid topic names (spaces, '/', 250+ characters,
// non-ASCII), colliding topic names (Col.x and Col_x, one of them created), a
// topic created only during the run, and headers of every JSON type (and
// invalid JSON where the column allows it), with reserved, upper-case, empty and
// duplicate keys. Between transactions it restarts the relay, requeues dead
// rows, drops a dead row (its event then counts as dropped by the operator),
// adds a column to the outbox table and drops an unmapped one. A separate
// subtest drops a mapped column (headers) while the relay runs: Run must return
// an error naming it without confirming the transaction it could not deliver
// whole, and a restart with outbox.columns.headers = "-" must lose nothing.
//
// Sizes: reduced by default (part of `make test`), full with RELAY_FAULTS=full
// (`make test-faults`). The seed is RELAY_HOSTILE_SEED when set, else random,
// and is always logged: RELAY_HOSTILE_SEED=<n> replays the same rows and
// actions (the timing of the servers is not replayed).
package hostile
