package placement_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// placeDB is a fresh database with publication pub on the outbox table,
// which is partitioned when partitioned is set.
func placeDB(t *testing.T, partitioned bool, viaRoot bool) (*testenv.PG, *pgxpool.Pool) {
	t.Helper()
	pg := testenv.Postgres(t)
	if partitioned {
		pg.Exec(t, `CREATE TABLE outbox (id bigint, at date NOT NULL) PARTITION BY RANGE (at)`)
		pg.Exec(t, `CREATE TABLE outbox_2026 PARTITION OF outbox FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')`)
	} else {
		pg.Exec(t, `CREATE TABLE outbox (id bigint, at date NOT NULL)`)
	}
	pg.Exec(t, `CREATE TABLE orders (id bigint)`)
	pg.Exec(t, `CREATE TABLE audit (id bigint)`)
	with := ""
	if viaRoot {
		with = " WITH (publish_via_partition_root = true)"
	}
	pg.Exec(t, `CREATE PUBLICATION pub FOR TABLE outbox, orders`+with)
	return pg, pg.Pool(t)
}

func oidOfType(t *testing.T, pool *pgxpool.Pool, typ string) uint32 {
	t.Helper()
	var oid uint32
	if err := pool.QueryRow(context.Background(), `SELECT $1::regtype::oid`, typ).Scan(&oid); err != nil {
		t.Fatalf("oid of type %s: %v", typ, err)
	}
	return oid
}

func newPlacer(t *testing.T, pool *pgxpool.Pool, others map[string]placement.Action) *placement.Placer {
	t.Helper()
	p := placement.New(pool, placement.Config{Outbox: sql.Table{Schema: "public", Name: "outbox"}, Publication: "pub",
		Others: others, OthersKey: "outbox.other_tables"})
	if err := p.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return p
}

// place places the table under its current name and OID.
func place(t *testing.T, p *placement.Placer, oid uint32, table string) placement.Placement {
	t.Helper()
	schema, name, _ := strings.Cut(table, ".")
	pl, err := p.Place(context.Background(), oid, schema, name)
	if err != nil {
		t.Fatalf("Place(%s): %v", table, err)
	}
	return pl
}

func wantPlacement(t *testing.T, pl placement.Placement, action placement.Action, what, fix string) {
	t.Helper()
	if pl.Action != action || !strings.Contains(pl.What, what) || !strings.Contains(pl.Fix, fix) || (fix == "" && pl.Fix != "") {
		t.Errorf("placement of %s = %v, what %q, fix %q; want %v, what containing %q, fix containing %q", pl.Table, pl.Action, pl.What, pl.Fix, action, what, fix)
	}
}

