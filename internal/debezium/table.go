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
			Why: "no such table in the database connected to: check the DSN, or name the outbox table"}}, nil
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
	// Debezium 3.1.3's EventRouter takes the event timestamp from a
	// timestamp column (io.debezium.time.Timestamp or MicroTimestamp) and
	// fails its task on anything else, bigint and timestamptz included
	// (measured): the connector, as configured, never delivered an event.
	if col, has := c.opt("table.field.event.timestamp"); has && col != "" {
		ct, err := columnType(ctx, q, *oid, col)
		if err != nil {
			return nil, err
		}
		if ct.name != "" && ct.oid != timestampOID {
			gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.field.event.timestamp"), Value: col,
				Why: fmt.Sprintf("column %q is %s; Debezium's EventRouter fails its task on it (it reads only a timestamp column there: bigint and timestamptz fail with \"Tolerance exceeded in error handler\"), so this connector did not deliver as configured; the relay reads a timestamp or timestamptz column there (outbox.columns.timestamp)", col, ct.name)})
		}
	}
	// A bytea payload under StringConverter: Debezium's value is the
	// ByteBuffer's toString, java.nio.HeapByteBuffer[pos=0 lim=N cap=N], the
	// payload itself lost; the relay writes the payload's bytes, which is
	// what such a setup meant, but not Debezium's bytes.
	if rc.Converter != router.ConverterJSON {
		payload := rc.Columns.Payload
		if payload == "" {
			payload = debeziumColumns.Payload
		}
		ct, err := columnType(ctx, q, *oid, payload)
		if err != nil {
			return nil, err
		}
		if ct.oid == 17 {
			gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.field.event.payload"), Value: payload,
				Why: fmt.Sprintf("column %q is bytea and the value converter StringConverter: Debezium wrote each value as the text java.nio.HeapByteBuffer[pos=0 lim=N cap=N] (the payload's length, not the payload); the relay writes the payload's bytes: consumers of Debezium's topic never saw a payload, check what they expect", payload)})
		}
	}
	// Values the relay cannot write as Debezium's converters do.
	for _, f := range rc.Fields {
		ct, err := columnType(ctx, q, *oid, f.Column)
		if err != nil {
			return nil, err
		}
		if why := renderGap(ct, f.Placement, rc.Converter); why != "" {
			gaps = append(gaps, Gap{DebeziumKey: c.routerKey("table.fields.additional.placement"), Value: f.Column + ":" + string(f.Placement) + ":" + f.Alias,
				Why: fmt.Sprintf("column %q is %s: %s", f.Column, ct.name, why)})
		}
	}
	return gaps, nil
}

// timestampOID is timestamp without time zone's.
const timestampOID = 1114

// measured are the types whose values the relay writes as Debezium 3.1.3
// does, in headers and envelopes under both converters, compared byte for
// byte by internal/compat's TestDebeziumColumnTypes and
// TestDebeziumEdgeValues (empty strings, ±infinity, BC and five-digit years,
// NaN, subnormal floats, explicit array bounds, domains by their base type):
// booleans, integers, text, char, varchar, uuid, json, jsonb, float4,
// float8, numeric, date, time, timetz, timestamp, timestamptz, bytea, and
// arrays of bool, integers, text, char, varchar, uuid, float4 and float8.
var measured = map[uint32]bool{
	16: true, 21: true, 23: true, 20: true, 25: true, 1042: true, 1043: true, 2950: true, 114: true, 3802: true,
	700: true, 701: true, 1700: true, 1082: true, 1083: true, 1266: true, timestampOID: true, 1184: true, 17: true,
	1000: true, 1005: true, 1007: true, 1016: true, 1009: true, 1014: true, 1015: true, 2951: true, 1021: true, 1022: true,
}

// renderGap says how the relay's value of a column of type ct, placed as
// placement under converter, differs from Debezium's, or "" when it does not.
func renderGap(ct column, placement router.Placement, converter router.Converter) string {
	switch {
	case !measured[ct.oid]:
		return "the relay writes Postgres's text of it; Debezium's rendering of this type was not compared with the relay's and may differ: compare a message of each, or leave the field out"
	case ct.oid == 1700 && ct.mod < 0 && placement == router.PlaceEnvelope && converter != router.ConverterJSON:
		return "a numeric without a declared scale is Debezium's VariableScaleDecimal, whose Struct text under StringConverter holds a Java object identity (Struct{scale=1,value=[B@3a0ecabb}) that no other program can reproduce; the relay writes the number at Debezium's scale (-1.1 for -1.10): declare the column's scale (numeric(12,2)), use message.converter json, or place it as a header"
	case ct.oid == 700 || ct.oid == 701 || ct.oid == 1021 || ct.oid == 1022:
		return "Debezium writes a float as the Java it runs on prints it, and Java 17 and 18 print some values longer than Java 19 on (1.0E23 as 9.999999999999999E22, 2.0E23 as 1.9999999999999998E23, the real 1.1754944E-38 as 1.17549435E-38, 9.9E-324 as 1.0E-323); the relay writes Java 19's shortest text: the bytes are the same if Kafka Connect ran on Java 19 or later, otherwise compare such values, or use numeric"
	}
	return ""
}

// column is a column's base type: its OID, modifier and name.
type column struct {
	oid  uint32
	mod  int32
	name string
}

// columnType is the column's type through every domain it is over (its
// base type's OID and the outermost declared modifier, as the router renders
// it), named as format_type names the column's own type.
func columnType(ctx context.Context, q placement.Querier, oid uint32, col string) (column, error) {
	var c column
	err := q.QueryRow(ctx, `SELECT a.atttypid, a.atttypmod, format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_attribute a
WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, oid, col).Scan(&c.oid, &c.mod, &c.name)
	if errors.Is(err, pgx.ErrNoRows) {
		return column{}, nil
	}
	if err != nil {
		return column{}, fmt.Errorf("look up column %q: %w", col, err)
	}
	bases, err := placement.BaseTypes(ctx, q)
	if err != nil {
		return column{}, err
	}
	if b, ok := bases[c.oid]; ok {
		c.oid, c.mod = b.OID, b.Mod
	}
	return c, nil
}
