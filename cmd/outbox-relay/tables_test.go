package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestOutboxTables reads outbox.tables: each entry's own settings, the top
// level's topics and message options where it sets none, its columns and
// headers from its own layout.
func TestOutboxTables(t *testing.T) {
	minimalEnv(t)
	path := writeFile(t, "relay.yaml", `
outbox:
  table: public.outbox
  columns:
    payload: body
  tables:
    - table: billing.outbox
      layout: debezium
      topics:
        template: billing.{aggregate_type}
    - table: shipping_events
      columns:
        aggregate_type: kind
        headers: "-"
      topics:
        overrides: {Parcel: parcels}
      message:
        headers: [id]
topics:
  template: app.{aggregate_type}
message:
  converter: json
`)
	c, err := loadConfig(path, pflag.NewFlagSet("t", pflag.ContinueOnError))
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	if len(c.Tables) != 2 {
		t.Fatalf("Tables = %+v; want 2", c.Tables)
	}
	dbz, _ := sql.LayoutDebezium.Columns()
	b, s := c.Tables[0], c.Tables[1]
	if b.Table != "billing.outbox" || b.Router.Columns.AggregateType != dbz.AggregateType || b.Router.Columns.Payload != "payload" ||
		!slices.Equal(b.Router.Headers, sql.LayoutDebezium.Headers()) || b.Router.Topic != "billing.{aggregate_type}" || b.Router.Converter != router.ConverterJSON {
		t.Errorf("billing.outbox = %+v; want Debezium's columns and headers (not the top level's payload), its template, the top level's converter", b)
	}
	if s.Table != "public.shipping_events" || s.Router.Columns.AggregateType != "kind" || s.Router.Columns.Headers != router.NoHeaders ||
		s.Router.Columns.Payload != "payload" || s.Router.Topic != "app.{aggregate_type}" || s.Router.Overrides["Parcel"] != "parcels" ||
		!slices.Equal(s.Router.Headers, []string{"id"}) {
		t.Errorf("shipping_events = %+v; want its columns, the top level's template, its override (case kept) and headers", s)
	}
	if c.Router.Columns.Payload != "body" {
		t.Errorf("the top level's payload column = %q; want body", c.Router.Columns.Payload)
	}
	if got := c.moreTables(); !slices.Equal(got, []string{"billing.outbox", "public.shipping_events"}) {
		t.Errorf("moreTables = %q", got)
	}
}

func TestOutboxTablesErrors(t *testing.T) {
	tests := []struct{ yaml, want string }{
		{"outbox:\n  tables: [{layout: debezium}]\n", "outbox.tables[0].table: empty"},
		{"outbox:\n  tables: [{table: a, retry: {table: x}}]\n", "outbox.tables[0].retry.table: not a setting of an outbox table"},
		{"outbox:\n  tables: [{table: a, topics: {template: 'bad topic'}}]\n", "outbox.tables[0].topics.template"},
		{"outbox:\n  tables: [{table: public.outbox}]\n", "outbox.tables[0].table: public.outbox is named twice"},
		{"outbox:\n  tables: a\n", "outbox.tables: want a list"},
	}
	for _, tt := range tests {
		minimalEnv(t)
		_, err := loadConfig(writeFile(t, "relay.yaml", tt.yaml), pflag.NewFlagSet("t", pflag.ContinueOnError))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("loadConfig(%q) = %v; want an error containing %q", tt.yaml, err, tt.want)
		}
	}
	// The environment takes the list as YAML or JSON.
	minimalEnv(t)
	t.Setenv("RELAY_OUTBOX_TABLES", `[{"table": "billing.outbox", "layout": "debezium"}]`)
	c, err := loadConfig("", pflag.NewFlagSet("t", pflag.ContinueOnError))
	if err != nil || len(c.Tables) != 1 || c.Tables[0].Table != "billing.outbox" {
		t.Errorf("RELAY_OUTBOX_TABLES: %+v, %v; want billing.outbox", c, err)
	}
}