// TestPlace holds the package's rule (DESIGN.md invariant 13): an insert is
// ignored only when its table is provably not the outbox, or when the
// operator said so; whatever may be the outbox's and cannot be placed stops,
// with the fix.
func TestPlace(t *testing.T) {
	t.Run("plain outbox", func(t *testing.T) {
		pg, pool := placeDB(t, false, false)
		p := newPlacer(t, pool, map[string]placement.Action{"public.audit": placement.Deliver})
		outbox := pg.OID(t, "public.outbox")
		if p.OID() != outbox || p.Partitioned() || p.Outbox() != "public.outbox" || !p.Named("public", "outbox") {
			t.Errorf("Init: oid %d (want %d), partitioned %v, outbox %s", p.OID(), outbox, p.Partitioned(), p.Outbox())
		}
		wantPlacement(t, place(t, p, outbox, "public.outbox"), placement.Deliver, "the outbox table", "")
		wantPlacement(t, place(t, p, pg.OID(t, "public.orders"), "public.orders"), placement.Ignore, "covers it in its own right", "")
		wantPlacement(t, place(t, p, pg.OID(t, "public.audit"), "public.audit"), placement.Deliver, "named in outbox.other_tables", "")
		// Not covered, not the outbox: a partition detached since, probably.
		pg.Exec(t, `CREATE TABLE loose (id bigint)`)
		wantPlacement(t, place(t, p, pg.OID(t, "public.loose"), "public.loose"), placement.Stop, "detached since",
			`set outbox.other_tables: {"public.loose": deliver}`)
		// An inheritance child of the outbox: events or an archive.
		pg.Exec(t, `CREATE TABLE archive () INHERITS (outbox)`)
		wantPlacement(t, place(t, p, pg.OID(t, "public.archive"), "public.archive"), placement.Stop, "table inheritance", "ignore")
		// A table dropped since its insert was decoded.
		gone := pg.OID(t, "public.loose")
		pg.Exec(t, `DROP TABLE loose`)
		wantPlacement(t, place(t, p, gone, "public.loose"), placement.Stop, "no table with its OID", "deliver")
		// Under an earlier name, the config already renamed: the outbox.
		wantPlacement(t, place(t, p, outbox, "public.outbox_old"), placement.Deliver, "earlier name", "")
		// Renamed while the relay ran: stop, and say the new name.
		pg.Exec(t, `ALTER TABLE outbox RENAME TO events`)
		wantPlacement(t, place(t, p, outbox, "public.outbox_old"), placement.Stop, "renamed or moved to public.events", "set outbox.table to public.events")
	})
	t.Run("partitioned outbox", func(t *testing.T) {
		pg, pool := placeDB(t, true, false)
		p := newPlacer(t, pool, nil)
		if !p.Partitioned() {
			t.Fatal("Init: a partitioned outbox not seen as one")
		}
		wantPlacement(t, place(t, p, pg.OID(t, "public.outbox_2026"), "public.outbox_2026"), placement.Deliver, "a partition of the outbox", "")
		// Covered in its own right, but without publish_via_partition_root a
		// former partition's inserts arrive under its own name too.
		wantPlacement(t, place(t, p, pg.OID(t, "public.orders"), "public.orders"), placement.Stop, "may also be a former partition", "ignore")
	})
	t.Run("partitioned outbox, via root", func(t *testing.T) {
		pg, pool := placeDB(t, true, true)
		p := newPlacer(t, pool, nil)
		wantPlacement(t, place(t, p, pg.OID(t, "public.orders"), "public.orders"), placement.Ignore, "covers it in its own right", "")
	})
	t.Run("missing outbox", func(t *testing.T) {
		pg := testenv.Postgres(t)
		pg.Exec(t, `CREATE TABLE orders (id bigint)`)
		pg.Exec(t, `CREATE PUBLICATION pub FOR TABLE orders`)
		pool := pg.Pool(t)
		p := newPlacer(t, pool, nil)
		if p.OID() != 0 || p.Outbox() != "public.outbox" {
			t.Errorf("Init of a missing outbox: oid %d, outbox %s; want 0, public.outbox", p.OID(), p.Outbox())
		}
		wantPlacement(t, place(t, p, 1, "public.outbox"), placement.Deliver, "the outbox table", "")
		wantPlacement(t, place(t, p, pg.OID(t, "public.orders"), "public.orders"), placement.Ignore, "own right", "")
	})
}

func TestParseAction(t *testing.T) {
	for in, want := range map[string]placement.Action{"deliver": placement.Deliver, "ignore": placement.Ignore} {
		if got, err := placement.ParseAction(in); err != nil || got != want {
			t.Errorf("ParseAction(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := placement.ParseAction("stop"); err == nil || !strings.Contains(err.Error(), "want deliver") {
		t.Errorf("ParseAction(stop) = %v; want an error naming deliver and ignore (stop is the relay's, not the operator's)", err)
	}
	e := &placement.Error{Placement: placement.Placement{Action: placement.Stop, Table: "public.t", What: "why", Fix: "do this"}}
	if got := e.Error(); got != "an insert into public.t cannot be placed: why; do this" {
		t.Errorf("Error() = %q", got)
	}
}
