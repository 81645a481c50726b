// Package kafkaclient holds the relay's Kafka settings and builds the
// franz-go clients (kgo) they describe: brokers, client id, TLS and mTLS,
// SASL (PLAIN, SCRAM, OAUTHBEARER from package oauthbearer, AWS_MSK_IAM
// from package awsmsk) and the dialer. The sink's producer, the admin
// questions of package kafkaadmin and its read_committed reader all
// connect through New, so that a setting reaches all of them or none.
//
// Invariants enforced here:
//
//   - A Config that cannot work fails Validate, at start-up, with a
//     *field.Error naming the field and the fix; nothing is dialled.
//   - A broker's refusal of these settings (Refused) is an *AuthError
//     naming the field to change, never an outage to wait out.
package kafkaclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient/oauthbearer"
)

// Config configures the relay's Kafka clients, the sink's producer among
// them. Zero values mean the documented defaults; Validate fills them in
// and names the field of each value that cannot work (a *field.Error).
type Config struct {
	Brokers      []string      // host:port of one or more bootstrap brokers; required
	ClientID     string        // default "outbox-relay"
	BatchSize    int           // max messages per produce call, default 10000; 1 to 1000000
	BatchBytes   int64         // default 1048576 (Kafka's default message.max.bytes); also the per-call byte cap and the largest message sent; 65536 to 2147483647
	WriteTimeout time.Duration // default 10s: one produce request
	Compression  string        // none (default), gzip, snappy, lz4 or zstd; idempotent either way
	// DisableIdempotence turns the idempotent producer off:
	// batches carry no producer id, and a produce whose acknowledgement was
	// lost, written again, is stored twice (after the events that followed
	// it). Default false: idempotent, which needs Kafka 0.11 or later and,
	// before Kafka 3.0, the IdempotentWrite permission on the cluster.
	DisableIdempotence bool
	// MaxInFlight bounds the Sends a caller keeps ahead of its Waits (the
	// relay's writer), default 5, the Java producer's
	// max.in.flight.requests.per.connection; 1 is stop-and-wait. The
	// producer itself writes one round at a time (franz.go), kgo keeping up
	// to five produce requests of a round in flight per broker with
	// idempotence, one without (a resent request could land after a later
	// one).
	MaxInFlight int
	// TransactionalID, when set, makes the sink transactional (txn.go):
	// Write writes into a Kafka transaction that Commit or Abort ends, after
	// InitTransactions took the id. Needs idempotence. Default "": no
	// transactions.
	TransactionalID string
	// TransactionTimeout is how long the coordinator lets a transaction stay
	// open before it aborts it (transaction.timeout.ms), at most the
	// broker's transaction.max.timeout.ms. Default 1m.
	TransactionTimeout time.Duration
	TLS                TLSConfig
	SASL               SASLConfig
	RetryMin           time.Duration // default 100ms: first backoff after a broker-wide failure
	RetryMax           time.Duration // default 5s: longest backoff; each wait is jittered
	// AllowAutoTopicCreation lets the client ask the broker to create a missing
	// topic (the broker also needs auto.create.topics.enable). Default false,
	// unlike Debezium's Java producer: a topic auto-created with the broker's
	// defaults (often one partition) silently loses the partitioning consumers
	// expect, so a missing topic is reported instead, as a non-permanent
	// Failure naming the topic, for the operator to create it. With it on, an
	// unknown topic is waited for up to TopicWait (the broker is creating it),
	// then its messages fail like a missing topic's; other topics are not held
	// up meanwhile beyond that wait. The zero value is false; the relay's
	// command line defaults to true (and says why).
	AllowAutoTopicCreation bool
	// TopicWait bounds how long one Write waits for a topic that Kafka does
	// not know yet but may be creating (auto-creation on, or a topic just
	// created whose leaders do not serve it yet). Default 5s.
	TopicWait time.Duration
	Logger    *slog.Logger // default discards
	// Dial, when set, opens every connection to a broker in place of a
	// net.Dialer (kgo.Dialer): for networks that need their own
	// dialer, and for fault tests that put a proxy between the sink and
	// every broker (the brokers' advertised addresses bypass a proxy).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// TLSConfig enables TLS to the brokers.
type TLSConfig struct {
	Enabled            bool
	CAFile             string // PEM; default the system's roots
	CertFile           string // PEM client certificate, with KeyFile
	KeyFile            string
	InsecureSkipVerify bool
	ServerName         string
}

// SASLConfig enables SASL authentication. Mechanism is "", "plain",
// "scram-sha-256", "scram-sha-512" (with Username and Password),
// "oauthbearer" (with one of OAuthTokenFile and OAuthTokenCommand) or
// "aws_msk_iam" (AWS credentials from the environment: package awsmsk).
type SASLConfig struct {
	Mechanism string
	Username  string
	Password  string
	// OAuthTokenFile holds the OAUTHBEARER token, read again for every
	// connection (package oauthbearer).
	OAuthTokenFile string
	// OAuthTokenCommand prints the OAUTHBEARER token; run again shortly
	// before the token expires (package oauthbearer).
	OAuthTokenCommand string

	tokens   *oauthbearer.Source // made by Validate from tokensOf
	tokensOf oauthbearer.Config
}

// Bounds of BatchSize and BatchBytes; see Validate.
const (
	maxBatchSize  = 1_000_000
	minBatchBytes = 64 << 10
)

// Defaults of Config's zero values. DefaultTopicWait: a topic
// auto-created by the broker was seen to take about 300ms to answer
// metadata; 5s leaves room for a busy controller.
const (
	DefaultClientID     = "outbox-relay"
	DefaultBatchSize    = 10000
	DefaultBatchBytes   = 1 << 20
	DefaultWriteTimeout = 10 * time.Second
	DefaultCompression  = "none"
	DefaultTopicWait    = 5 * time.Second
	DefaultMaxInFlight  = 5
)

// DefaultTransactionTimeout is Config.TransactionTimeout's default, as the
// Java producer's transaction.timeout.ms.
const DefaultTransactionTimeout = time.Minute

// Compressions and SASLMechanisms are the values Compression and
// SASL.Mechanism take (lower case; Validate folds them).
var (
	Compressions   = []string{"none", "gzip", "snappy", "lz4", "zstd"}
	SASLMechanisms = []string{"plain", "scram-sha-256", "scram-sha-512", "oauthbearer", "aws_msk_iam"}
)

// Validate fills defaults and returns every value that cannot work, each a
// *field.Error naming its field and the fix. It reads the TLS files (local
// files only; nothing is dialled). New and ReadTopic call it.
func (c *Config) Validate() error {
	var v field.Checker
	if len(c.Brokers) == 0 {
		v.Add(field.Required("Brokers", "give host:port of at least one broker"))
	}
	for _, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			v.Errorf("Brokers", "%q is not host:port; write it like kafka-1:9092", b)
		}
	}
	field.Default(&c.ClientID, DefaultClientID)
	field.Positive(&v, "BatchSize", &c.BatchSize, DefaultBatchSize)
	field.Positive(&v, "BatchBytes", &c.BatchBytes, DefaultBatchBytes)
	// BatchSize bounds one produce call and the Writer's per-partition
	// buffers. Above a million a call never fills by count anyway (BatchBytes
	// stops it first: even empty messages take 22 bytes), so a larger value
	// is a typo, not a tuning.
	if c.BatchSize > maxBatchSize {
		v.Errorf("BatchSize", "%d is out of range; use a number of messages per produce call from 1 to %d (default %d)", c.BatchSize, maxBatchSize, DefaultBatchSize)
	}
	// BatchBytes is also the largest message the relay sends: anything larger
	// fails as too large and goes to the retry table dead. Below 64 KiB
	// ordinary events would (a batch of 1 byte made every event dead).
	// Kafka sizes are int32: a produce request cannot be larger.
	if c.BatchBytes > 0 && (c.BatchBytes < minBatchBytes || c.BatchBytes > math.MaxInt32) {
		v.Errorf("BatchBytes", "%d is out of range; use %d (64 KiB) to %d bytes, at most the topics' max.message.bytes (default %d): it is also the largest event sent", c.BatchBytes, minBatchBytes, int64(math.MaxInt32), DefaultBatchBytes)
	}
	// A broker deduplicates the last five batches of a producer per
	// partition: more in flight could store a resent one twice.
	if field.Positive(&v, "MaxInFlight", &c.MaxInFlight, DefaultMaxInFlight); c.MaxInFlight > DefaultMaxInFlight {
		v.Errorf("MaxInFlight", "%d is out of range; use 1 (stop-and-wait) to %d (default)", c.MaxInFlight, DefaultMaxInFlight)
	}
	if c.TransactionalID != "" && c.DisableIdempotence {
		v.Errorf("TransactionalID", "needs the idempotent producer: enable it ({DisableIdempotence}), or leave the transactional id empty")
	}
	field.Positive(&v, "TransactionTimeout", &c.TransactionTimeout, DefaultTransactionTimeout)
	field.Positive(&v, "WriteTimeout", &c.WriteTimeout, DefaultWriteTimeout)
	field.Positive(&v, "TopicWait", &c.TopicWait, DefaultTopicWait)
	field.Positive(&v, "RetryMin", &c.RetryMin, 100*time.Millisecond)
	field.Positive(&v, "RetryMax", &c.RetryMax, 5*time.Second)
	if c.RetryMin > c.RetryMax {
		v.Errorf("RetryMax", "%s is below {RetryMin} %s: raise it", c.RetryMax, c.RetryMin)
	}
	c.Compression = strings.ToLower(c.Compression)
	field.OneOf(&v, "Compression", &c.Compression, DefaultCompression, Compressions...)
	c.validateTLS(&v)
	c.SASL.Mechanism = strings.ToLower(c.SASL.Mechanism)
	switch {
	case c.SASL.Mechanism == "":
		if c.SASL.Username != "" || c.SASL.Password != "" || c.SASL.OAuthTokenFile != "" || c.SASL.OAuthTokenCommand != "" {
			v.Errorf("SASL.Mechanism", "empty, but SASL credentials (a username, password or token) are set; set it to one of %s", strings.Join(SASLMechanisms, ", "))
		}
	case !slices.Contains(SASLMechanisms, c.SASL.Mechanism):
		v.Errorf("SASL.Mechanism", "%q is not one of %s", c.SASL.Mechanism, strings.Join(SASLMechanisms, ", "))
	case tokenMechanism(c.SASL.Mechanism):
		c.validateTokenSASL(&v)
	case c.SASL.OAuthTokenFile != "" || c.SASL.OAuthTokenCommand != "":
		v.Errorf("SASL.Mechanism", "%s takes a username and password, but an OAUTHBEARER token file or command is set: set it to oauthbearer, or unset {SASL.OAuthTokenFile} and {SASL.OAuthTokenCommand}", c.SASL.Mechanism)
	case c.SASL.Username == "":
		v.Add(field.Required("SASL.Username", "SASL "+c.SASL.Mechanism+" needs a username"))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return v.Err()
}

