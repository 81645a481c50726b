package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// The relay binary on the dev broker's OAUTHBEARER listener (SASL_SSL, unsecured
// JWTs), its token in kafka.sasl.oauth_token_file: `check` passes, `run` delivers
// every event, each checked by its id. Then the file holds an expired token:
// `check` and `run` say that the token expired and which key to change; and a
// token the broker does not accept: `check` says the broker refused it.
func TestSecureRunOAuthBearer(t *testing.T) {
	kc := testenv.KafkaOAuth(t)
	pg := testenv.Postgres(t)
	n := newSecNames(t)
	topic := kc.TopicPrefix + n.agg
	kc.CreateTopic(t, topic, 1)
	tokenFile := filepath.Join(t.TempDir(), "token")
	writeFile := func(token string) {
		t.Helper()
		if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeToken := func(exp time.Time) { writeFile(testenv.UnsecuredJWT(kc.User, exp)) }
	writeToken(time.Now().Add(time.Hour))
	env := append(n.env(pg.DSN),
		"RELAY_KAFKA_BROKERS="+strings.Join(kc.OAuthBrokers, ","),
		"RELAY_KAFKA_TLS_ENABLED=true",
		"RELAY_KAFKA_TLS_CA_FILE="+kc.Files.CA,
		"RELAY_KAFKA_SASL_MECHANISM=oauthbearer",
		"RELAY_KAFKA_SASL_OAUTH_TOKEN_FILE="+tokenFile,
		"RELAY_TOPICS_TEMPLATE="+kc.TopicPrefix+"{aggregate_type}")
	secSetup(t, env)

	if err, out, stderr := secRun(t, env, "check"); err != nil || !strings.Contains(out, "ok    kafka: ") || !strings.Contains(out, "ok    kafka idempotence: ") {
		t.Fatalf("outbox-relay check with a valid OAUTHBEARER token: %v; want exit 0 with kafka and kafka idempotence ok\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}

	r := startSecRelay(t, env, "run")
	var ids []string
	for tx := 0; tx < 4; tx++ {
		var b strings.Builder
		b.WriteString("BEGIN;")
		for i := 0; i < 5; i++ {
			id := fmt.Sprintf("00000000-0000-4000-8000-%012d", tx*5+i+1)
			ids = append(ids, id)
			fmt.Fprintf(&b, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ('%s', '%s', 'a-%d', 'Created', '{"n": %d}');`, id, n.agg, i, i)
		}
		b.WriteString("COMMIT;")
		secExec(t, pg.DSN, b.String())
	}
	waitDelivered(t, kc.KafkaCluster, topic, ids, "OAUTHBEARER run")
	if got := eventIDs(t, kc.KafkaCluster, topic); len(got) != len(ids) {
		t.Errorf("%s holds %d distinct ids; want the %d inserted: %v", topic, len(got), len(ids), got)
	}
	r.stop(t)

	// The token in the file has expired: what the relay reads for the next
	// connection (nothing rewrote it in time).
	writeToken(time.Now().Add(-time.Minute))
	wants := []string{"kafka.sasl.oauth_token_file", "OAUTHBEARER token has expired", "token expired at"}
	err, out, stderr := secRun(t, env, "check")
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("outbox-relay check with an expired token: %v; want a non-zero exit\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	for _, want := range append(wants, "FAIL  kafka: refused") {
		if !strings.Contains(out, want) {
			t.Errorf("outbox-relay check with an expired token does not say %q:\n%s%s", want, out, stderr)
		}
	}
	start := time.Now()
	err, _, stderr = secRun(t, env, "run")
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("outbox-relay run with an expired token: %v; want a non-zero exit; stderr:\n%s", err, stderr)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("outbox-relay run with an expired token exited after %s; want within seconds", took)
	}
	for _, want := range wants {
		if !strings.Contains(stderr, want) {
			t.Errorf("outbox-relay run with an expired token: stderr does not say %q:\n%s", want, stderr)
		}
	}

	// Signed (HS256), which the broker's unsecured validator refuses: like a
	// token of an identity provider the broker does not trust.
	parts := strings.SplitN(testenv.UnsecuredJWT(kc.User, time.Now().Add(time.Hour)), ".", 3)
	writeFile("eyJhbGciOiJIUzI1NiJ9." + parts[1] + ".c2lnbmF0dXJl") // {"alg":"HS256"}
	err, out, stderr = secRun(t, env, "check")
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Errorf("outbox-relay check with a token the broker refuses: %v; want a non-zero exit\nstdout:\n%s\nstderr:\n%s", err, out, stderr)
	}
	for _, want := range []string{"FAIL  kafka: refused", "kafka.sasl.oauth_token_file", "the broker refused the SASL OAUTHBEARER token", "status invalid_token"} {
		if !strings.Contains(out, want) {
			t.Errorf("outbox-relay check with a token the broker refuses does not say %q:\n%s%s", want, out, stderr)
		}
	}
}
