package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// secretWord is a password that is also part of names the output must show:
// the slot, the table, the topics and the role. The token scrubber this
// replaces printed relay.Payment as xxxxx.Payment for the password "relay".
const secretWord = "relayqz"

// TestNoSecretInAnyOutput runs every command of the real binary against the
// dev servers with a role whose password is hostile, and searches all they
// print (stdout, stderr, the log at debug level, /metrics, /healthz, /readyz,
// a panic) for the password in each spelling a program might use. The names
// holding the password must be printed intact.
func TestNoSecretInAnyOutput(t *testing.T) {
	bin := testenv.RelayBinary(t)
	for _, tt := range []struct{ name, password string }{
		// A word that slot, table, topic and role names contain.
		{"word", secretWord},
		// Every character that a URL or keyword/value DSN gives a
		// meaning to, so that each escaped spelling differs; the outbox
		// table's name contains it.
		{"url-special", secretWord + `@/:%?#& +x'"\=`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			s := newSecretsRun(t, bin, tt.password)
			s.commands(t)
			s.assertClean(t)
		})
	}

	t.Run("kafka sasl", func(t *testing.T) {
		cleanEnv(t)
		s := newSecretsRun(t, bin, secretWord+"pg")
		s.required = []string{s.slot}
		s.mustExec(t, nil, "setup", "--create-outbox-table")
		wrong := "K" + secretWord + `@/:%?#& +y`
		wrongFile := writeFile(t, "sasl-wrong", wrong+"\n")
		s.secrets = append(s.secrets, wrong)
		sasl := []string{"RELAY_KAFKA_SASL_MECHANISM=scram-sha-512", "RELAY_KAFKA_SASL_USERNAME=" + os.Getenv("RELAY_TEST_KAFKA_SASL_USER")}

		// The dev broker's SASL_SSL listener (scripts/dev.sh), when the
		// servers have it: the right password delivers, a wrong one fails.
		if brokers := os.Getenv("RELAY_TEST_KAFKA_SASL_BROKERS"); brokers != "" {
			good := os.Getenv("RELAY_TEST_KAFKA_SASL_PASSWORD")
			s.secrets = append(s.secrets, good)
			goodFile := writeFile(t, "sasl-good", good+"\n")
			// The SASL user may write but not create topics.
			topic := os.Getenv("RELAY_TEST_KAFKA_TOPIC_PREFIX") + uniqueName(t, "payment")
			testenv.Kafka(t).CreateTopic(t, topic, 1)
			secure := append([]string{"RELAY_KAFKA_BROKERS=" + brokers, "RELAY_KAFKA_TLS_ENABLED=true",
				"RELAY_KAFKA_TLS_CA_FILE=" + os.Getenv("RELAY_TEST_TLS_DIR") + "/ca.pem",
				"RELAY_TOPICS_OVERRIDES=Payment=" + topic}, sasl...)
			s.insert(t, false)
			s.runFor(t, append(secure, "RELAY_KAFKA_SASL_PASSWORD_FILE="+goodFile), 0, true)
			s.exec(t, append(secure, "RELAY_KAFKA_SASL_PASSWORD="+good), "check")
			s.exec(t, append(secure, "RELAY_KAFKA_SASL_PASSWORD_FILE="+wrongFile), "check")
			s.insert(t, false)
			s.runFor(t, append(secure, "RELAY_KAFKA_SASL_PASSWORD_FILE="+wrongFile), 5*time.Second, false)
		} else {
			t.Log("RELAY_TEST_KAFKA_SASL_BROKERS is not set (dev servers without the SASL listener): only the failing handshake is tested")
		}
		// The PLAINTEXT listener: the SASL handshake fails.
		for _, env := range [][]string{
			{"RELAY_KAFKA_SASL_PASSWORD_FILE=" + wrongFile},
			{"RELAY_KAFKA_SASL_PASSWORD=" + wrong},
		} {
			env = append(env, sasl...)
			s.exec(t, env, "check")
			s.insert(t, false)
			s.runFor(t, env, 4*time.Second, false)
			s.exec(t, env, "replay", "--dry-run")
		}
		s.assertClean(t)
	})
}

// secretsRun is one database, role and configuration, and everything the
// commands printed.
type secretsRun struct {
	bin, password, passwordFile string
	superDSN, dbDSN, dsn        string // dsn: the role's, without a password
	roleDSN                     string // dsn with the password
	insertLSN                   string // pg_current_wal_lsn() after the last insert
	role, slot, table, topic    string
	brokers                     string
	wantRetry                   bool
	secrets                     []string // passwords whose every form must be absent
	names                       []string // names holding them, shown intact
	required                    []string // names that must be shown; default names
	out                         bytes.Buffer
}

