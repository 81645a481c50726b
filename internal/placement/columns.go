package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// A ColumnsError says that the outbox table lacks a column the router reads
// (router.Need), or has it with a type the router cannot read. check, setup
// and run report it in the same words, before anything streams.
type ColumnsError struct {
	Table    string
	Problems []string
	Fix      string
}

func (e *ColumnsError) Error() string {
	return fmt.Sprintf("outbox table %s: %s; %s", e.Table, strings.Join(e.Problems, "; "), e.Fix)
}

// CheckColumns compares the columns of the table oid (named table, for
// messages) with what the router reads, and returns a *ColumnsError naming
// every problem and the fix, or nil.
func CheckColumns(ctx context.Context, q Querier, oid uint32, table string, needs []router.Need) error {
	have, err := columnTypes(ctx, q, oid)
	if err != nil {
		return err
	}
	var problems, fixes []string
	for _, n := range needs {
		typ, ok := have[n.Column]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("no column %q (%s)", n.Column, n.Key))
			if n.Key == "outbox.columns.headers" {
				fixes = append(fixes, fmt.Sprintf("%s: %q (no headers column)", n.Key, router.NoHeaders))
			} else if alt := otherLayoutColumn(have, n); alt != "" {
				// A table made for the other layout (a Debezium user's
				// table under our names, or the reverse): map the column,
				// never switch the layout, which would change the messages
				// (headers) the current one promises.
				fixes = append(fixes, fmt.Sprintf("%s: %s", n.Key, alt))
			}
		case n.Types != nil && !slices.Contains(n.Types, typ):
			problems = append(problems, fmt.Sprintf("column %q is %s, want one of %s", n.Column, typ, strings.Join(n.Types, ", ")))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	fix := "fix the table or the mapping (outbox.columns.*, message.fields)"
	if len(fixes) > 0 {
		fix = "map them: set " + strings.Join(fixes, ", ")
	}
	return &ColumnsError{Table: table, Problems: problems, Fix: fix}
}

// otherLayoutColumn returns the name another layout gives n's column, when
// the table has a column of that name.
func otherLayoutColumn(have map[string]string, n router.Need) string {
	field, ok := strings.CutPrefix(n.Key, "outbox.columns.")
	if !ok {
		return ""
	}
	for _, l := range sql.Layouts {
		c, err := l.Columns()
		if err != nil {
			continue
		}
		name := map[string]string{"id": c.ID, "aggregate_type": c.AggregateType, "aggregate_id": c.AggregateID,
			"event_type": c.EventType, "payload": c.Payload, "headers": c.Headers}[field]
		if _, ok := have[name]; ok && name != n.Column {
			return name
		}
	}
	return ""
}

// columnTypes maps the table's column names to their base types (domains
// resolved) as format_type spells them: text, character varying, jsonb, ...
func columnTypes(ctx context.Context, q Querier, oid uint32) (map[string]string, error) {
	var raw string
	err := q.QueryRow(ctx, `SELECT coalesce(json_object_agg(a.attname, format_type(coalesce(nullif(t.typbasetype, 0), t.oid), NULL)), '{}')::text
FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, oid).Scan(&raw)
	if err != nil {
		return nil, fmt.Errorf("read the columns of the outbox table: %w", err)
	}
	cols := map[string]string{}
	if err := json.Unmarshal([]byte(raw), &cols); err != nil {
		return nil, fmt.Errorf("read the columns of the outbox table: %w", err)
	}
	return cols, nil
}

// BaseTypes reads every domain of the database and the base type it is over,
// through domains over domains, for router.SetBaseTypes. The modifier is the
// outermost one declared, as Postgres's getBaseTypeAndTypmod reads it.
func BaseTypes(ctx context.Context, q Querier) (map[uint32]router.BaseType, error) {
	var text string
	if err := q.QueryRow(ctx, `SELECT coalesce(json_agg(json_build_array(oid::int8, typbasetype::int8, typtypmod)), '[]')::text
FROM pg_catalog.pg_type WHERE typtype = 'd'`).Scan(&text); err != nil {
		return nil, fmt.Errorf("read the database's domains: %w", err)
	}
	var list [][3]int64
	if err := json.Unmarshal([]byte(text), &list); err != nil {
		return nil, fmt.Errorf("read the database's domains: %w", err)
	}
	direct := make(map[uint32]router.BaseType, len(list))
	for _, d := range list {
		direct[uint32(d[0])] = router.BaseType{OID: uint32(d[1]), Mod: int32(d[2])}
	}
	out := make(map[uint32]router.BaseType, len(direct))
	for oid, b := range direct {
		for range len(direct) { // a chain is at most every domain long
			next, ok := direct[b.OID]
			if !ok {
				break
			}
			if b.Mod == -1 {
				b.Mod = next.Mod
			}
			b.OID = next.OID
		}
		out[oid] = b
	}
	return out, nil
}
