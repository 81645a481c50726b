package main

import (
	"bytes"
	"fmt"
	"net/url"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// execScript runs a script as psql would in autocommit mode: statement by
// statement (the slot may not be created in a transaction that wrote), a
// statement ending at a line ending in ';' outside a dollar-quoted body.
func execScript(t *testing.T, dsn, script string) {
	t.Helper()
	var stmts []string
	var cur strings.Builder
	inBody := false
	for _, line := range strings.Split(script, "\n") {
		if !inBody && (strings.HasPrefix(line, "--") || strings.TrimSpace(line) == "") {
			continue
		}
		if strings.Count(line, "$$")%2 == 1 {
			inBody = !inBody
		}
		cur.WriteString(line + "\n")
		if !inBody && strings.HasSuffix(strings.TrimSpace(line), ";") {
			stmts = append(stmts, cur.String())
			cur.Reset()
		}
	}
	if strings.TrimSpace(cur.String()) != "" {
		t.Fatalf("script ends inside a statement:\n%s", cur.String())
	}
	if len(stmts) < 10 {
		t.Fatalf("script has %d statements; want the tables, publication, role, grants and slot:\n%s", len(stmts), script)
	}
	testenv.ExecAs(t, dsn, stmts...)
}

// TestLeastPrivilege runs the relay as a role with LOGIN REPLICATION and the
// grants of `setup --print-sql`, nothing more: the DBA runs the printed
// statements as a superuser on a fresh database; check names every missing
// grant with the statement that fixes it, and passes once they are run; run
// delivers events and saves checkpoints; lag, status and retries work.
func TestLeastPrivilege(t *testing.T) {
	cleanEnv(t)
	base := testenv.Postgres(t).DSN // only to learn the superuser's DSN; the role must outlive the test's database
	admin := testenv.SuperuserDSN(t, base)
	role, password := testenv.LeastPrivilegedRole(t, admin)
	dsn, slot := dbEnv(t)
	su := testenv.SuperuserDSN(t, dsn)
	roleDSN := testenv.WithUser(t, dsn, "postgres://"+url.UserPassword(role, password).String()+"@x/")
	k := testenv.Kafka(t)
	aggType := uniqueName(t, "Lp")
	topic := "outbox.event." + aggType
	k.CreateTopic(t, topic, 1)
	t.Setenv("RELAY_POSTGRES_DSN", roleDSN)
	t.Setenv("RELAY_KAFKA_BROKERS", strings.Join(k.Brokers, ","))
	t.Setenv("RELAY_METRICS_LISTEN", "")

	code, script, errOut := run(t, "setup", "--print-sql", "--create-outbox-table")
	if code != exitcode.OK {
		t.Fatalf("setup --print-sql exit = %d\n%s", code, errOut)
	}
	testenv.WantLines(t, "setup --print-sql", script,
		`GRANT CONNECT ON DATABASE `,
		`GRANT USAGE ON SCHEMA "public" TO "`+role+`";`,
		`GRANT SELECT ON TABLE "public"."outbox" TO "`+role+`";`,
		`SELECT pg_catalog.pg_create_logical_replication_slot('`+slot+`', 'pgoutput')`)
	execScript(t, su, script)

	privs := sql.RelayPrivileges(sql.DefaultObjects())
	// No grants at all (PUBLIC's USAGE on public too, so that its grant counts).
	testenv.ExecAs(t, su, `REVOKE USAGE ON SCHEMA public FROM PUBLIC`)
	for _, p := range privs {
		testenv.ExecAs(t, su, p.Revoke(role))
	}
	code, out, _ := run(t, "check")
	if code != exitcode.Failure {
		t.Errorf("check without grants: exit = %d; want %d\n%s", code, exitcode.Failure, out)
	}
	for _, p := range privs {
		testenv.WantLines(t, "check without grants", out, "fix: "+p.Grant(role)+"\n")
	}
	if n := strings.Count(out, "FAIL  privileges: "); n != len(privs) {
		t.Errorf("check without grants: %d privilege failures; want %d (one per object)\n%s", n, len(privs), out)
	}
	if strings.Contains(out, "cannot read it") {
		t.Errorf("check says a table cannot be read instead of naming the grant:\n%s", out)
	}

	// Exactly the printed statements, again.
	execScript(t, su, script)
	code, out, _ = run(t, "check")
	if code != exitcode.OK || strings.Contains(out, "FAIL") || strings.Contains(out, "warn") {
		t.Fatalf("check after the printed statements: exit = %d; want 0 and no FAIL or warn\n%s", code, out)
	}
	testenv.WantLines(t, "check", out, "ok    role: "+role+" has REPLICATION", "ok    privileges: "+role+" has what the relay needs on ",
		"info  TLS: no - the connection is not encrypted; set sslmode=verify-full")
	// The bound's running-xacts records: granted by the script where the
	// server has the function (Postgres 16+).
	testenv.WantLines(t, "setup --print-sql", script, "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %I")
	if v := testenv.QueryString(t, su, `SHOW server_version_num`); v >= "160000" {
		testenv.WantLines(t, "check", out, `ok    max_retained_wal: "`+role+`" may run pg_log_standby_snapshot()`)
	} else {
		testenv.WantLines(t, "check", out, "info  max_retained_wal: before Postgres 16 the relay near the bound logs running-xacts records by creating and dropping a temporary slot")
	}

	// run, as the role: events delivered, a failed event stored in the
	// retry table (INSERT and the sequence), checkpoints saved.
	bin := testenv.RelayBinary(t)
	relay := exec.Command(bin, "run")
	var stderr bytes.Buffer
	relay.Stderr = &stderr
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		relay.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- relay.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("outbox-relay run as %s: %v\nstderr:\n%s", role, err, stderr.String())
			}
		case <-time.After(45 * time.Second):
			relay.Process.Kill()
			t.Errorf("outbox-relay run did not stop within 45s of SIGTERM\nstderr:\n%s", stderr.String())
		}
	}
	defer stop()
	testenv.ExecAs(t, su, fmt.Sprintf(`INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), %s, 'a' || i, 'Created', jsonb_build_object('n', i) FROM generate_series(1, 3) i`, sql.Literal(aggType)))
	// Unroutable (empty aggregate id): dead in the retry table at once.
	testenv.ExecAs(t, su, fmt.Sprintf(`INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload)
VALUES (gen_random_uuid(), %s, '', 'Created', '{}')`, sql.Literal(aggType)))
	deadline := time.Now().Add(90 * time.Second)
	for {
		msgs := k.ReadAll(t, topic)
		retried := testenv.QueryString(t, su, `SELECT count(*)::text FROM outbox_relay_retry`)
		saved := testenv.QueryString(t, su, `SELECT count(*)::text FROM outbox_relay_checkpoint WHERE slot_name = $1 AND lsn > '0/0'`, slot)
		if len(msgs) >= 3 && retried == "1" && saved == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("as %s after 90s: %d messages on %s (want 3), %s retry rows (want 1), %s checkpoint rows (want 1)\nstderr:\n%s",
				role, len(msgs), topic, retried, saved, stderr.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
	stop()
	if s := stderr.String(); strings.Contains(s, "permission denied") || strings.Contains(s, "as its owner") {
		t.Errorf("run as %s logged a permission problem:\n%s", role, s)
	}

	// The operator commands, as the role, with the relay stopped.
	seq := testenv.QueryString(t, su, `SELECT seq::text FROM outbox_relay_retry`)
	current := testenv.QueryString(t, su, `SELECT pg_current_wal_lsn()::text`)
	for _, args := range [][]string{
		{"lag"}, {"status"}, {"checkpoint", "show"},
		{"retries", "list"}, {"retries", "show", seq}, {"retries", "requeue", "--all-dead"}, {"retries", "drop", seq, "--yes"},
		{"replay", "--id", uniqueName(t, "r"), "--aggregate-type", aggType, "--aggregate-id", "a1"},
		{"checkpoint", "set", current, "--yes"},
	} {
		code, out, errOut := run(t, args...)
		if code != exitcode.OK {
			t.Errorf("%s as %s: exit = %d; want 0\n%s%s", strings.Join(args, " "), role, code, out, errOut)
		}
	}
	if got := testenv.QueryString(t, su, `SELECT count(*)::text FROM outbox_relay_retry`); got != "0" {
		t.Errorf("retry rows after retries drop = %s; want 0", got)
	}
	if got := testenv.QueryString(t, su, `SELECT count(*)::text FROM outbox_relay_replay`); got != "1" {
		t.Errorf("replay runs saved = %s; want 1", got)
	}

	// Retention needs DELETE on the outbox: check names it, and the
	// statements printed for that configuration give it.
	t.Setenv("RELAY_OUTBOX_RETENTION", "1d")
	code, out, _ = run(t, "check")
	if code != exitcode.Failure {
		t.Errorf("check with retention, without DELETE: exit = %d; want %d", code, exitcode.Failure)
	}
	testenv.WantLines(t, "check with retention", out, `fix: GRANT DELETE ON TABLE "public"."outbox" TO "`+role+`"`)
	code, script, _ = run(t, "setup", "--print-sql")
	if code != exitcode.OK || !strings.Contains(script, `GRANT SELECT, DELETE ON TABLE "public"."outbox" TO "`+role+`";`) {
		t.Fatalf("setup --print-sql with retention: exit %d, no DELETE on the outbox:\n%s", code, script)
	}
	execScript(t, su, script)
	for _, args := range [][]string{{"check"}, {"prune"}} {
		if code, out, errOut := run(t, args...); code != exitcode.OK {
			t.Errorf("%s as %s with retention: exit = %d; want 0\n%s%s", args[0], role, code, out, errOut)
		}
	}
	t.Setenv("RELAY_OUTBOX_RETENTION", "")

	// One privilege at a time: check names it, and the GRANT it prints fixes it.
	for _, p := range privs {
		for _, priv := range p.Privileges {
			t.Run(strings.ReplaceAll(p.What, " ", "_")+"_"+priv, func(t *testing.T) {
				testenv.ExecAs(t, su, p.Revoke(role, priv))
				code, out, _ := run(t, "check")
				if code != exitcode.Failure {
					t.Errorf("check without %s on %s: exit = %d; want %d", priv, p.Target(), code, exitcode.Failure)
				}
				grant := p.Grant(role, priv)
				testenv.WantLines(t, "check", out, fmt.Sprintf("FAIL  privileges: %s lacks %s on ", role, priv), "fix: "+grant+"\n")
				if n := strings.Count(out, "FAIL"); n != 1 {
					t.Errorf("check without %s on %s: %d FAIL lines; want 1\n%s", priv, p.Target(), n, out)
				}
				testenv.ExecAs(t, su, grant)
				if code, out, _ := run(t, "check"); code != exitcode.OK {
					t.Errorf("check after %s: exit = %d; want 0\n%s", grant, code, out)
				}
			})
		}
	}
}

// TestPrintSQLConnectsNowhere: setup --print-sql prints from the
// configuration alone (a DSN nothing answers at), for the role of the DSN or
// --role, and --role needs --print-sql. What the statements are:
// internal/admin's TestPrintSQL.
func TestPrintSQLConnectsNowhere(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://app_relay:secret@127.0.0.1:9/shop?connect_timeout=1")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9")
	t.Setenv("RELAY_OUTBOX_TABLE", "events.outbox")
	t.Setenv("RELAY_OUTBOX_RETENTION", "7d")
	t.Setenv("RELAY_RETRY_TABLE", "relay.retry")
	code, out, errOut := run(t, "setup", "--print-sql")
	if code != exitcode.OK {
		t.Fatalf("setup --print-sql exit = %d\n%s", code, errOut)
	}
	testenv.WantLines(t, "setup --print-sql", out,
		`CREATE TABLE IF NOT EXISTS "relay"."retry" (`,
		`GRANT SELECT, DELETE ON TABLE "events"."outbox" TO "app_relay";`)
	if strings.Contains(out, "CREATE TABLE IF NOT EXISTS \"events\".\"outbox\"") || strings.Contains(out, "secret") {
		t.Errorf("setup --print-sql without --create-outbox-table printed the outbox table, or the password:\n%s", out)
	}

	code, out, _ = run(t, "setup", "--print-sql", "--role", "other")
	if code != exitcode.OK || !strings.Contains(out, `GRANT SELECT, INSERT, UPDATE ON TABLE "outbox_relay_checkpoint" TO "other";`) {
		t.Errorf("setup --print-sql --role other: exit %d\n%s", code, out)
	}
	if code, _, errOut := run(t, "setup", "--role", "other"); code != exitcode.Usage {
		t.Errorf("setup --role without --print-sql: exit = %d; want %d\n%s", code, exitcode.Usage, errOut)
	}
}
