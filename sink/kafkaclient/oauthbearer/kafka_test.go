package oauthbearer_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient/oauthbearer"
)

// client is a plain kgo client on the OAUTHBEARER listener with the token of src.
func client(t *testing.T, kc *testenv.KafkaOAuthCluster, src *oauthbearer.Source, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	ca, err := os.ReadFile(kc.Files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatalf("no certificate in %s", kc.Files.CA)
	}
	opts = append([]kgo.Opt{
		kgo.SeedBrokers(kc.OAuthBrokers...),
		kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}),
		kgo.SASL(src.Mechanism()),
		kgo.RequestRetries(2),
		kgo.RetryTimeout(10 * time.Second),
	}, opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

func fileSource(t *testing.T, token string) (*oauthbearer.Source, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := oauthbearer.New(oauthbearer.Config{File: path})
	if err != nil {
		t.Fatal(err)
	}
	return src, path
}

// The relay's principal, authenticated by a token from a file, produces to its
// topic through the OAUTHBEARER listener (real Kafka, SASL_SSL); a client whose
// token names the super user reads the records back through the same listener. The
// token's sub is the principal: the relay's token may not read the topic (the
// relay's ACLs allow WRITE and DESCRIBE only), and a file rotated between
// connections is what the next connection presents.
func TestKafkaOAuthProduceConsume(t *testing.T) {
	kc := testenv.KafkaOAuth(t)
	topic := kc.TopicPrefix + testenv.UniqueName(t, "oauth")
	kc.CreateTopic(t, topic, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	relayToken := testenv.UnsecuredJWT(kc.User, time.Now().Add(time.Hour))
	src, path := fileSource(t, relayToken)
	producer := client(t, kc, src, kgo.DefaultProduceTopic(topic))
	const n = 10
	for i := 0; i < n; i++ {
		if err := producer.ProduceSync(ctx, kgo.StringRecord(fmt.Sprintf("event-%d", i))).FirstErr(); err != nil {
			t.Fatalf("produce %d as %s with an OAUTHBEARER token: %v", i, kc.User, err)
		}
	}

	// A fresh token in the same file: a new client (a new connection) presents it.
	rotated := testenv.UnsecuredJWT(kc.User, time.Now().Add(2*time.Hour))
	if err := os.WriteFile(path, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := src.Token(ctx); err != nil || got != rotated {
		t.Fatalf("Token after rotation = %q, %v; want the rotated token", got, err)
	}
	again := client(t, kc, src, kgo.DefaultProduceTopic(topic))
	if err := again.ProduceSync(ctx, kgo.StringRecord("after-rotation")).FirstErr(); err != nil {
		t.Fatalf("produce with the rotated token: %v", err)
	}

	superSrc, err := oauthbearer.New(oauthbearer.Config{Command: "echo " + testenv.UnsecuredJWT(kc.SuperUser, time.Now().Add(time.Hour))})
	if err != nil {
		t.Fatal(err)
	}
	consumer := client(t, kc, superSrc, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	for len(got) < n+1 && ctx.Err() == nil {
		fetches := consumer.PollFetches(ctx)
		if errs := fetches.Errors(); len(errs) > 0 && ctx.Err() == nil {
			t.Fatalf("consume as %s: %v", kc.SuperUser, errs[0].Err)
		}
		fetches.EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != n+1 || got[0] != "event-0" || got[n] != "after-rotation" {
		t.Fatalf("read %d records through the OAUTHBEARER listener: %q; want event-0..event-9 and after-rotation", len(got), got)
	}

	// The relay's token may write but not read: the broker took sub as the principal.
	reader := client(t, kc, src, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var readErr error
	for readErr == nil && ctx.Err() == nil {
		fetches := reader.PollFetches(ctx)
		for _, fe := range fetches.Errors() {
			readErr = fe.Err
		}
		if fetches.NumRecords() > 0 {
			t.Fatalf("%s read %d records; its ACLs allow no READ", kc.User, fetches.NumRecords())
		}
	}
	if !errors.Is(readErr, kerr.TopicAuthorizationFailed) {
		t.Fatalf("consume as %s = %v; want TOPIC_AUTHORIZATION_FAILED", kc.User, readErr)
	}
}

// A bad token fails the connection with an error that says what is wrong: an
// expired one is refused before it is sent, naming the file and the expiry; one
// the broker cannot validate is refused by the broker, as a SASL authentication
// refusal that carries the broker's reason (its RFC 7628 status).
func TestKafkaOAuthBadToken(t *testing.T) {
	kc := testenv.KafkaOAuth(t)
	// Ping: one request on a new connection, whose error is the authentication's
	// (a produce would retry it until its deadline).
	connect := func(src *oauthbearer.Source) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return client(t, kc, src).Ping(ctx)
	}

	t.Run("expired", func(t *testing.T) {
		src, path := fileSource(t, testenv.UnsecuredJWT(kc.User, time.Now().Add(-time.Minute)))
		err := connect(src)
		if !errors.Is(err, oauthbearer.ErrExpired) || !strings.Contains(err.Error(), path) {
			t.Fatalf("connect with an expired token = %v; want ErrExpired naming %s", err, path)
		}
	})

	t.Run("refused by the broker", func(t *testing.T) {
		// Signed (HS256), which the unsecured validator does not accept: like a
		// token of another identity provider than the one the broker trusts.
		token := testenv.UnsecuredJWT(kc.User, time.Now().Add(time.Hour))
		parts := strings.SplitN(token, ".", 3)
		parts[0] = "eyJhbGciOiJIUzI1NiJ9" // {"alg":"HS256"}
		parts[2] = "c2lnbmF0dXJl"
		src, _ := fileSource(t, strings.Join(parts, "."))
		err := connect(src)
		if !errors.Is(err, oauthbearer.ErrRefused) || !strings.Contains(err.Error(), "status invalid_token") ||
			!strings.Contains(err.Error(), kc.OAuthBrokers[0]) {
			t.Fatalf("connect with a token the broker does not accept = %v; want ErrRefused with the broker's status invalid_token and its address", err)
		}
		t.Logf("the broker's refusal: %v", err)
	})
}
