package sql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

func TestGrantStatements(t *testing.T) {
	objs := sql.Objects{
		Outbox:     sql.Table{Schema: "app", Name: "Outbox"},
		Checkpoint: sql.Table{Name: "cp"},
		Retry:      sql.Table{Schema: "relay", Name: strings.Repeat("r", 60)},
		Retention:  true,
	}
	var got []string
	for _, p := range sql.RelayPrivileges(objs) {
		got = append(got, p.Grant(`my"role`))
	}
	want := []string{
		`GRANT USAGE ON SCHEMA "app" TO "my""role"`,
		`GRANT USAGE ON SCHEMA "public" TO "my""role"`,
		`GRANT USAGE ON SCHEMA "relay" TO "my""role"`,
		`GRANT SELECT, DELETE ON TABLE "app"."Outbox" TO "my""role"`,
		`GRANT SELECT, INSERT, UPDATE ON TABLE "cp" TO "my""role"`,
		`GRANT SELECT, INSERT, DELETE ON TABLE "cp_history" TO "my""role"`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "relay"."` + strings.Repeat("r", 60) + `" TO "my""role"`,
		`GRANT USAGE ON SEQUENCE "relay"."` + strings.Repeat("r", 55) + `_seq_seq" TO "my""role"`,
		`GRANT SELECT, INSERT, DELETE ON TABLE "relay"."outbox_relay_wal_buffer" TO "my""role"`,
		`GRANT SELECT, INSERT, UPDATE ON TABLE "outbox_relay_replay" TO "my""role"`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("RelayPrivileges grants =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	p := sql.RelayPrivileges(objs)[4]
	if got, want := p.Revoke("r", "INSERT"), `REVOKE INSERT ON TABLE "cp" FROM "r"`; got != want {
		t.Errorf("Revoke = %q; want %q", got, want)
	}
	if got := sql.Do("SELECT '$$'"); !strings.HasPrefix(got, "DO $q0$") || !strings.HasSuffix(got, "$q0$") {
		t.Errorf("Do of a body holding $$ = %q; want another tag", got)
	}
}

// TestGrantsFile runs 001 to 006 (not the slot's 003) as a superuser, twice,
// with 006's role renamed to a unique one (roles are cluster-wide), and checks
// that the role then has every privilege RelayPrivileges lists, LOGIN and
// REPLICATION, and nothing of a superuser.
func TestGrantsFile(t *testing.T) {
	ctx := context.Background()
	pg := testenv.Postgres(t)
	su := testenv.SuperuserDSN(t, pg.DSN)
	admin := testenv.SuperuserDSN(t, pg.AdminDSN)
	role := testenv.UniqueName(t, "grants")
	t.Cleanup(func() {
		// After the database: the grants in it are gone with it.
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop role: %v", err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP ROLE IF EXISTS `+sql.Ident(role)); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	// Registered after the role's cleanup, so run before it.
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, su)
		if err == nil {
			conn.Exec(ctx, `DROP OWNED BY `+sql.Ident(role))
			conn.Close(ctx)
		}
	})
	conn := connect(t, su)
	for range 2 {
		for _, name := range []string{"001_outbox.sql", "002_relay.sql", "004_retry.sql", "005_replay.sql", "006_grants.sql"} {
			b, err := sql.Files.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			text := string(b)
			if name == "006_grants.sql" {
				text = strings.NewReplacer(`"outbox_relay"`, sql.Ident(role), `'outbox_relay'`, sql.Literal(role)).Replace(text)
				if strings.Contains(text, `"outbox_relay"`) {
					t.Fatalf("006_grants.sql names outbox_relay other than as the role")
				}
			}
			if _, err := conn.PgConn().Exec(ctx, text).ReadAll(); err != nil {
				t.Fatalf("run %s: %v", name, err)
			}
		}
	}
	var login, repl, super bool
	if err := conn.QueryRow(ctx, `SELECT rolcanlogin, rolreplication, rolsuper FROM pg_roles WHERE rolname = $1`, role).Scan(&login, &repl, &super); err != nil {
		t.Fatal(err)
	}
	if !login || !repl || super {
		t.Errorf("role after 006_grants.sql: login %v, replication %v, superuser %v; want true, true, false", login, repl, super)
	}
	var seq string
	if err := conn.QueryRow(ctx, `SELECT pg_get_serial_sequence('outbox_relay_retry', 'seq')`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if want := "public." + sql.RetrySequence(sql.Table{Name: sql.DefaultRetryTable}).Name; seq != want {
		t.Errorf("the retry table's sequence is %s; RetrySequence says %s", seq, want)
	}
	for _, p := range sql.RelayPrivileges(sql.DefaultObjects()) {
		for _, priv := range p.Privileges {
			var q string
			switch p.Kind {
			case sql.Schema:
				q = `SELECT has_schema_privilege($1, $2, $3)`
			case sql.Sequence:
				q = `SELECT has_sequence_privilege($1, $2, $3)`
			default:
				q = `SELECT has_table_privilege($1, $2, $3)`
			}
			obj := p.Object.Quoted()
			if p.Kind == sql.Schema {
				obj = p.Object.Name
			}
			var ok bool
			if err := conn.QueryRow(ctx, q, role, obj, priv).Scan(&ok); err != nil {
				t.Fatalf("%s on %s: %v", priv, obj, err)
			}
			if !ok {
				t.Errorf("after 006_grants.sql %s lacks %s on %s", role, priv, p.Target())
			}
		}
	}
	var del bool
	if err := conn.QueryRow(ctx, `SELECT has_table_privilege($1, 'public.outbox', 'DELETE')`, role).Scan(&del); err != nil || del {
		t.Errorf("after 006_grants.sql %s may delete from the outbox (%v): retention's grant is commented out", role, err)
	}
}

// TestRetrySequenceLongName: PostgreSQL's name for a long retry table's
// sequence is the one RetrySequence gives.
func TestRetrySequenceLongName(t *testing.T) {
	conn := connect(t, newDatabase(t))
	ctx := context.Background()
	long := sql.Table{Name: strings.Repeat("x", 63)}
	for _, s := range sql.RetryTable(long) {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("exec %q: %v", s, err)
		}
	}
	var seq string
	if err := conn.QueryRow(ctx, `SELECT pg_get_serial_sequence($1, 'seq')`, long.Quoted()).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	if want := "public." + sql.RetrySequence(long).Name; seq != want {
		t.Errorf("sequence of %s = %s; RetrySequence says %s", long.Name[:10]+"...", seq, want)
	}
}