func newSecretsRun(t *testing.T, bin, password string) *secretsRun {
	t.Helper()
	s := &secretsRun{bin: bin, password: password, secrets: []string{password}}
	// Registered before the database's cleanup, so it runs after it: the
	// role owns the database until then.
	t.Cleanup(func() {
		if s.role != "" {
			testenv.ExecAs(t, s.superDSN, "DROP ROLE IF EXISTS "+sql.Ident(s.role))
		}
	})
	pg := testenv.Postgres(t) // skips under -short
	s.dbDSN = pg.DSN
	admin, err := pgconn.ParseConfig(pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	s.role = uniqueName(t, secretWord)
	s.slot = uniqueName(t, secretWord)
	s.table = "outbox_" + password
	s.topic = secretWord + "." + uniqueName(t, "Payment")
	s.names = []string{s.role, s.slot, s.table, s.topic}
	// A REPLICATION role can only be created by a superuser on Postgres 15.
	// scripts/dev.sh exports one; testenv's Docker containers' admin is one.
	if s.superDSN = os.Getenv("RELAY_TEST_POSTGRES_SUPERUSER_DSN"); s.superDSN == "" {
		if testenv.QueryString(t, s.dbDSN, "SELECT rolsuper::text FROM pg_roles WHERE rolname = current_user") != "true" {
			t.Fatal("RELAY_TEST_POSTGRES_SUPERUSER_DSN is not set and the test role is no superuser: start the dev servers with `make dev-up` and export them with `eval \"$(make -s dev-env)\"`")
		}
		s.superDSN = pg.AdminDSN // outlives the test database, for the DROP ROLE
	}
	testenv.ExecAs(t, s.superDSN,
		fmt.Sprintf("CREATE ROLE %s LOGIN REPLICATION PASSWORD %s", sql.Ident(s.role), sql.Literal(password)),
	)
	// What setup needs: the database stays the admin's, so that testenv
	// drops it (and these grants) before the role is dropped.
	testenv.ExecAs(t, s.dbDSN,
		fmt.Sprintf("GRANT CREATE ON DATABASE %s TO %s", sql.Ident(admin.Database), sql.Ident(s.role)),
		"GRANT CREATE, USAGE ON SCHEMA public TO "+sql.Ident(s.role))
	s.dsn = fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", s.role, net.JoinHostPort(admin.Host, fmt.Sprint(admin.Port)), admin.Database)
	s.passwordFile = writeFile(t, "pg-password", password+"\n")
	// The role owns what setup creates: the test reads and writes it as the role.
	if s.roleDSN, err = withPassword(s.dsn, password); err != nil {
		t.Fatal(err)
	}
	s.brokers = kafkaBrokers(t)
	return s
}

// env is the configuration every command gets, on top of which each call
// adds its own (later entries win).
func (s *secretsRun) env(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") && !strings.HasPrefix(kv, "PG") {
			env = append(env, kv)
		}
	}
	env = append(env,
		"PGPASSFILE=/nonexistent",
		"RELAY_POSTGRES_DSN="+s.dsn,
		"RELAY_POSTGRES_PASSWORD_FILE="+s.passwordFile,
		"RELAY_POSTGRES_SLOT="+s.slot,
		"RELAY_OUTBOX_TABLE="+s.table,
		"RELAY_TOPICS_OVERRIDES=Payment="+s.topic,
		"RELAY_KAFKA_BROKERS="+s.brokers,
		"RELAY_LOG_LEVEL=debug",
		// Draining into a Kafka that refuses the relay would wait 30s.
		"RELAY_PIPELINE_SHUTDOWN_TIMEOUT=3s",
		"RELAY_METRICS_LISTEN=",
	)
	return append(env, extra...)
}

// exec runs the binary to its end, keeps its output and returns its exit code.
func (s *secretsRun) exec(t *testing.T, extra []string, args ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env = s.env(extra)
	out, err := cmd.CombinedOutput()
	fmt.Fprintf(&s.out, "$ outbox-relay %s\n%s\n", strings.Join(args, " "), out)
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("outbox-relay %s: %v\n%s", strings.Join(args, " "), err, out)
	return -1
}

func (s *secretsRun) mustExec(t *testing.T, extra []string, args ...string) {
	t.Helper()
	if code := s.exec(t, extra, args...); code != 0 {
		t.Fatalf("outbox-relay %s: exit %d\n%s", strings.Join(args, " "), code, s.out.String())
	}
}

