package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// A service is one relay of an isolation test: its outbox table, slot,
// publication and topic template, with the default retry and checkpoint
// tables, which every service of the database shares.
type service struct {
	name  string
	table string // schema.table
	slot  string
	pub   string
	topic string // the one topic its events go to (aggregate type Invoice)
	ids   []string
}

// startService starts s's relay, with client topic creation off so that
// its events park in the retry table until its topic exists.
func (f *fixture) startService(t *testing.T, s *service) {
	t.Helper()
	cfg := f.retryConfig(t)
	cfg.Table = s.table
	cfg.Replication.Slot, cfg.Replication.Publication = s.slot, s.pub
	cfg.Router.Topic = s.topic[:len(s.topic)-len(".Invoice")] + ".{aggregate_type}"
	cfg.Logger = cfg.Logger.With("service", s.name)
	f.start(t, cfg)
}

// insertInvoices commits n events of aggregate type Invoice (over 5
// aggregates) into table, in one transaction, and returns their ids.
func (f *fixture) insertInvoices(t *testing.T, table string, n int) []string {
	t.Helper()
	var ids []string
	for i := range n {
		id := newUUID()
		ids = append(ids, id)
		f.pg.Exec(t, fmt.Sprintf(`INSERT INTO %s (id, aggregate_type, aggregate_id, event_type, payload)
VALUES ($1, 'Invoice', $2, 'Issued', jsonb_build_object('card', '4111-'||$3::text))`, table), id, fmt.Sprintf("inv-%d", i%5), fmt.Sprint(i))
	}
	return ids
}

// retryCount is the number of rows in the shared retry table.
func (f *fixture) retryCount(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), `SELECT count(*) FROM outbox_relay_retry`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// idsOn returns how often each event id is on topic.
func (f *fixture) idsOn(t *testing.T, topic string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range f.kafka.ReadAll(t, topic) {
		out[idHeader(m)]++
	}
	return out
}

func idHeader(m testenv.Message) string {
	for _, h := range m.Headers {
		if h.Key == "id" {
			return string(h.Value)
		}
	}
	return ""
}

// checkIsolated parks every service's events (their topics are missing),
// then creates the topics, and checks that each event reaches its own
// service's topic, and only it: counted by id, none lost, none on another
// service's topic.
func (f *fixture) checkIsolated(t *testing.T, services []*service) {
	t.Helper()
	want := 0
	for _, s := range services {
		want += len(s.ids)
	}
	// Every service's copy of every event is parked: one row each.
	waitFor(t, time.Minute, fmt.Sprintf("%d rows parked in the retry table", want), func() (bool, string) {
		n := f.retryCount(t)
		return n == want, fmt.Sprintf("%d rows", n)
	})
	// Let the workers try them a few times while no topic exists.
	time.Sleep(time.Second)
	for _, s := range services {
		f.kafka.CreateTopic(t, s.topic, 3)
	}
	waitFor(t, 2*time.Minute, "every service's events delivered", func() (bool, string) {
		state := ""
		done := true
		for _, s := range services {
			got := f.idsOn(t, s.topic)
			missing := 0
			for _, id := range s.ids {
				if got[id] == 0 {
					missing++
				}
			}
			state += fmt.Sprintf("%s: %d of %d on %s; ", s.name, len(s.ids)-missing, len(s.ids), s.topic)
			done = done && missing == 0
		}
		n := f.retryCount(t)
		return done && n == 0, state + fmt.Sprintf("retry rows %d", n)
	})
	for _, s := range services {
		own := map[string]bool{}
		for _, id := range s.ids {
			own[id] = true
		}
		got := f.idsOn(t, s.topic)
		var foreign []string
		for id := range got {
			if !own[id] {
				foreign = append(foreign, id)
			}
		}
		sort.Strings(foreign)
		if len(foreign) > 0 {
			t.Errorf("%s's topic %s holds %d events that are not %s's: %v", s.name, s.topic, len(foreign), s.name, foreign)
		}
		lost := 0
		for id := range own {
			if got[id] == 0 {
				lost++
			}
		}
		if lost != 0 {
			t.Errorf("%s: lost %d of %d events", s.name, lost, len(s.ids))
		}
	}
}

