package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/router"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// Three outbox tables of different layouts on one slot, one publication and
// one relay (outbox.tables): public.outbox (the relay layout), billing.outbox
// (Debezium's layout: its columns, the header id only) and shipping.events
// (columns of its own, no headers column, an override). Every transaction
// writes all three, with the same aggregate ids in each: order is per
// aggregate per table.

// tableSpec is one of the three tables as the test writes and checks it.
type tableSpec struct {
	name, topicPart  string // schema.table; the topic infix of its template
	insert           string // INSERT of (id, aggregate type, aggregate id, event type, payload)
	headers          []string
	overrideType     string // an aggregate type routed by topics.overrides
	overrideTopicFor string
}

var threeTables = []tableSpec{
	{name: "public.outbox", topicPart: "a",
		insert:  `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`,
		headers: []string{"id", "event_type", "aggregate_type"}},
	{name: "billing.outbox", topicPart: "b",
		insert:  `INSERT INTO billing.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, $4, $5::jsonb)`,
		headers: []string{"id"}},
	{name: "shipping.events", topicPart: "c",
		insert:       `INSERT INTO shipping.events (id, kind, aggregate_id, event_type, body) VALUES ($1, $2, $3, $4, $5)`,
		headers:      []string{"id", "event_type", "aggregate_type"},
		overrideType: "Invoice"},
}

// tablesFixture adds billing.outbox and shipping.events to the fixture's
// database and publication, and writes the relay's config file.
func tablesFixture(t *testing.T) (*fixture, string) {
	f := newFixture(t)
	f.pg.Exec(t, `CREATE SCHEMA billing`)
	for _, stmt := range outboxsql.OutboxTable(outboxsql.Table{Schema: "billing", Name: "outbox"}, outboxsql.Columns{}, outboxsql.LayoutDebezium) {
		f.pg.Exec(t, stmt)
	}
	f.pg.Exec(t, `CREATE SCHEMA shipping`)
	f.pg.Exec(t, `CREATE TABLE shipping.events (id uuid PRIMARY KEY, kind text NOT NULL, aggregate_id text NOT NULL,
		event_type text NOT NULL, body text, created_at timestamptz NOT NULL DEFAULT now())`)
	f.pg.Exec(t, `ALTER PUBLICATION outbox_relay ADD TABLE billing.outbox, shipping.events`)
	for _, tb := range threeTables {
		for _, at := range aggregateTypes {
			if at != tb.overrideType {
				f.kafka.CreateTopic(t, f.tablesTopic(tb, at), 4)
			}
		}
	}
	f.kafka.CreateTopic(t, f.prefix+".invoices", 4)
	cfg := fmt.Sprintf(`outbox:
  table: public.outbox
  tables:
    - table: billing.outbox
      layout: debezium
      topics:
        template: %[1]s.b.{aggregate_type}
    - table: shipping.events
      columns:
        aggregate_type: kind
        payload: body
        headers: "-"
      topics:
        template: %[1]s.c.{aggregate_type}
        overrides:
          Invoice: %[1]s.invoices
topics:
  template: %[1]s.a.{aggregate_type}
`, f.prefix)
	path := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return f, path
}

func (f *fixture) tablesTopic(tb tableSpec, aggregateType string) string {
	if aggregateType == tb.overrideType {
		return f.prefix + ".invoices"
	}
	return f.prefix + "." + tb.topicPart + "." + aggregateType
}

// written is an event the test committed.
type written struct {
	table            int
	id, aggType, agg string
	seq              int
	payload          string
}

// tablesProducer writes transactions of events into all three tables.
type tablesProducer struct {
	rng     *mrand.Rand
	seq     map[string]int // per table and aggregate
	written []written
}

func (p *tablesProducer) tx(t *testing.T, f *fixture, n int) {
	t.Helper()
	b := &pgx.Batch{}
	var evs []written
	for i := range n {
		ti := i % len(threeTables)
		if i >= len(threeTables) {
			ti = p.rng.IntN(len(threeTables))
		}
		at := aggregateTypes[p.rng.IntN(len(aggregateTypes))]
		agg := fmt.Sprintf("%s-%d", strings.ToLower(at), p.rng.IntN(5)) // the same ids in every table
		k := fmt.Sprintf("%d/%s/%s", ti, at, agg)
		p.seq[k]++
		e := written{table: ti, id: newUUID(), aggType: at, agg: agg, seq: p.seq[k],
			payload: fmt.Sprintf(`{"seq": %d, "table": %d}`, p.seq[k], ti)}
		b.Queue(threeTables[ti].insert, e.id, e.aggType, e.agg, at+"Changed", e.payload)
		evs = append(evs, e)
	}
	f.commitBatch(t, b)
	p.written = append(p.written, evs...)
}

func (f *fixture) startTablesProcess(t *testing.T, config string) *proc {
	t.Helper()
	return f.startProcessWith(t, []string{"run", "--config", config})
}

