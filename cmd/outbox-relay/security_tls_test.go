package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The relay against the dev servers' secure endpoints (scripts/dev.sh, issue 14):
// Postgres over TLS with sslmode=verify-full and client-certificate login (also for
// replication), Kafka over SASL_SSL with SCRAM-SHA-512 and over mTLS, under ACLs
// that let the relay's principal write only outbox.event.* topics.

// secRelay is an `outbox-relay` process started with env only (no RELAY_* of the
// test's own environment), its output collected.
type secRelay struct {
	cmd            *exec.Cmd
	stdout, stderr *testenv.Output
	done           chan error
}

// secEnv is the process environment: PATH and HOME, then env (KEY=value).
func secEnv(env ...string) []string {
	return append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "RELAY_METRICS_LISTEN="}, env...)
}

func startSecRelay(t *testing.T, env []string, args ...string) *secRelay {
	t.Helper()
	r := &secRelay{stdout: &testenv.Output{}, stderr: &testenv.Output{}, done: make(chan error, 1)}
	r.cmd = exec.Command(testenv.RelayBinary(t), args...)
	r.cmd.Env = secEnv(env...)
	r.cmd.Stdout, r.cmd.Stderr = r.stdout, r.stderr
	if err := r.cmd.Start(); err != nil {
		t.Fatalf("start outbox-relay %v: %v", args, err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

// wait waits up to d for the process to exit and returns its error, failing the
// test when it is still running.
func (r *secRelay) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err // for Cleanup
		return err
	case <-time.After(d):
		t.Fatalf("outbox-relay still running after %s; stderr:\n%s", d, r.stderr.String())
		return nil
	}
}

// stop sends SIGTERM and expects a clean exit.
func (r *secRelay) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(syscall.SIGTERM)
	if err := r.wait(t, time.Minute); err != nil {
		t.Errorf("outbox-relay run after SIGTERM: %v; stderr:\n%s", err, r.stderr.String())
	}
}

// secRun runs the command to its end (within a minute).
func secRun(t *testing.T, env []string, args ...string) (err error, stdout, stderr string) {
	t.Helper()
	r := startSecRelay(t, env, args...)
	err = r.wait(t, time.Minute)
	return err, r.stdout.String(), r.stderr.String()
}

