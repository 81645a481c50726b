package source_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/source"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// The outbox's columns as pgoutput announces them (text and jsonb).
var outboxColumns = []replication.Column{
	{Name: "id", TypeOID: 25}, {Name: "aggregate_type", TypeOID: 25}, {Name: "aggregate_id", TypeOID: 25},
	{Name: "event_type", TypeOID: 25}, {Name: "payload", TypeOID: 3802}, {Name: "headers", TypeOID: 3802},
}

func insert(rel *replication.Relation, id, aggID string) *replication.Row {
	return &replication.Row{Relation: rel, Values: [][]byte{[]byte(id), []byte("Order"), []byte(aggID), []byte("Created"), []byte(`{"n":1}`), nil}}
}

func newRouter(t *testing.T) *router.Router {
	t.Helper()
	r, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Each change goes to exactly one shape of a source's list: messages to
// Messages, inserts to Outboxes or, reading messages only, RefuseInserts.
func TestShapesTakeTheirChanges(t *testing.T) {
	msg := &replication.Row{Message: &replication.Message{Prefix: "outbox", Content: []byte(`{}`)}}
	ins := insert(&replication.Relation{Namespace: "public", Name: "outbox", Columns: outboxColumns}, "1", "A-1")
	shapes := []source.Shape{source.NewMessages(newRouter(t), nil), source.NewOutboxes(nil, source.OutboxesConfig{}), source.RefuseInserts{}}
	for i, want := range [][2]bool{{true, false}, {false, true}, {false, true}} {
		if got := [2]bool{shapes[i].Takes(msg), shapes[i].Takes(ins)}; got != want {
			t.Errorf("shape %d (%T) takes (message, insert) = %v; want %v", i, shapes[i], got, want)
		}
	}
}

// A message's content is routed as a row of the outbox and counted; bad
// content is a *router.RouteError (parked), never dropped.
func TestMessagesRoute(t *testing.T) {
	m := metrics.New()
	s := source.NewMessages(newRouter(t), m.Table("messages:outbox"))
	row := &replication.Row{Message: &replication.Message{Prefix: "outbox", Content: []byte(`{"id":"e1","aggregate_type":"Order","aggregate_id":"A-1","event_type":"Created","payload":{"n":1}}`)}}
	ev, ok, err := s.Route(context.Background(), row)
	if err != nil || !ok || ev.ID != "e1" || string(ev.Key) != "A-1" || ev.Topic != "outbox.event.Order" {
		t.Fatalf("Route = %+v, %v, %v; want event e1 keyed A-1 on outbox.event.Order", ev.Event, ok, err)
	}
	_, ok, err = s.Route(context.Background(), &replication.Row{Message: &replication.Message{Prefix: "outbox", Content: []byte(`[1]`)}})
	var re *router.RouteError
	if !ok || !errors.As(err, &re) {
		t.Fatalf("Route(not an object) = %v, %v; want an event with a *router.RouteError", ok, err)
	}
	if got := m.Value("outbox_relay_events_received_total", "table", "messages:outbox"); got != 2 {
		t.Errorf("events_received_total{table=messages:outbox} = %v; want 2", got)
	}
}

// Reading messages only, an insert stops the relay before it with the fix.
func TestRefuseInserts(t *testing.T) {
	_, ok, err := source.RefuseInserts{}.Route(context.Background(), insert(&replication.Relation{Namespace: "public", Name: "archive"}, "1", "A-1"))
	var pe *placement.Error
	if ok || !errors.As(err, &pe) || pe.Action != placement.Stop || pe.Table != "public.archive" || !strings.Contains(pe.Fix, "outbox.source: both") {
		t.Fatalf("Route = %v, %v; want a placement Stop for public.archive that names outbox.source: both", ok, err)
	}
}

// Against real Postgres: an insert of the outbox is its event, one of a
// partition delivers to the outbox it belongs to, one of another table the
// publication covers is ignored (as outbox.other_tables says) and counted,
// and one the placer cannot place stops before it.
func TestOutboxesRoute(t *testing.T) {
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE TABLE outbox (id text, aggregate_type text, aggregate_id text, event_type text, payload jsonb, headers jsonb, at date NOT NULL) PARTITION BY RANGE (at)`)
	pg.Exec(t, `CREATE TABLE outbox_2026 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
	pg.Exec(t, `CREATE TABLE orders (id bigint)`)
	pg.Exec(t, `CREATE TABLE audit (id bigint)`)
	pg.Exec(t, `CREATE PUBLICATION pub FOR TABLE outbox, orders`)
	pool := pg.Pool(t)
	placer := placement.New(pool, placement.Config{Outbox: sql.Table{Schema: "public", Name: "outbox"}, Publication: "pub",
		Others: map[string]placement.Action{"public.orders": placement.Ignore}, OthersKey: "outbox.other_tables"})
	if err := placer.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	s := source.NewOutboxes([]source.Table{{Name: "public.outbox", Router: newRouter(t), Placer: placer, M: m.Table("public.outbox")}},
		source.OutboxesConfig{Log: slog.New(slog.DiscardHandler), Metrics: m, Unreachable: func(error) bool { return false }})
	ctx := context.Background()
	rel := func(table string) *replication.Relation {
		return &replication.Relation{ID: pg.OID(t, table), Namespace: "public", Name: table, Columns: outboxColumns}
	}

	for _, table := range []string{"outbox", "outbox_2026"} {
		ev, ok, err := s.Route(ctx, insert(rel(table), "e-"+table, "A-1"))
		if err != nil || !ok || ev.ID != "e-"+table || ev.Table != "public.outbox" {
			t.Fatalf("Route(insert into %s) = %+v, %v, %v; want event e-%s of public.outbox", table, ev.Event, ok, err, table)
		}
	}
	if _, ok, err := s.Route(ctx, insert(rel("orders"), "o1", "A-1")); ok || err != nil {
		t.Fatalf("Route(insert into orders) = %v, %v; want no event, no error (ignored)", ok, err)
	}
	if got := m.Value("outbox_relay_ignored_changes_total", "kind", "other_table"); got != 1 {
		t.Errorf("ignored_changes_total{kind=other_table} = %v; want 1", got)
	}
	s.Counted()
	if got := m.Value("outbox_relay_events_received_total", "table", "public.outbox"); got != 2 {
		t.Errorf("events_received_total{table=public.outbox} = %v; want 2 (counted at the batch's end)", got)
	}

	// audit may be a former partition of the outbox (its publication does
	// not publish via the root) and has no verdict in outbox.other_tables:
	// the placer stops for it, and Route must say so, not ignore it.
	_, ok, err := s.Route(ctx, insert(rel("audit"), "a1", "A-1"))
	var pe *placement.Error
	if ok || !errors.As(err, &pe) || pe.Action != placement.Stop || pe.Table != "public.audit" {
		t.Fatalf("Route(insert into audit) = %v, %v; want a *placement.Error (Stop) for public.audit", ok, err)
	}
}
