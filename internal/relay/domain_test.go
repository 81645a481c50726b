package relay_test

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
)

// TestDomainCreatedWhileRunning: a column placed as a header is written as
// Debezium writes its type; once the column takes a domain created while the
// relay runs, the same value is written the same way (the domain as its base
// type, as Debezium does), not as Postgres's text of it. Before, the routers
// knew only the domains of the term's start: the second event's header was
// "2026-11-28 10:00:00.123+00" until a restart. The outbox's timestamp column
// on a domain is read as timestamptz too (the event's Kafka timestamp).
func TestDomainCreatedWhileRunning(t *testing.T) {
	f := newFixture(t)
	f.pg.Exec(t, `ALTER TABLE outbox ADD COLUMN happened timestamptz`)
	cfg := f.config(t)
	cfg.Router.Fields = []router.Field{{Column: "happened", Placement: router.PlaceHeader, Alias: "happened"}}
	f.start(t, cfg)

	const value = `2026-11-28 10:00:00.123+00`
	insert := func(id string) {
		f.pg.Exec(t, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, happened)
VALUES ($1, 'Order', 'order-1', 'OrderPlaced', '{}', $2)`, id, value)
	}
	first, second := newUUID(), newUUID()
	insert(first)
	f.waitCount(t, 1, time.Minute)

	domain := testenv.UniqueName(t, "d_happened")
	f.pg.Exec(t, `CREATE DOMAIN `+domain+` AS timestamptz`)
	f.pg.Exec(t, `ALTER TABLE outbox ALTER COLUMN happened TYPE `+domain)
	insert(second)
	got := map[string]delivered{}
	for _, d := range f.waitCount(t, 2, time.Minute) {
		got[d.Headers["id"]] = d
	}
	before, after := got[first].Headers["happened"], got[second].Headers["happened"]
	if before == "" || before == value {
		t.Fatalf("header happened of a timestamptz column = %q; want Debezium's rendering, not Postgres's text %q", before, value)
	}
	if after != before {
		t.Errorf("header happened after the column took domain %s (created while the relay ran) = %q; want %q, as for its base type timestamptz", domain, after, before)
	}
}