// runFor runs `outbox-relay run` for d (or, with deliver, until the events
// are delivered), scraping its HTTP endpoints, then stops it with SIGTERM.
func (s *secretsRun) runFor(t *testing.T, extra []string, d time.Duration, deliver bool) {
	t.Helper()
	cmd, out, listen := s.startRun(t, extra)
	defer cmd.Process.Kill()
	deadline := time.Now().Add(d)
	if deliver {
		deadline = time.Now().Add(60 * time.Second)
	}
	for time.Now().Before(deadline) {
		if deliver && s.delivered(t) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if deliver && !s.delivered(t) {
		t.Errorf("run did not deliver the events within a minute\n%s", out.String())
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		body := httpGet(t, "http://"+listen+path)
		fmt.Fprintf(&s.out, "$ curl %s\n%s\n", path, body)
		if path == "/metrics" && deliver && !strings.Contains(body, "outbox_relay_events_delivered_total") {
			t.Errorf("/metrics lacks outbox_relay_events_delivered_total:\n%s", body)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(60 * time.Second):
		t.Errorf("run did not stop within 60s of SIGTERM")
	}
	fmt.Fprintf(&s.out, "$ outbox-relay run\n%s\n", out.String())
}

// startRun starts `outbox-relay run` with its metrics on a free address,
// its output kept in out.
func (s *secretsRun) startRun(t *testing.T, extra []string) (cmd *exec.Cmd, out *bytes.Buffer, listen string) {
	t.Helper()
	listen = testenv.FreeAddr(t)
	cmd = exec.Command(s.bin, "run")
	cmd.Env = append(s.env(extra), "RELAY_METRICS_LISTEN="+listen)
	out = &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out, listen
}

// delivered: the slot confirmed the last insert and, when the unroutable
// event was inserted, it waits in the retry table.
func (s *secretsRun) delivered(t *testing.T) bool {
	t.Helper()
	want := 0
	if s.wantRetry {
		want = 1
	}
	got := testenv.QueryString(t, s.roleDSN, `SELECT (confirmed_flush_lsn >= $1::pg_lsn
		AND (SELECT count(*) FROM outbox_relay_retry) >= $2)::text
		FROM pg_replication_slots WHERE slot_name = $3`, s.insertLSN, want, s.slot)
	return got == "true"
}

// insert adds two Payment events and, with unroutable, one whose topic
// Kafka refuses (it goes to the retry table).
func (s *secretsRun) insert(t *testing.T, unroutable bool) {
	t.Helper()
	rows := `(gen_random_uuid(), 'Payment', 'p-1', 'Paid', '{"n": 1}'), (gen_random_uuid(), 'Payment', 'p-2', 'Paid', '{"n": 2}')`
	if unroutable {
		rows += `, (gen_random_uuid(), 'bad topic !', 'b-1', 'Odd', '{"n": 3}')`
		s.wantRetry = true
	}
	testenv.ExecAs(t, s.roleDSN, fmt.Sprintf(`INSERT INTO %s (id, aggregate_type, aggregate_id, event_type, payload) VALUES `+rows, sql.Ident(s.table)))
	s.insertLSN = testenv.QueryString(t, s.roleDSN, "SELECT pg_current_wal_lsn()::text")
}

func (s *secretsRun) commands(t *testing.T) {
	t.Helper()
	hostPort := strings.TrimPrefix(strings.SplitN(s.dsn, "/", 4)[2], s.role+"@")
	pc, _ := pgconn.ParseConfig(s.dsn)
	db := pc.Database
	none := []string(nil)

	s.mustExec(t, none, "setup", "--create-outbox-table")
	s.insert(t, true)
	s.runFor(t, none, 0, true)

	for _, args := range [][]string{
		{"check"},
		{"status"}, {"status", "--json"},
		{"lag"}, {"lag", "--json"},
		{"retries", "list"}, {"retries", "list", "--json"},
		{"retries", "show", "1"}, {"retries", "show", "1", "--json"},
		{"checkpoint", "show"}, {"checkpoint", "show", "--json"},
		{"replay", "--dry-run"},
		{"prune", "--dry-run", "--retention", "7d"},
		{"setup"},
	} {
		s.exec(t, none, args...)
	}
	if out := s.out.String(); !strings.Contains(out, s.topic) {
		t.Errorf("no command printed the topic %s:\n%s", s.topic, out)
	}

	// The password in the DSN, URL-encoded and as keyword/value settings.
	noFile := []string{"RELAY_POSTGRES_PASSWORD_FILE="}
	s.exec(t, append(noFile, "RELAY_POSTGRES_DSN="+fmt.Sprintf("postgres://%s:%s@%s/%s?sslmode=disable",
		s.role, percentEncode(s.password), hostPort, db)), "check")
	kv := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable password='%s'", pc.Host, pc.Port, s.role, db,
		strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s.password))
	s.exec(t, append(noFile, "RELAY_POSTGRES_DSN="+kv), "status", "--json")
	s.exec(t, append(noFile, "RELAY_POSTGRES_PASSWORD="+s.password), "lag", "--json")

	// Wrong passwords (each holds the right one) and an unreachable host.
	wrong := s.password + "-wrong"
	wrongFile := writeFile(t, "wrong-password", wrong+"\n")
	for _, env := range [][]string{
		{"RELAY_POSTGRES_PASSWORD_FILE=" + wrongFile},
		{"RELAY_POSTGRES_DSN=postgres://" + s.role + "@127.0.0.1:1/" + db + "?connect_timeout=2"},
	} {
		for _, args := range [][]string{{"check"}, {"status", "--json"}, {"lag", "--json"}, {"retries", "list", "--json"}, {"checkpoint", "show", "--json"}, {"setup"}} {
			if code := s.exec(t, env, args...); code == 0 {
				t.Errorf("outbox-relay %s with %s: exit 0; want a failure", strings.Join(args, " "), env[0])
			}
		}
		s.runFor(t, env, 3*time.Second, false)
	}
	s.secrets = append(s.secrets, wrong)

	// The password unencoded in a URL: refused before any connection.
	raw := fmt.Sprintf("postgres://%s:%s@%s/%s", s.role, s.password, hostPort, db)
	if code := s.exec(t, append(noFile, "RELAY_POSTGRES_DSN="+raw), "check"); code != 2 && strings.ContainsAny(s.password, "@/?%") {
		t.Errorf("check with an unencoded password in the URL: exit %d; want 2", code)
	}

	// migrate debezium on a connector holding the password.
	props := writeFile(t, "connector.properties", "connector.class=io.debezium.connector.postgresql.PostgresConnector\n"+
		"plugin.name=pgoutput\ndatabase.hostname=127.0.0.1\ndatabase.user="+s.role+"\ndatabase.password="+s.password+
		"\ndatabase.dbname="+db+"\nslot.name="+s.slot+"\ntable.include.list=public."+s.table+"\ntopic.prefix=x\n"+
		"transforms=outbox\ntransforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n")
	s.exec(t, none, "migrate", "debezium", props)

	// A crash, with the configuration loaded.
	if code := s.crash(t); code != 2 {
		t.Errorf("run killed with SIGQUIT: exit %d; want 2, a Go crash", code)
	}
	if !strings.Contains(s.out.String(), "SIGQUIT: quit") || !strings.Contains(s.out.String(), "\ngoroutine ") {
		t.Errorf("no crash output seen (SIGQUIT and the goroutines' stacks)")
	}
}