func secExec(t *testing.T, dsn, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// secNames are a test's slot, publication and aggregate types.
type secNames struct{ slot, pub, agg, forbiddenAgg string }

func newSecNames(t *testing.T) secNames {
	return secNames{
		slot: testenv.UniqueName(t, "slot"), pub: testenv.UniqueName(t, "pub"),
		agg: testenv.UniqueName(t, "agg"), forbiddenAgg: testenv.UniqueName(t, "forbidden"),
	}
}

func (n secNames) env(dsn string) []string {
	return []string{"RELAY_POSTGRES_DSN=" + dsn, "RELAY_POSTGRES_SLOT=" + n.slot, "RELAY_POSTGRES_PUBLICATION=" + n.pub}
}

func secSetup(t *testing.T, env []string) {
	t.Helper()
	if err, out, errOut := secRun(t, env, "setup", "--create-outbox-table"); err != nil {
		t.Fatalf("outbox-relay setup: %v\n%s%s", err, out, errOut)
	}
}

func secInsert(t *testing.T, dsn string, events ...[2]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("BEGIN;")
	for _, e := range events {
		b.WriteString(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
VALUES (gen_random_uuid(), '` + e[0] + `', '` + e[1] + `', 'Created', '{"n": 1}');`)
	}
	b.WriteString("COMMIT;")
	secExec(t, dsn, b.String())
}

// waitTopic waits until topic holds n messages and returns their keys.
func waitTopic(t *testing.T, kc *testenv.KafkaSecureCluster, r *secRelay, topic string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		msgs := kc.ReadAll(t, topic)
		if len(msgs) >= n {
			var keys []string
			for _, m := range msgs {
				keys = append(keys, string(m.Key))
			}
			return keys
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages after 45s; want %d; relay stderr:\n%s", topic, len(msgs), n, r.stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestSecurePostgresVerifyFull(t *testing.T) {
	pg := testenv.PostgresTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, pg.TLSDSN)
	if err != nil {
		t.Fatalf("connect with sslmode=verify-full and a client certificate: %v", err)
	}
	defer conn.Close(context.Background())
	var ssl bool
	var user string
	if err := conn.QueryRow(ctx, `SELECT s.ssl, current_user FROM pg_stat_ssl s WHERE s.pid = pg_backend_pid()`).Scan(&ssl, &user); err != nil {
		t.Fatal(err)
	}
	if !ssl || user != pg.PGUser {
		t.Errorf("pg_stat_ssl.ssl, current_user = %t, %q; want true, %q", ssl, user, pg.PGUser)
	}

	// The replication protocol logs in the same way (hostssl replication ... cert).
	rc, err := pgconn.Connect(ctx, pg.TLSDSN+" replication=database")
	if err != nil {
		t.Fatalf("replication connection with a client certificate: %v", err)
	}
	defer rc.Close(context.Background())
	if _, err := rc.Exec(ctx, "IDENTIFY_SYSTEM").ReadAll(); err != nil {
		t.Errorf("IDENTIFY_SYSTEM over TLS: %v", err)
	}
	if _, ok := rc.Conn().(interface{ ConnectionState() tls.ConnectionState }); !ok {
		t.Errorf("replication connection is %T; want a TLS connection", rc.Conn())
	}
}

// The whole relay over TLS on both sides: Postgres as relay_cert with its client
// certificate (the pool and the replication connection), Kafka as User:relay over
// SASL_SSL. An event routed to a topic the principal may not write goes to the
// retry table dead, saying "not authorized"; the stream goes on.
func TestSecureRunSCRAM(t *testing.T) {
	pg := testenv.PostgresTLS(t)
	kc := testenv.KafkaSecure(t)
	n := newSecNames(t)
	topic := kc.TopicPrefix + n.agg
	kc.CreateTopic(t, topic, 2)
	forbidden := testenv.UniqueName(t, "forbidden") // outside the prefix
	kc.CreateTopic(t, forbidden, 1)

	env := append(append(n.env(pg.TLSDSN), scramEnv(kc, kc.Password)...),
		"RELAY_TOPICS_TEMPLATE="+kc.TopicPrefix+"{aggregate_type}",
		"RELAY_TOPICS_OVERRIDES="+n.forbiddenAgg+"="+forbidden,
	)
	secSetup(t, env)
	r := startSecRelay(t, env, "run")
	secInsert(t, pg.TLSDSN, [2]string{n.agg, "a-1"}, [2]string{n.forbiddenAgg, "f-1"}, [2]string{n.agg, "a-2"})
	secInsert(t, pg.TLSDSN, [2]string{n.agg, "a-3"})
	keys := waitTopic(t, kc, r, topic, 3)
	if len(keys) != 3 {
		t.Errorf("%s holds keys %v; want a-1, a-2, a-3", topic, keys)
	}

	// The refused event: dead at once, in plain words.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// As relay_cert, who made the tables (setup ran as it).
	conn, err := pgx.Connect(ctx, pg.TLSDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var status, lastErr, aggType string
	for deadline := time.Now().Add(20 * time.Second); ; {
		err = conn.QueryRow(ctx, `SELECT status, coalesce(last_error, ''), aggregate_type FROM outbox_relay_retry`).Scan(&status, &lastErr, &aggType)
		if err == nil && status == "dead" || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || status != "dead" || aggType != n.forbiddenAgg || !strings.Contains(lastErr, "not authorized") {
		t.Errorf("retry table row = %q, %q, last_error %q, %v; want dead, %q, \"not authorized\"; relay stderr:\n%s",
			status, aggType, lastErr, err, n.forbiddenAgg, r.stderr.String())
	}
	t.Logf("last_error: %s", lastErr)

	// Both of the relay's Postgres connections use TLS as relay_cert.
	var walsenderSSL, poolSSL bool
	var walsenderUser string
	if err := conn.QueryRow(ctx, `SELECT s.ssl, a.usename FROM pg_replication_slots rs
		JOIN pg_stat_ssl s ON s.pid = rs.active_pid JOIN pg_stat_activity a ON a.pid = rs.active_pid
		WHERE rs.slot_name = $1`, n.slot).Scan(&walsenderSSL, &walsenderUser); err != nil {
		var slots string
		conn.QueryRow(ctx, `SELECT string_agg(format('%s active=%s pid=%s', slot_name, active, active_pid), '; ') FROM pg_replication_slots`).Scan(&slots)
		t.Errorf("the slot's walsender: %v; slots: %s", err, slots)
	}
	if !walsenderSSL || walsenderUser != pg.PGUser {
		t.Errorf("replication connection: ssl %t, user %q; want true, %q", walsenderSSL, walsenderUser, pg.PGUser)
	}
	if err := conn.QueryRow(ctx, `SELECT coalesce(bool_and(s.ssl), false) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
		WHERE a.usename = $1 AND a.datname = current_database() AND a.backend_type = 'client backend'`, pg.PGUser).Scan(&poolSSL); err != nil || !poolSSL {
		t.Errorf("the relay's pool connections: all ssl = %t, %v; want true", poolSSL, err)
	}
	r.stop(t)
	if strings.Contains(r.stderr.String()+r.stdout.String(), kc.Password) {
		t.Errorf("the relay's output shows the SASL password")
	}
}

// mTLS: the relay's client certificate (CN=relay) is its principal on the SSL
// listener, with the same ACLs.
func TestSecureRunMTLS(t *testing.T) {
	pg := testenv.Postgres(t)
	kc := testenv.KafkaSecure(t)
	n := newSecNames(t)
	topic := kc.TopicPrefix + n.agg
	kc.CreateTopic(t, topic, 2)
	env := append(n.env(pg.DSN),
		"RELAY_KAFKA_BROKERS="+strings.Join(kc.MTLSBrokers, ","),
		"RELAY_KAFKA_TLS_ENABLED=true",
		"RELAY_KAFKA_TLS_CA_FILE="+kc.Files.CA,
		"RELAY_KAFKA_TLS_CERT_FILE="+kc.Files.KafkaClientCert,
		"RELAY_KAFKA_TLS_KEY_FILE="+kc.Files.KafkaClientKey,
		"RELAY_TOPICS_TEMPLATE="+kc.TopicPrefix+"{aggregate_type}",
	)
	secSetup(t, env)
	r := startSecRelay(t, env, "run")
	secInsert(t, pg.DSN, [2]string{n.agg, "a-1"}, [2]string{n.agg, "a-2"})
	waitTopic(t, kc, r, topic, 2)
	r.stop(t)
}

// Settings that can never work stop `run` at start, within seconds, with a plain
// error naming what to change, instead of retrying as if a server were down.
func TestSecureRunRefusedAtStart(t *testing.T) {
	pg := testenv.PostgresTLS(t)
	kc := testenv.KafkaSecure(t)
	n := newSecNames(t)
	good := pg.TLSDSN
	plainKafka := []string{"RELAY_KAFKA_BROKERS=" + strings.Join(kc.Brokers, ",")}
	secSetup(t, append(n.env(good), plainKafka...))
	sasl := func(password string) []string { return scramEnv(kc, password) }
	tests := []struct {
		name  string
		env   []string
		wants []string // in stderr
	}{
		{"wrong SASL password", append(n.env(good), sasl("wrong-password")...),
			[]string{"kafka.sasl.password", "refused the SASL SCRAM-SHA-512 login"}},
		{"Postgres certificate from an unknown CA", append(n.env(good+" sslrootcert="+pg.Files.OtherCA), plainKafka...),
			[]string{"certificate is not trusted", "unknown authority", "sslrootcert"}},
		{"host name not in the Postgres certificate", append(n.env(good+" host=localhost"), plainKafka...),
			[]string{"does not name the host", "localhost"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			err, _, stderr := secRun(t, tt.env, "run")
			took := time.Since(start)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("outbox-relay run: %v; want a non-zero exit; stderr:\n%s", err, stderr)
			}
			if took > 20*time.Second {
				t.Errorf("outbox-relay run exited after %s; want within seconds", took)
			}
			for _, want := range tt.wants {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not say %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, "wrong-password") {
				t.Errorf("stderr shows the password:\n%s", stderr)
			}
		})
	}
}

// scramEnv is the environment of a relay that reaches Kafka as kc's User with
// password over SASL_SSL (SCRAM-SHA-512).
func scramEnv(kc *testenv.KafkaSecureCluster, password string) []string {
	return []string{
		"RELAY_KAFKA_BROKERS=" + strings.Join(kc.SASLBrokers, ","),
		"RELAY_KAFKA_TLS_ENABLED=true",
		"RELAY_KAFKA_TLS_CA_FILE=" + kc.Files.CA,
		"RELAY_KAFKA_SASL_MECHANISM=scram-sha-512",
		"RELAY_KAFKA_SASL_USERNAME=" + kc.User,
		"RELAY_KAFKA_SASL_PASSWORD=" + password,
	}
}