// checkTables compares Kafka with what was written: every event on its
// table's topic once (repeats bounded), with its table's key, value and
// headers, in order per aggregate per table.
func (f *fixture) checkTables(t *testing.T, evs []written, maxDups int) {
	t.Helper()
	byID := map[string]written{}
	for _, e := range evs {
		byID[e.id] = e
	}
	topics := map[string]bool{}
	for _, tb := range threeTables {
		for _, at := range aggregateTypes {
			topics[f.tablesTopic(tb, at)] = true
		}
	}
	seen := map[string]int{}
	last := map[string]int{}
	dups, problems := 0, []string{}
	problem := func(format string, args ...any) {
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for tp := range topics {
		for _, m := range f.kafka.ReadAll(t, tp) {
			d := fromKafka(m)
			e, ok := byID[d.Headers["id"]]
			if !ok {
				problem("%s: a record with id %q, which no table has", tp, d.Headers["id"])
				continue
			}
			if seen[e.id]++; seen[e.id] > 1 {
				dups++
				continue
			}
			tb := threeTables[e.table]
			var keys []string
			for _, h := range m.Headers {
				if h.Key != relay.HeaderRefillID { // a refilled event's mark
					keys = append(keys, h.Key)
				}
			}
			if want := f.tablesTopic(tb, e.aggType); tp != want || d.Key != e.agg || !jsonEqual(d.Value, e.payload) ||
				strings.Join(keys, ",") != strings.Join(tb.headers, ",") {
				problem("event %s of %s: topic %s key %q value %s headers %v; want %s %q %s %v", e.id, tb.name, tp, d.Key, d.Value, keys, want, e.agg, e.payload, tb.headers)
			}
			k := fmt.Sprintf("%d/%s/%s", e.table, e.aggType, e.agg)
			if e.seq <= last[k] {
				problem("order: %s seq %d after %d", k, e.seq, last[k])
			}
			last[k] = e.seq
		}
	}
	lost := 0
	for _, e := range evs {
		if seen[e.id] == 0 {
			lost++
			problem("lost: event %s of %s (%s/%s seq %d)", e.id, threeTables[e.table].name, e.aggType, e.agg, e.seq)
		}
	}
	if lost > 0 || len(problems) > 0 || dups > maxDups {
		t.Fatalf("%d events: lost %d, duplicates %d (at most %d); problems:\n  %s", len(evs), lost, dups, maxDups, strings.Join(problems, "\n  "))
	}
	t.Logf("%d events in 3 tables: lost 0, duplicates %d (bound %d)", len(evs), dups, maxDups)
}

func jsonEqual(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return a == b
	}
	return fmt.Sprint(x) == fmt.Sprint(y)
}

// TestSeveralTablesSIGKILL: three tables of different layouts written in
// the same transactions, the relay binary killed with SIGKILL mid-stream
// three times: nothing lost, each table's events on its topics with its
// layout's key, value and headers, per aggregate per table in order, the
// slot confirmed past the last transaction.
func TestSeveralTablesSIGKILL(t *testing.T) {
	f, config := tablesFixture(t)
	p := &tablesProducer{rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 3)), seq: map[string]int{}}
	const kills = 3
	for range kills {
		pr := f.startTablesProcess(t, config)
		for range 20 {
			p.tx(t, f, 3+p.rng.IntN(60))
		}
		time.Sleep(time.Duration(100+p.rng.IntN(400)) * time.Millisecond)
		pr.cmd.Process.Kill()
		<-pr.done
	}
	f.startTablesProcess(t, config)
	for range 10 {
		p.tx(t, f, 3+p.rng.IntN(60))
	}
	f.waitTables(t, len(p.written))
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	f.checkTables(t, p.written, kills*processWindow)
}

// tablesConfig is the in-process form of tablesFixture's config file.
func (f *fixture) tablesConfig(t *testing.T) relay.Config {
	cfg := f.config(t)
	cfg.Router.Topic = f.prefix + ".a.{aggregate_type}"
	dbz, err := outboxsql.LayoutDebezium.Columns()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Tables = []relay.OutboxTable{
		{Table: "billing.outbox", Router: router.Config{Columns: dbz, Headers: outboxsql.LayoutDebezium.Headers(), Topic: f.prefix + ".b.{aggregate_type}"}},
		{Table: "shipping.events", Router: router.Config{Columns: router.Columns{AggregateType: "kind", Payload: "body", Headers: router.NoHeaders},
			Topic: f.prefix + ".c.{aggregate_type}", Overrides: map[string]string{"Invoice": f.prefix + ".invoices"}}},
	}
	return cfg
}

// TestSeveralTablesRefill: a slot dropped and recreated while the relay of
// three tables was stopped is refilled from all three tables.
func TestSeveralTablesRefill(t *testing.T) {
	f, _ := tablesFixture(t)
	cfg := f.tablesConfig(t)
	cfg.HistoryInterval = 100 * time.Millisecond
	p := &tablesProducer{rng: mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 4)), seq: map[string]int{}}
	run := f.start(t, cfg)
	for range 5 {
		p.tx(t, f, 3+p.rng.IntN(20))
	}
	f.waitTables(t, len(p.written))
	f.pg.WaitHistoryCovered(t, f.slot)
	run.stop(t)

	f.pg.DropSlot(t, f.slot)
	for range 5 {
		p.tx(t, f, 3+p.rng.IntN(20)) // no slot: only the tables have them
	}
	f.pg.Exec(t, `SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, f.slot)
	p.tx(t, f, 6)

	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	res, err := r.Recover(context.Background(), false)
	if err != nil {
		t.Fatalf("Recover = %v; want a refill of the three tables", err)
	}
	t.Logf("refill: %d events", res.Events)
	f.start(t, cfg)
	p.tx(t, f, 9)
	f.waitTables(t, len(p.written))
	f.checkTables(t, p.written, len(p.written))
}

// waitTables waits until at least n events are on the three tables' topics.
func (f *fixture) waitTables(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 3*time.Minute, "every event in Kafka", func() (bool, string) {
		got := 0
		for _, tb := range threeTables {
			for _, at := range aggregateTypes {
				got += len(f.kafka.ReadAll(t, f.tablesTopic(tb, at)))
			}
		}
		return got >= n, fmt.Sprintf("%d of %d", got, n)
	})
}
