package main

import (
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// Each SASL mechanism kafka.sasl.mechanism offers, against the dev broker's SASL_SSL
// listener (SCRAM-SHA-512, SCRAM-SHA-256 and PLAIN, the same user): the relay
// delivers as User:relay, and a wrong password stops `run` at once naming the
// mechanism and the key to fix (docs/security.md#sasl-mechanisms).
func TestSecureRunSASLMechanisms(t *testing.T) {
	kc := testenv.KafkaSecure(t)
	pg := testenv.Postgres(t)
	for _, mech := range []string{"plain", "scram-sha-256", "scram-sha-512"} {
		t.Run(mech, func(t *testing.T) {
			n := newSecNames(t)
			topic := kc.TopicPrefix + n.agg
			kc.CreateTopic(t, topic, 1)
			env := func(password string) []string {
				e := append(n.env(pg.DSN), scramEnv(kc, password)...)
				return append(e, "RELAY_KAFKA_SASL_MECHANISM="+mech, "RELAY_TOPICS_TEMPLATE="+kc.TopicPrefix+"{aggregate_type}")
			}
			secSetup(t, env(kc.Password))

			err, _, stderr := secRun(t, env("wrong-password"), "run")
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("outbox-relay run with a wrong %s password: %v; want a non-zero exit; stderr:\n%s", mech, err, stderr)
			}
			for _, want := range []string{"kafka.sasl.password", strings.ToUpper(mech)} {
				if !strings.Contains(stderr, want) {
					t.Errorf("run with a wrong %s password: stderr does not say %q:\n%s", mech, want, stderr)
				}
			}

			r := startSecRelay(t, env(kc.Password), "run")
			secInsert(t, pg.DSN, [2]string{n.agg, "a-1"}, [2]string{n.agg, "a-2"})
			if keys := waitTopic(t, kc, r, topic, 2); len(keys) != 2 {
				t.Errorf("%s holds keys %v after a %s login; want a-1, a-2", topic, keys, mech)
			}
		})
	}
}