// TestTwoServicesOneDatabase: two services, each with its own outbox table,
// slot, publication and topic template, share the default retry and
// checkpoint tables. Each parks events on a topic that does not exist yet;
// once the topics exist, each event reaches its own service's topic only,
// and none is lost. (Before the retry table's rows belonged to a slot, one
// service's retry worker delivered the other's events to its own topic
// and deleted them.)
func TestTwoServicesOneDatabase(t *testing.T) {
	f := newFixture(t)
	prefix := testenv.UniqueName(t, "iso")
	services := []*service{
		{name: "orders", table: "public.orders_outbox", slot: testenv.UniqueName(t, "slot_orders"), pub: "orders_pub", topic: prefix + ".orders.Invoice"},
		{name: "billing", table: "public.billing_outbox", slot: testenv.UniqueName(t, "slot_billing"), pub: "billing_pub", topic: prefix + ".billing.Invoice"},
	}
	for _, s := range services {
		table, _ := outboxsql.ParseTable(s.table)
		for _, stmt := range outboxsql.OutboxTable(table, outboxsql.Columns{}, outboxsql.LayoutRelay) {
			f.pg.Exec(t, stmt)
		}
		f.pg.Exec(t, outboxsql.CreatePublication(s.pub, table))
		f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s.slot)
		f.startService(t, s)
	}
	for _, s := range services {
		s.ids = f.insertInvoices(t, s.table, 50)
	}
	f.checkIsolated(t, services)
}

// TestTwoSlotsOneOutbox: two relays read one outbox table through two slots
// (a blue/green switch, a migration run side by side), each with its own
// topic template, sharing the retry and checkpoint tables. Every event
// parks twice, once per slot, and reaches both topics once they exist; no
// relay delivers the other's rows. (Before, the second copy of an event was
// not stored at all: both had the same event key.)
func TestTwoSlotsOneOutbox(t *testing.T) {
	f := newFixture(t)
	prefix := testenv.UniqueName(t, "iso")
	services := []*service{
		{name: "blue", table: "public.outbox", slot: testenv.UniqueName(t, "slot_blue"), pub: "outbox_relay", topic: prefix + ".blue.Invoice"},
		{name: "green", table: "public.outbox", slot: testenv.UniqueName(t, "slot_green"), pub: "outbox_relay", topic: prefix + ".green.Invoice"},
	}
	for _, s := range services {
		f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, s.slot)
		f.startService(t, s)
	}
	ids := f.insertInvoices(t, "public.outbox", 50)
	for _, s := range services {
		s.ids = ids
	}
	f.checkIsolated(t, services)
}

// insertOrphan inserts a pending retry row as an earlier version stored it:
// no slot, read from outbox_table ("" for none), for topic.
func (f *fixture) insertOrphan(t *testing.T, id, topic, outboxTable string) {
	t.Helper()
	f.pg.Exec(t, `INSERT INTO outbox_relay_retry (event_key, event_id, aggregate, aggregate_type, aggregate_id, event_type,
    topic, msg_key, value, status, next_attempt_at, outbox_table)
VALUES ('lsn:0/1:' || $1, $1, $2 || '/k-1', 'Order', 'k-1', 'Created', $2, 'k-1', '{"old": true}', 'pending', now(), nullif($3, ''))`,
		id, topic, outboxTable)
}

// TestOrphanRowsAdopted: a relay upgraded in place, alone in its database,
// gives the retry rows of its earlier version (no slot) to its slot at
// start, and delivers them.
func TestOrphanRowsAdopted(t *testing.T) {
	f := newFixture(t)
	id := newUUID()
	topic := f.prefix + ".Order"
	f.insertOrphan(t, id, topic, "public.outbox")
	f.start(t, f.retryConfig(t))
	waitFor(t, time.Minute, "the row of the earlier version delivered", func() (bool, string) {
		got := f.idsOn(t, topic)
		n := f.retryCount(t)
		return got[id] == 1 && n == 0, fmt.Sprintf("on topic: %d, retry rows: %d", got[id], n)
	})
}

// TestOrphanRowsRefused: when another slot has saved checkpoints in the
// same checkpoint table, the retry rows of an earlier version may be that
// relay's: the relay refuses to start, naming the UPDATE that assigns them,
// and leaves them as they are.
func TestOrphanRowsRefused(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `INSERT INTO outbox_relay_checkpoint (slot_name, lsn) VALUES ('billing_relay', '0/1')`)
	id := newUUID()
	f.insertOrphan(t, id, f.prefix+".Order", "public.outbox")
	r, err := newRelay(t, f.retryConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = r.Run(ctx)
	var oe *retry.OrphansError
	if !errors.As(err, &oe) {
		t.Fatalf("Run = %v; want an *retry.OrphansError", err)
	}
	for _, want := range []string{"billing_relay", `UPDATE "outbox_relay_retry" SET slot_name`, "outbox_table = '<schema.table>'"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Run error %q; want it to say %q", err, want)
		}
	}
	var slot *string
	if err := f.pool.QueryRow(context.Background(), `SELECT slot_name FROM outbox_relay_retry WHERE event_id = $1`, id).Scan(&slot); err != nil || slot != nil {
		t.Errorf("the row of the earlier version after the refusal: slot %v, %v; want kept, without a slot", slot, err)
	}
}
