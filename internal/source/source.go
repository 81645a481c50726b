// Package source holds the shapes of change the relay turns into events: the
// inserts of outbox tables (Outboxes) and logical decoding messages
// (Messages), and the refusal of inserts when the relay reads messages only
// (RefuseInserts). The route stage asks the first shape that takes a change
// the stream delivered to route it, and knows nothing of tables or messages;
// docs/contributing.md says what a new shape needs.
//
// Every shape keeps the route stage's contract, which is what keeps an event
// from being lost or overtaken:
//   - A change a shape takes is routed (a router.Message), or is no event by
//     the operator's own setup (a table the publication covers that is no
//     outbox: ok false, counted in ignored_changes_total), or stops the relay
//     before it with the error that says why (*placement.Error,
//     *router.SchemaError): nothing from it on is confirmed. It is never
//     skipped for a question left unanswered: a catalog lookup is retried
//     while Postgres is unreachable.
//   - An event that cannot be routed is returned with a *router.RouteError
//     and what could be read of it, as router.Route does: the route stage
//     parks it in the retry table, in its place.
//   - A shape is used by the route stage's goroutine only (routers are not
//     safe for concurrent use).
package source

import (
	"context"

	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// A Shape is one kind of change the relay turns into events.
type Shape interface {
	// Takes reports whether row is a change of this shape.
	Takes(row *replication.Row) bool
	// Route turns row into its event. ok is false when the change is no
	// event (counted by the shape); err follows the package's contract.
	Route(ctx context.Context, row *replication.Row) (m router.Message, ok bool, err error)
	// Counted ends a batch: the shape reports what it counted per batch
	// (events received) to its metrics.
	Counted()
}
