package source

import (
	"context"
	"fmt"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// Messages is the shape of logical decoding messages (pg_logical_emit_message
// with one of the relay's prefixes): each one's content is an event, routed
// as the row of the outbox it stands for.
type Messages struct {
	router *router.Router
	m      *metrics.Table
}

// NewMessages routes messages with rt (the first outbox table's router: a
// message stands for a row of it) and counts them on m.
func NewMessages(rt *router.Router, m *metrics.Table) *Messages {
	return &Messages{router: rt, m: m}
}

// Takes reports whether row is a logical decoding message.
func (s *Messages) Takes(row *replication.Row) bool { return row.Message != nil }

// Route routes the message's content; every message is an event.
func (s *Messages) Route(_ context.Context, row *replication.Row) (router.Message, bool, error) {
	s.m.Received(1)
	m, err := s.router.RouteMessage(row.Message.Content)
	return m, true, err
}

// Counted does nothing: messages are counted as they come.
func (s *Messages) Counted() {}

// RefuseInserts is the shape of inserts when the relay reads logical
// decoding messages only (outbox.source: messages): the publication should
// not deliver any, and each one stops the relay before it. Whether the
// table's inserts are events too (a table outbox being moved to messages) or
// the publication covers a table by mistake (the archive), the operator
// knows, not the relay.
type RefuseInserts struct{}

// Takes reports whether row is an insert.
func (RefuseInserts) Takes(row *replication.Row) bool { return row.Message == nil }

// Route refuses the insert with a *placement.Error saying how to fix it.
func (RefuseInserts) Route(_ context.Context, row *replication.Row) (router.Message, bool, error) {
	table := row.Relation.Namespace + "." + row.Relation.Name
	return router.Message{}, false, &placement.Error{Placement: placement.Placement{Action: placement.Stop, Table: table,
		What: "the relay reads logical decoding messages only (outbox.source: messages), but the publication delivered an insert into it",
		Fix:  fmt.Sprintf("if its inserts are outbox events, set outbox.source: both; if they are not, remove %s from the publication (ALTER PUBLICATION ... DROP TABLE); then restart the relay (nothing from this insert on was confirmed, so nothing is lost)", table)}}
}

// Counted does nothing: nothing is counted.
func (RefuseInserts) Counted() {}
