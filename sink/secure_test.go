package sink_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// The dev broker's secure listeners (scripts/dev.sh): SASL_SSL with SCRAM-SHA-512
// and SSL with client certificates, under the StandardAuthorizer. The relay's
// principal may write only topics prefixed outbox.event. (the ACLs of docs/security.md).

func scramConfig(kc *testenv.KafkaSecureCluster, password string) kafkaclient.Config {
	return kafkaclient.Config{
		Brokers: kc.SASLBrokers,
		TLS:     kafkaclient.TLSConfig{Enabled: true, CAFile: kc.Files.CA},
		SASL:    kafkaclient.SASLConfig{Mechanism: "scram-sha-512", Username: kc.User, Password: password},
	}
}

func mtlsConfig(kc *testenv.KafkaSecureCluster, cert, key string) kafkaclient.Config {
	return kafkaclient.Config{
		Brokers: kc.MTLSBrokers,
		TLS:     kafkaclient.TLSConfig{Enabled: true, CAFile: kc.Files.CA, CertFile: cert, KeyFile: key},
	}
}

// allowedTopic is a fresh topic the relay's principal may write, created
// through the plain listener (the principal may not create topics).
func allowedTopic(t *testing.T, kc *testenv.KafkaSecureCluster) string {
	t.Helper()
	topic := kc.TopicPrefix + testenv.UniqueName(t, "sec")
	kc.CreateTopic(t, topic, 2)
	return topic
}

// writeAndRead writes n messages to topic with cfg and checks that the plain
// listener reads them back.
func writeAndRead(t *testing.T, kc *testenv.KafkaSecureCluster, cfg kafkaclient.Config, topic string, n int) {
	t.Helper()
	k := newSink(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.CheckAuth(ctx); err != nil {
		t.Fatalf("CheckAuth = %v; want nil", err)
	}
	if err := k.Write(ctx, msgs(topic, n, 3)); err != nil {
		t.Fatalf("Write = %v; want nil", err)
	}
	if got := kc.ReadAll(t, topic); len(got) != n {
		t.Fatalf("read %d messages from %s; want %d", len(got), topic, n)
	}
}

func TestSecureSCRAMOverTLS(t *testing.T) {
	kc := testenv.KafkaSecure(t)
	writeAndRead(t, kc, scramConfig(kc, kc.Password), allowedTopic(t, kc), 10)
}

func TestSecureMTLS(t *testing.T) {
	kc := testenv.KafkaSecure(t)
	writeAndRead(t, kc, mtlsConfig(kc, kc.Files.KafkaClientCert, kc.Files.KafkaClientKey), allowedTopic(t, kc), 10)
}

// Settings the broker refuses are an *AuthError naming the field to fix, found
// within seconds by CheckAuth: not an outage to wait out.
func TestSecureCheckAuthRefusals(t *testing.T) {
	kc := testenv.KafkaSecure(t)
	noCA := scramConfig(kc, kc.Password)
	noCA.TLS.CAFile = kc.Files.OtherCA
	wrongName := scramConfig(kc, kc.Password)
	wrongName.TLS.ServerName = "kafka.example.invalid"
	plainToTLS := kafkaclient.Config{Brokers: kc.SASLBrokers, SASL: kafkaclient.SASLConfig{Mechanism: "scram-sha-512", Username: kc.User, Password: kc.Password}}
	tests := []struct {
		name    string
		cfg     kafkaclient.Config
		key     string
		message string // in the error, in plain words
	}{
		{"wrong password", scramConfig(kc, "not-"+kc.Password), "SASL.Password", "refused the SASL SCRAM-SHA-512 login of user"},
		{"untrusted broker certificate", noCA, "TLS.CAFile", "not signed by a trusted CA"},
		{"wrong server name", wrongName, "TLS.ServerName", "does not name the host"},
		{"no client certificate on the mTLS listener", mtlsConfig(kc, "", ""), "TLS.CertFile", "requires a client certificate"},
		{"client certificate of another CA", mtlsConfig(kc, kc.Files.OtherClientCert, kc.Files.OtherClientKey), "TLS.CertFile", "does not accept the client certificate"},
		{"no TLS on a TLS listener", plainToTLS, "TLS.Enabled", "expects TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := newSink(t, tt.cfg)
			start := time.Now()
			err := k.CheckAuth(context.Background())
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("CheckAuth took %s; want a verdict within seconds", took)
			}
			var ae *kafkaclient.AuthError
			if !errors.As(err, &ae) {
				t.Fatalf("CheckAuth = %v; want an *AuthError naming %s", err, tt.key)
			}
			if ae.Field != tt.key || !strings.Contains(err.Error(), tt.key) || !strings.Contains(err.Error(), tt.message) {
				t.Errorf("CheckAuth = %q (field %s); want field %s and %q", err, ae.Field, tt.key, tt.message)
			}
			if strings.Contains(err.Error(), kc.Password) {
				t.Errorf("CheckAuth = %q shows the password", err)
			}
		})
	}
}

// A topic the principal may not write fails on its own, permanently, with
// "not authorized" in its reason; the other topic of the same Write is
// delivered, and Kafka is not taken for unavailable.
func TestSecureTopicNotAuthorized(t *testing.T) {
	kc := testenv.KafkaSecure(t)
	ok := allowedTopic(t, kc)
	forbidden := testenv.UniqueName(t, "forbidden")
	kc.CreateTopic(t, forbidden, 1)
	for _, tc := range []struct {
		name string
		cfg  kafkaclient.Config
	}{
		{"scram", scramConfig(kc, kc.Password)},
		{"mtls", mtlsConfig(kc, kc.Files.KafkaClientCert, kc.Files.KafkaClientKey)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.AllowAutoTopicCreation = true // the CLI's default
			k := newSink(t, cfg)
			in := append(msgs(forbidden, 3, 3), msgs(ok, 4, 2)...) // three keys: each fails on its own, none behind another
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			before := len(kc.ReadAll(t, ok))
			err := k.Write(ctx, in)
			var werr *sink.WriteError
			if !errors.As(err, &werr) || len(werr.Failures) != 3 {
				t.Fatalf("Write = %v; want a *WriteError with the 3 messages of %s", err, forbidden)
			}
			for _, f := range werr.Failures {
				if in[f.Index].Topic != forbidden {
					t.Errorf("failure %d is for topic %s; want only %s", f.Index, in[f.Index].Topic, forbidden)
				}
				if !f.Permanent || !errors.Is(f.Err, kerr.TopicAuthorizationFailed) {
					t.Errorf("failure %d: %v; want permanent, TopicAuthorizationFailed", f.Index, f.Err)
				}
				if !strings.Contains(f.Reason, "not authorized") {
					t.Errorf("Reason = %q; want it to say \"not authorized\"", f.Reason)
				}
			}
			if got := len(kc.ReadAll(t, ok)) - before; got != 4 {
				t.Errorf("%d new messages on %s; want 4", got, ok)
			}
			if since, cause := k.Outage(); !since.IsZero() {
				t.Errorf("Outage = %s, %v; want none: a refused topic is not a Kafka outage", since, cause)
			}
		})
	}
}
