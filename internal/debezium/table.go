package debezium

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// CheckTable compares the converted settings with the outbox table itself
// and returns what the relay will refuse or render differently, and what the
// connector's own configuration could not do, as Gaps. rc is the relay's
// routing as the converted config file loads; connector is the connector's
// properties (for the EventRouter options Debezium itself checks).
func CheckTable(ctx context.Context, q placement.Querier, table sql.Table, rc router.Config, connector map[string]string) ([]Gap, error) {
	var oid *uint32
	if err := q.QueryRow(ctx, `SELECT to_regclass($1)::oid`, table.Quoted()).Scan(&oid); err != nil {
		return nil, fmt.Errorf("look up outbox table %s: %w", table, err)
	}
	if oid == nil {
		return []Gap{{DebeziumKey: "table.include.list", Value: table.String(),
			Why: "no such table in the database of --postgres-dsn: check the DSN, or set outbox.table"}}, nil
	}
	rt, err := router.New(rc)
	if err != nil {
		return []Gap{{DebeziumKey: "transforms", Why: fmt.Sprintf("the relay refuses the converted routing: %v", err)}}, nil
	}
	c := &converter{conn: connector, used: map[string]bool{}}
	if err := c.findRouter(); err != nil {
		return nil, err
	}
	var gaps []Gap
	var ce *placement.ColumnsError
	switch err := placement.CheckColumns(ctx, q, *oid, table.String(), rt.Needs()); {
	case errors.As(err, &ce):
		gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.field.event.*"), Why: "the relay refuses the table at start: " + err.Error()})
	case err != nil:
		return nil, err
	}
	// Debezium's EventRouter reads the event timestamp column as an INT64
	// (epoch milliseconds) and fails the task on anything else: the
	// connector, as configured, never delivered an event.
	if col, has := c.opt("table.field.event.timestamp"); has && col != "" {
		typ, err := columnType(ctx, q, *oid, col)
		if err != nil {
			return nil, err
		}
		if typ != "" && typ != "bigint" {
			gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.field.event.timestamp"), Value: col,
				Why: fmt.Sprintf("column %q is %s; Debezium's EventRouter fails its task on it (\"Field '%s' is not of type INT64\"), so this connector did not deliver as configured; the relay reads a timestamp or timestamptz column there (outbox.columns.timestamp)", col, typ, col)})
		}
	}
	// Values the relay sends as Postgres text where Debezium's converters
	// write another text.
	for _, f := range rc.Fields {
		typ, err := columnType(ctx, q, *oid, f.Column)
		if err != nil {
			return nil, err
		}
		if why := renderGap(typ); why != "" {
			gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.fields.additional.placement"), Value: f.Column + ":" + string(f.Placement) + ":" + f.Alias,
				Why: fmt.Sprintf("column %q is %s: %s", f.Column, typ, why)})
		}
	}
	return gaps, nil
}

// renderGap says how the relay's rendering of a column of type typ, placed as
// a header or envelope field, differs from Debezium's, or "" when it does not
// (as far as measured against Debezium 3.1.3).
func renderGap(typ string) string {
	switch typ {
	case "timestamp with time zone":
		return `the relay sends Postgres's text (2026-11-24 22:25:41.476287+00), Debezium ISO 8601 in UTC with six fraction digits (2026-11-24T22:25:41.476287Z): consumers parsing it must accept both, or leave the field out`
	}
	return ""
}

func columnType(ctx context.Context, q placement.Querier, oid uint32, col string) (string, error) {
	var typ string
	err := q.QueryRow(ctx, `SELECT format_type(coalesce(nullif(t.typbasetype, 0), t.oid), NULL)
FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, oid, col).Scan(&typ)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up column %q: %w", col, err)
	}
	return typ, nil
}
