package source

import (
	"context"
	"log/slog"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
)

// A Table is one outbox table as Outboxes reads it.
type Table struct {
	Name   string // schema.table, as configured
	Router *router.Router
	Placer *placement.Placer
	M      *metrics.Table
}

// Outboxes is the shape of inserts into outbox tables: each insert under an
// outbox (or a table that delivers to one: a partition, an inheriting
// child) is an event; an insert into any other table the publication covers
// is ignored and counted.
type Outboxes struct {
	tables []Table
	log    *slog.Logger
	m      *metrics.Metrics
	// unreachable says which errors of a catalog lookup mean Postgres is
	// out of reach for now: the lookup is retried, never given up on.
	unreachable func(error) bool

	outboxOf map[*replication.Relation]int // index in tables; -1: not an outbox
	// readDomains reads the database's domains (placement.BaseTypes);
	// knownTypes are the user-defined types the routers were told of.
	readDomains    func(context.Context) (map[uint32]router.BaseType, error)
	knownTypes     map[uint32]bool
	received       []int // per table, of the batch being routed
	partitionNamed bool  // logged that partitions arrive under their own names
}

// OutboxesConfig is what NewOutboxes needs besides the tables.
type OutboxesConfig struct {
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// Unreachable reports whether a catalog lookup's error means Postgres
	// cannot be reached for now (the lookup is then retried).
	Unreachable func(error) bool
	// ReadDomains reads the database's domains again when a relation names
	// a user-defined type the routers were not told of; Bases is what they
	// were told at the term's start. ReadDomains may be nil (tests).
	ReadDomains func(context.Context) (map[uint32]router.BaseType, error)
	Bases       map[uint32]router.BaseType
}

// NewOutboxes reads the inserts of tables (as the relay's config lists them:
// an insert under an outbox's own name is that outbox's).
func NewOutboxes(tables []Table, c OutboxesConfig) *Outboxes {
	s := &Outboxes{
		tables: tables, log: c.Log, m: c.Metrics, unreachable: c.Unreachable,
		outboxOf:    make(map[*replication.Relation]int),
		readDomains: c.ReadDomains,
		knownTypes:  make(map[uint32]bool, len(c.Bases)),
		received:    make([]int, len(tables)),
	}
	for oid := range c.Bases {
		s.knownTypes[oid] = true
	}
	return s
}

// Takes reports whether row is an insert.
func (s *Outboxes) Takes(row *replication.Row) bool { return row.Message == nil }

// Route routes an insert of an outbox table, ignores (ok false) one of a
// table that is no outbox, and stops (*placement.Error) before one the
// relay cannot place.
func (s *Outboxes) Route(ctx context.Context, row *replication.Row) (router.Message, bool, error) {
	t, err := s.outbox(ctx, row.Relation)
	if err != nil {
		return router.Message{}, false, err
	}
	if t < 0 {
		s.m.IgnoredChange("other_table")
		return router.Message{}, false, nil
	}
	s.received[t]++
	m, err := s.tables[t].Router.Route(*row)
	m.Table = s.tables[t].Name
	return m, true, err
}

// Counted counts the batch's events per table.
func (s *Outboxes) Counted() {
	for t, n := range s.received {
		if n > 0 {
			s.tables[t].M.Received(n)
			s.received[t] = 0
		}
	}
}

// outbox returns which outbox table inserts under rel belong to (its index
// in tables), or -1 when they are no events, asking the placers once per
// relation (pgoutput announces a relation once per connection and per
// change of its definition). An insert under an outbox's own name is that
// outbox's; otherwise the first placer that delivers it has it, and else
// a placer's Stop (it may be an event the relay cannot place) wins over
// the others' Ignore: a *placement.Error, and the caller stops before it.
// The catalog is asked again after a lost connection, never given up on:
// an unanswered question is no reason to skip an insert.
func (s *Outboxes) outbox(ctx context.Context, rel *replication.Relation) (int, error) {
	if t, ok := s.outboxOf[rel]; ok {
		return t, nil
	}
	t, err := s.place(ctx, rel)
	if err == nil && t >= 0 {
		err = s.domains(ctx, rel)
	}
	return t, err
}

// firstUserOID is Postgres's FirstNormalObjectId: types below it are
// built in, never domains the database made.
const firstUserOID = 16384

// domains reads the database's domains again when an outbox relation has a
// column of a user-defined type the routers have not been told of. The
// routers render a domain as its base type, as Debezium does, from the
// catalog read at the term's start; a domain created while the relay runs
// (pgoutput announces the relation again once a column takes it) would
// otherwise be written as its text until the next term. Each type is asked
// about once a term, domain or not (an enum is not a domain).
func (s *Outboxes) domains(ctx context.Context, rel *replication.Relation) error {
	if s.readDomains == nil {
		return nil
	}
	fresh := false
	for _, c := range rel.Columns {
		if c.TypeOID >= firstUserOID && !s.knownTypes[c.TypeOID] {
			fresh = true
		}
	}
	if !fresh {
		return nil
	}
	var bases map[uint32]router.BaseType
	if err := backoff.RetryIf(ctx, s.log, "read the database's domains", s.unreachable, func() error {
		var err error
		bases, err = s.readDomains(ctx)
		return err
	}); err != nil {
		return err
	}
	for _, c := range rel.Columns {
		if c.TypeOID >= firstUserOID {
			s.knownTypes[c.TypeOID] = true
		}
	}
	for oid := range bases {
		s.knownTypes[oid] = true
	}
	for _, t := range s.tables {
		t.Router.SetBaseTypes(bases)
	}
	return nil
}

// place asks which outbox table inserts under rel belong to, for outbox.
func (s *Outboxes) place(ctx context.Context, rel *replication.Relation) (int, error) {
	for t, tb := range s.tables {
		if tb.Placer.Named(rel.Namespace, rel.Name) {
			s.outboxOf[rel] = t
			return t, nil
		}
	}
	found, pl := -1, placement.Placement{}
	var stop, ignore *placement.Placement
	for t, tb := range s.tables {
		var p placement.Placement
		err := backoff.RetryIf(ctx, s.log, "look up a table the publication delivered", s.unreachable, func() error {
			var err error
			p, err = tb.Placer.Place(ctx, rel.ID, rel.Namespace, rel.Name)
			return err
		})
		if err != nil {
			return -1, err
		}
		switch p.Action {
		case placement.Deliver:
			found, pl = t, p
		case placement.Stop:
			if stop == nil {
				stop = &p
			}
		default:
			if ignore == nil {
				ignore = &p
			}
		}
		if found >= 0 {
			break
		}
	}
	switch {
	case found >= 0:
		if !s.partitionNamed {
			s.partitionNamed = true
			s.log.Info("inserts arrive under another name than the outbox's; delivered as outbox events",
				"table", pl.Table, "is", pl.What, "outbox_table", s.tables[found].Placer.Outbox())
		}
	case stop != nil:
		return -1, &placement.Error{Placement: *stop}
	default:
		s.log.Warn("publication covers a table that is not an outbox: its inserts are ignored (counted in ignored_changes_total{kind=\"other_table\"})",
			"table", ignore.Table, "why", ignore.What)
	}
	s.outboxOf[rel] = found
	return found, nil
}
