// Package placement decides what an insert that pgoutput delivers under some
// relation is: an outbox event, a change of another table the publication
// covers in its own right, or something the relay cannot place.
//
// pgoutput names a relation as the catalog described it when the change was
// decoded: an insert into a partition arrives under the partition's name
// (unless the publication has publish_via_partition_root), an insert made
// before a rename under the old name, an insert into an inheritance child
// under the child's. The relay maps only the configured outbox table, so
// every other name is looked up here, by its OID, in the catalog as it is
// now.
//
// The rule this package enforces (DESIGN.md invariant 13): an insert is
// ignored only when its table is provably not the outbox — a table the
// publication covers in its own right, unrelated to the outbox, in a set-up
// where no former partition of the outbox could arrive under its own name —
// or when the operator said so (Config.Others). Whatever belongs to the
// outbox but cannot be placed safely (the outbox renamed or moved while the
// relay ran, an inheritance child, a table dropped or detached since) is a
// Stop: the caller stops before that insert, so nothing from it on is
// confirmed, and the Placement names the fix.
package placement

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/sql"
)

// Action is what the caller does with an insert.
type Action int

const (
	// Deliver: the insert is an outbox event (the outbox itself, under its
	// name now or an earlier one, or one of its partitions).
	Deliver Action = iota + 1
	// Ignore: the table is not the outbox; its inserts are no events.
	Ignore
	// Stop: the insert may be an event the relay cannot place; stop before
	// it and let the operator decide (Placement.Fix).
	Stop
)

func (a Action) String() string {
	switch a {
	case Deliver:
		return "deliver"
	case Ignore:
		return "ignore"
	case Stop:
		return "stop"
	}
	return fmt.Sprintf("Action(%d)", int(a))
}

// ParseAction reads an operator's decision for Config.Others: "deliver" or
// "ignore".
func ParseAction(s string) (Action, error) {
	switch s {
	case "deliver":
		return Deliver, nil
	case "ignore":
		return Ignore, nil
	}
	return 0, fmt.Errorf("%q: want deliver (its inserts are outbox events) or ignore (they are not)", s)
}

// A Placement is the decision for one relation.
type Placement struct {
	Action Action
	Table  string // schema.name as the insert arrived
	What   string // what the table is, in words
	Fix    string // with Stop: what the operator can do
}

// Error is the error a caller returns for a Stop.
type Error struct{ Placement }

func (e *Error) Error() string {
	return fmt.Sprintf("an insert into %s cannot be placed: %s; %s", e.Table, e.What, e.Fix)
}

// A Querier runs one query returning at most one row: *pgxpool.Pool,
// *pgx.Conn and pgx.Tx satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config says what the outbox is.
type Config struct {
	Outbox      sql.Table // the configured outbox table
	Publication string
	// Others holds the operator's decisions for tables the relay cannot
	// place by itself, by "schema.name": Deliver or Ignore.
	Others map[string]Action
	// OthersKey names the setting that holds Others, for the fixes it
	// prints (the library speaks of fields; the caller knows the key).
	OthersKey string
}

// A Placer places relations. It is not safe for concurrent use; each Place
// queries the catalog, so callers cache the result per relation (a relation
// is announced once per connection and per change of its definition).
type Placer struct {
	q   Querier
	cfg Config
	// The outbox as resolved by Init.
	oid                   uint32
	schema, name, relkind string
	pg15                  bool
}

// New returns a Placer that knows the outbox by its configured name only;
// Init adds what the catalog says of it. New queries nothing.
func New(q Querier, cfg Config) *Placer {
	if cfg.OthersKey == "" {
		cfg.OthersKey = "Others"
	}
	return &Placer{q: q, cfg: cfg, schema: cfg.Outbox.Schema, name: cfg.Outbox.Name}
}

