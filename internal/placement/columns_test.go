package placement_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
)

// TestCheckColumns: a column the router reads that is missing or of a type it
// cannot read is named, every one, with the fix: a mapping to the column the
// other layout names when the table has it, else the general fix; domains
// count as their base type.
func TestCheckColumns(t *testing.T) {
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE DOMAIN event_id AS uuid`)
	pg.Exec(t, `CREATE TABLE outbox (id event_id, aggregatetype text, aggregate_id int4[], payload jsonb)`)
	pool := pg.Pool(t)
	ctx := context.Background()
	oid := pg.OID(t, "public.outbox")
	needs := []router.Need{
		{Key: "outbox.columns.id", Column: "id", Types: []string{"uuid", "text"}},
		{Key: "outbox.columns.aggregate_type", Column: "aggregate_type", Types: []string{"text"}},
		{Key: "outbox.columns.aggregate_id", Column: "aggregate_id", Types: []string{"text"}},
		{Key: "outbox.columns.payload", Column: "payload"},
		{Key: "outbox.columns.headers", Column: "headers"},
	}
	err := placement.CheckColumns(ctx, pool, oid, "public.outbox", needs)
	var ce *placement.ColumnsError
	if !errors.As(err, &ce) {
		t.Fatalf("CheckColumns = %v; want a *ColumnsError", err)
	}
	for _, want := range []string{
		`no column "aggregate_type" (outbox.columns.aggregate_type)`,
		`column "aggregate_id" is integer[], want one of text`,
		`no column "headers" (outbox.columns.headers)`,
		`outbox.columns.aggregate_type: aggregatetype`, // Debezium's name, which the table has
		`outbox.columns.headers: "` + router.NoHeaders + `"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckColumns error lacks %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), `"id"`) || strings.Contains(err.Error(), `"payload"`) {
		t.Errorf("CheckColumns names a column it can read (id is a domain over uuid; payload takes any type):\n%v", err)
	}
	if err := placement.CheckColumns(ctx, pool, oid, "public.outbox", needs[:1]); err != nil {
		t.Errorf("CheckColumns of the readable id alone = %v; want nil", err)
	}
}

// TestBaseTypes: every domain maps to the type at the bottom of its chain,
// with the outermost modifier declared.
func TestBaseTypes(t *testing.T) {
	pg := testenv.Postgres(t)
	pg.Exec(t, `CREATE DOMAIN short AS varchar(20)`)
	pg.Exec(t, `CREATE DOMAIN shorter AS short CHECK (length(VALUE) < 10)`)
	pg.Exec(t, `CREATE DOMAIN amount AS numeric(12,2)`)
	pool := pg.Pool(t)
	ctx := context.Background()
	got, err := placement.BaseTypes(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	var varchar, numeric uint32
	if err := pool.QueryRow(ctx, `SELECT 'varchar'::regtype::oid, 'numeric'::regtype::oid`).Scan(&varchar, &numeric); err != nil {
		t.Fatal(err)
	}
	for domain, want := range map[string]router.BaseType{
		"short":   {OID: varchar, Mod: 24}, // varchar's typmod is the length + 4
		"shorter": {OID: varchar, Mod: 24},
		"amount":  {OID: numeric, Mod: 12<<16 | 2 + 4},
	} {
		if b := got[oidOfType(t, pool, domain)]; b != want {
			t.Errorf("BaseTypes[%s] = %+v; want %+v", domain, b, want)
		}
	}
}
