package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestPrunePartitions: with outbox.retention_partitions drop, prune
// --dry-run lists the partition that would go and the one kept for an
// undelivered row, and changes nothing; prune drops the one, keeps the
// other, keeps a partition whose range is not yet past the retention, and
// deletes the delivered old rows of the default partition, which it never
// drops.
func TestPrunePartitions(t *testing.T) {
	dsn, _ := dbEnv(t)
	setUp(t)
	testenv.ExecAs(t, dsn, `CREATE TABLE pobox (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
  event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE pobox_def PARTITION OF pobox DEFAULT`)
	for i, r := range [][2]int{{-30, -20}, {-20, -10}, {-10, 30}} {
		testenv.ExecAs(t, dsn, fmt.Sprintf(`DO $$ BEGIN EXECUTE format('CREATE TABLE pobox_p%d PARTITION OF pobox FOR VALUES FROM (%%L) TO (%%L)',
  now() + make_interval(days => %d), now() + make_interval(days => %d)); END $$`, i+1, r[0], r[1]))
	}
	insert := func(n int, age time.Duration) {
		testenv.ExecAs(t, dsn, fmt.Sprintf(`INSERT INTO pobox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT gen_random_uuid(), 'Order', 'a-1', 'Created', '{}', now() - make_interval(secs => %f) FROM generate_series(1, %d)`, age.Seconds(), n))
	}
	rows := func(table string) string { return testenv.QueryString(t, dsn, `SELECT count(*)::text FROM `+table) }
	insert(3, 25*24*time.Hour)  // p1
	insert(2, 15*24*time.Hour)  // p2
	insert(2, 400*24*time.Hour) // default
	insert(1, time.Hour)        // p3

	t.Setenv("RELAY_OUTBOX_TABLE", "public.pobox")
	t.Setenv("RELAY_OUTBOX_RETENTION", "7d")
	t.Setenv("RELAY_OUTBOX_RETENTION_PARTITIONS", "drop")
	// Both old partitions (3 + 2 rows) and the default one's 2 rows.
	setUntilPrunable(t, dsn, " 7 rows older than 7d (dry run")
	insert(1, 15*24*time.Hour) // p2, not delivered
	code, out, errOut := run(t, "prune", "--dry-run")
	if code != exitcode.OK {
		t.Fatalf("prune --dry-run = exit %d\n%s%s", code, out, errOut)
	}
	testenv.WantLines(t, "prune --dry-run", out,
		"would drop ", " partition public.pobox_p1 (3 rows, all delivered; its range ends more than 7d ago)",
		"kept ", " partition public.pobox_p2: 1 of its 3 rows are not known to be delivered",
		"would delete ", " 5 rows older than 7d (dry run: nothing deleted)")
	if strings.Contains(out, "pobox_p3") || strings.Contains(out, "pobox_def:") {
		t.Errorf("prune --dry-run lists a partition not past the retention or the default partition:\n%s", out)
	}
	if got := rows("pobox"); got != "9" {
		t.Errorf("after prune --dry-run: %s rows; want all 9", got)
	}

	code, out, errOut = run(t, "prune")
	if code != exitcode.OK {
		t.Fatalf("prune = exit %d\n%s%s", code, out, errOut)
	}
	testenv.WantLines(t, "prune", out, "dropped ", " partition public.pobox_p1 (3 rows",
		"kept ", " partition public.pobox_p2: 1 of its 3 rows",
		" 5 rows older than 7d: 3 dropped with their partitions, 2 in 1 batch of at most 1000",
		"oldest left ", ", older than 7d by ") // pobox_p2's undelivered row, 15 days old
	if strings.Contains(out, "no row") {
		t.Errorf("prune says no row is left although pobox_p2's undelivered row is due:\n%s", out)
	}
	if exists := testenv.QueryString(t, dsn, `SELECT (to_regclass('pobox_p1') IS NOT NULL)::text`); exists != "false" {
		t.Errorf("pobox_p1 exists after prune; want it dropped")
	}
	for table, want := range map[string]string{"pobox_p2": "3", "pobox_p3": "1", "pobox_def": "0", "pobox": "4"} {
		if got := rows(table); got != want {
			t.Errorf("after prune %s holds %s rows; want %s", table, got, want)
		}
	}
}

// TestPrunePartitionsNotOwned: drop and detach need the relay's role to own
// the partitions (detach: the outbox table too); prune says which it does
// not own and how to fix it, and removes nothing.
func TestPrunePartitionsNotOwned(t *testing.T) {
	dsn, _ := dbEnv(t)
	setUp(t)
	su := testenv.SuperuserDSN(t, dsn)
	if su == dsn {
		t.Skip("the test role is a superuser: it owns everything")
	}
	role := testenv.QueryString(t, dsn, `SELECT current_user::text`)
	testenv.ExecAs(t, su, `CREATE TABLE pobox (id uuid NOT NULL, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
  event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (id, created_at)) PARTITION BY RANGE (created_at)`,
		`CREATE TABLE pobox_old PARTITION OF pobox FOR VALUES FROM ('2000-01-01') TO ('2001-01-01')`,
		`CREATE TABLE pobox_def PARTITION OF pobox DEFAULT`,
		`GRANT SELECT, DELETE ON pobox, pobox_old, pobox_def TO `+sql.Ident(role))
	t.Setenv("RELAY_OUTBOX_TABLE", "public.pobox")
	t.Setenv("RELAY_OUTBOX_RETENTION", "7d")
	for mode, want := range map[string]string{
		"drop":   "outbox.retention_partitions: drop, but the relay's role does not own the partitions public.pobox_def, public.pobox_old: ALTER TABLE … OWNER TO <relay role>",
		"detach": "outbox.retention_partitions: detach, but the relay's role does not own the outbox table public.pobox (DETACH PARTITION alters it), nor the partitions public.pobox_def, public.pobox_old: ",
	} {
		t.Setenv("RELAY_OUTBOX_RETENTION_PARTITIONS", mode)
		code, out, errOut := run(t, "prune")
		if code != exitcode.Failure || !strings.Contains(errOut, want) {
			t.Errorf("prune with %s on partitions the role does not own = exit %d, %q%q; want %d saying %q", mode, code, out, errOut, exitcode.Failure, want)
		}
	}
	if exists := testenv.QueryString(t, dsn, `SELECT (to_regclass('pobox_old') IS NOT NULL)::text`); exists != "true" {
		t.Errorf("pobox_old is gone; want it kept")
	}
}