// crash starts `outbox-relay run`, waits until it serves /healthz (the
// configuration loaded, the relay running), and kills it with SIGQUIT: the Go
// runtime prints every goroutine's stack, with its arguments' words, as an
// unrecovered panic does, and exits 2. It returns the exit code.
func (s *secretsRun) crash(t *testing.T) int {
	t.Helper()
	cmd, out, listen := s.startRun(t, nil)
	defer cmd.Process.Kill()
	fmt.Fprintf(&s.out, "$ curl /healthz\n%s\n", httpGet(t, "http://"+listen+"/healthz"))
	if err := cmd.Process.Signal(syscall.SIGQUIT); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	var err error
	select {
	case err = <-waited:
	case <-time.After(60 * time.Second):
		t.Fatalf("run did not exit within 60s of SIGQUIT")
	}
	fmt.Fprintf(&s.out, "$ outbox-relay run (killed with SIGQUIT)\n%s\n", out.String())
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	return 0
}

// assertClean fails if any form of a secret appears in the output once the
// names that contain it are taken out, or if those names do not appear.
func (s *secretsRun) assertClean(t *testing.T) {
	t.Helper()
	out := s.out.String()
	required := s.required
	if required == nil {
		required = s.names
	}
	for _, n := range required {
		if !strings.Contains(out, n) {
			t.Errorf("the output never shows the name %q intact", n)
		}
	}
	// Longest first: a name may contain another.
	rest := out
	for _, n := range longestFirst(s.names) {
		rest = strings.ReplaceAll(rest, n, "<name>")
	}
	for _, secret := range s.secrets {
		for _, form := range passwordForms(secret) {
			if i := strings.Index(rest, form); i >= 0 {
				t.Errorf("the output holds the password %q as %q: …%s…", secret, form, rest[max(0, i-200):min(len(rest), i+len(form)+50)])
			}
		}
	}
	for _, bad := range []string{redacted + ".", "user=" + redacted} {
		if strings.Contains(out, bad) {
			t.Errorf("the output holds %q: words were rewritten", bad)
		}
	}
	if t.Failed() {
		t.Logf("all output:\n%s", out)
	}
}

func longestFirst(names []string) []string {
	out := append([]string(nil), names...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if len(out[j]) > len(out[i]) {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func httpGet(t *testing.T, u string) string {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	for i := 0; ; i++ {
		resp, err := c.Get(u)
		if err != nil {
			if i < 20 {
				time.Sleep(250 * time.Millisecond)
				continue
			}
			return "GET " + u + ": " + err.Error()
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.Status + "\n" + string(b)
	}
}