// validateTLS checks the TLS files: set only with TLS on, the client
// certificate and its key together, each readable, as tlsConfig reads them.
func (c *Config) validateTLS(v *field.Checker) {
	t := c.TLS
	files := []struct{ name, path string }{{"TLS.CAFile", t.CAFile}, {"TLS.CertFile", t.CertFile}, {"TLS.KeyFile", t.KeyFile}}
	readable := true
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if !t.Enabled {
			v.Errorf(f.name, "set, but {TLS.Enabled} is false; enable TLS or unset it")
			readable = false
		} else if _, err := os.ReadFile(f.path); err != nil {
			v.Errorf(f.name, "cannot read it: %v", err)
			readable = false
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		v.Errorf("TLS.CertFile", "{TLS.CertFile} and {TLS.KeyFile} go together; set both for a client certificate, or neither")
		readable = false
	}
	if readable {
		if _, err := c.tlsConfig(); err != nil {
			v.Add(err)
		}
	}
}

// tlsConfig reads the certificate files (local files only; nothing is dialed).
func (c *Config) tlsConfig() (*tls.Config, error) {
	if !c.TLS.Enabled {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: c.TLS.InsecureSkipVerify, //nolint:gosec // the operator's explicit choice
		ServerName:         c.TLS.ServerName,
	}
	if c.TLS.CAFile != "" {
		pem, err := os.ReadFile(c.TLS.CAFile)
		if err != nil {
			return nil, field.Errorf("TLS.CAFile", "cannot read it: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, field.Errorf("TLS.CAFile", "%q holds no PEM certificate", c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, field.Errorf("TLS.CertFile", "cannot load the client certificate and its key: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