// Init resolves the configured outbox table by name (on the search_path
// when unqualified). A missing table is no error here: inserts under its
// configured name still place as the outbox, and every other one stops.
func (p *Placer) Init(ctx context.Context) error {
	var oid *uint32
	var schema, name, relkind *string
	var version int
	err := p.q.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname, c.relkind::text, current_setting('server_version_num')::int
FROM (SELECT to_regclass($1) AS oid) r
LEFT JOIN pg_catalog.pg_class c ON c.oid = r.oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace`, p.cfg.Outbox.Quoted()).Scan(&oid, &schema, &name, &relkind, &version)
	if err != nil {
		return fmt.Errorf("look up outbox table %s: %w", p.cfg.Outbox, err)
	}
	p.pg15 = version >= 150000
	if oid != nil {
		p.oid, p.schema, p.name, p.relkind = *oid, *schema, *name, *relkind
	} else {
		p.oid, p.schema, p.name, p.relkind = 0, p.cfg.Outbox.Schema, p.cfg.Outbox.Name, ""
	}
	return nil
}

// OID returns the outbox table's OID as Init found it, 0 when it does not
// exist.
func (p *Placer) OID() uint32 { return p.oid }

// Partitioned reports whether Init found a partitioned outbox table.
func (p *Placer) Partitioned() bool { return p.relkind == "p" }

// Outbox returns the outbox as Init resolved it: schema.name.
func (p *Placer) Outbox() string { return p.schema + "." + p.name }

// Named reports whether schema.name is the outbox's name as Init resolved
// it: an insert under it is the outbox's, with no need to ask the catalog.
func (p *Placer) Named(schema, name string) bool { return schema == p.schema && name == p.name }

// Place decides what inserts arriving under the relation oid, named
// schema.name, are.
func (p *Placer) Place(ctx context.Context, oid uint32, schema, name string) (Placement, error) {
	pl := Placement{Table: schema + "." + name}
	if a, ok := p.cfg.Others[pl.Table]; ok {
		pl.Action, pl.What = a, "named in "+p.cfg.OthersKey
		return pl, nil
	}
	if schema == p.schema && name == p.name {
		pl.Action, pl.What = Deliver, "the outbox table"
		return pl, nil
	}
	outbox := p.Outbox()
	var exists bool
	var curSchema, curName string
	err := p.q.QueryRow(ctx, `SELECT n.nspname, c.relname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&curSchema, &curName)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return pl, fmt.Errorf("look up relation %d (%s): %w", oid, pl.Table, err)
	default:
		exists = true
	}
	decide := func(a Action, what, fix string) (Placement, error) {
		pl.Action, pl.What, pl.Fix = a, what, fix
		return pl, nil
	}
	eitherWay := fmt.Sprintf("if its inserts are outbox events, set %s: {%q: deliver}; if they are not, set %s: {%q: ignore}; then restart the relay (nothing from this insert on was confirmed, so nothing is lost)",
		p.cfg.OthersKey, pl.Table, p.cfg.OthersKey, pl.Table)

	if p.oid != 0 && oid == p.oid {
		cur := curSchema + "." + curName
		if exists && cur == outbox {
			// The outbox itself, under a name it had when the insert was
			// written: a rename after it, already reflected in the config.
			return decide(Deliver, "the outbox table under an earlier name", "")
		}
		return decide(Stop, fmt.Sprintf("it is the outbox table %s, renamed or moved to %s while the relay ran", outbox, cur),
			fmt.Sprintf("set outbox.table to %s and restart the relay (nothing from this insert on was confirmed, so nothing is lost)", cur))
	}
	if !exists {
		return decide(Stop, fmt.Sprintf("the publication %s delivered it, but no table with its OID %d exists now (dropped since): it may have been a partition of the outbox %s",
			p.cfg.Publication, oid, outbox), eitherWay)
	}
	if p.oid != 0 {
		var found, allPartitions bool
		err := p.q.QueryRow(ctx, `WITH RECURSIVE up(relid, partitions) AS (
    SELECT i.inhparent, c.relispartition FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid WHERE i.inhrelid = $1
  UNION ALL
    SELECT i.inhparent, up.partitions AND c.relispartition FROM up
    JOIN pg_catalog.pg_inherits i ON i.inhrelid = up.relid
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
)
SELECT count(*) > 0, coalesce(bool_and(partitions), false) FROM up WHERE relid = $2`, oid, p.oid).Scan(&found, &allPartitions)
		if err != nil {
			return pl, fmt.Errorf("look up the ancestors of %s: %w", pl.Table, err)
		}
		if found {
			if allPartitions {
				return decide(Deliver, "a partition of the outbox table "+outbox, "")
			}
			return decide(Stop, fmt.Sprintf("it inherits from the outbox table %s (table inheritance, not a declarative partition): its rows may be events (inheritance-based partitioning) or not (an archive)", outbox),
				eitherWay)
		}
	}
	var ownRight, viaRoot bool
	q := `SELECT p.puballtables OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = $2)`
	if p.pg15 {
		q += ` OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid
  WHERE pn.pnpubid = p.oid AND c.oid = $2)`
	}
	q += `, p.pubviaroot FROM pg_catalog.pg_publication p WHERE p.pubname = $1`
	err = p.q.QueryRow(ctx, q, p.cfg.Publication, oid).Scan(&ownRight, &viaRoot)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return pl, fmt.Errorf("look up publication %s: %w", p.cfg.Publication, err)
	}
	// A partition detached from a partitioned outbox looks unrelated now,
	// yet its inserts from before the detach arrive under its own name when
	// the publication does not publish via the root: only then is "covered
	// in its own right" no proof.
	if ownRight && (viaRoot || !p.Partitioned()) {
		return decide(Ignore, fmt.Sprintf("not the outbox: publication %s covers it in its own right", p.cfg.Publication), "")
	}
	what := fmt.Sprintf("it is not the outbox %s nor a partition of it now, and publication %s does not cover it in its own right: it was probably a partition of the outbox, detached since",
		outbox, p.cfg.Publication)
	if ownRight {
		what = fmt.Sprintf("publication %s covers it in its own right, but it may also be a former partition of the partitioned outbox %s (the publication does not publish via the partition root, so a partition's inserts arrive under its own name)",
			p.cfg.Publication, outbox)
	}
	return decide(Stop, what, eitherWay)
}
