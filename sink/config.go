package sink

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// Config configures a Kafka sink. Zero values mean the documented defaults.
type Config struct {
	Brokers      []string      // host:port of one or more bootstrap brokers; required
	ClientID     string        // default "outbox-relay"
	BatchSize    int           // max messages per produce call, default 10000; 1 to 1000000
	BatchBytes   int64         // default 1048576 (Kafka's default message.max.bytes); also the per-call byte cap and the largest message sent; 65536 to 2147483647
	BatchTimeout time.Duration // accepted for compatibility; unused since Write produces each call at once (produce.go)
	WriteTimeout time.Duration // default 10s: one produce request
	Compression  string        // none (default), gzip, snappy, lz4 or zstd; idempotent either way
	// DisableIdempotence turns the idempotent producer off (idempotence.go):
	// batches carry no producer id, and a produce whose acknowledgement was
	// lost, written again, is stored twice (after the events that followed
	// it). Default false: idempotent, which needs Kafka 0.11 or later and,
	// before Kafka 3.0, the IdempotentWrite permission on the cluster.
	DisableIdempotence bool
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
	// up meanwhile beyond that wait. The zero value is false; the CLI
	// defaults to true (defaultAllowAutoTopicCreation in cmd/outbox-relay,
	// which says why).
	AllowAutoTopicCreation bool
	// TopicWait bounds how long one Write waits for a topic that Kafka does
	// not know yet but may be creating (auto-creation on, or a topic just
	// created whose leaders do not serve it yet). Default 5s.
	TopicWait time.Duration
	Logger    *slog.Logger // default discards
	// Dial, when set, opens every connection to a broker in place of a
	// net.Dialer (kafka.Transport.Dial): for networks that need their own
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
// "scram-sha-256" or "scram-sha-512".
type SASLConfig struct {
	Mechanism string
	Username  string
	Password  string
}

// Bounds of BatchSize and BatchBytes; see validate.
const (
	maxBatchSize  = 1_000_000
	minBatchBytes = 64 << 10
)

// maxAttempts is kafka-go's own attempts per batch. Kept low: Write's loop does
// the real retrying, with backoff, until the context is done.
const maxAttempts = 3

// Defaults of Config's zero values, exported for the CLI's key table.
const (
	DefaultClientID     = "outbox-relay"
	DefaultBatchSize    = 10000
	DefaultBatchBytes   = 1 << 20
	DefaultBatchTimeout = 2 * time.Millisecond
	DefaultWriteTimeout = 10 * time.Second
	DefaultCompression  = "none"
)

// validate fills defaults and rejects bad values with a message saying how to
// fix them.
func (c *Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("no brokers: set kafka.brokers to host:port of at least one broker")
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("broker %q is not host:port: %w", b, err)
		}
	}
	if c.ClientID == "" {
		c.ClientID = DefaultClientID
	}
	if c.BatchTimeout < 0 || c.WriteTimeout < 0 || c.RetryMin < 0 || c.RetryMax < 0 || c.TopicWait < 0 {
		return errors.New("negative timeout or retry backoff: use 0 for the default")
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	// BatchSize bounds one produce call and the Writer's per-partition
	// buffers. Above a million a call never fills by count anyway (BatchBytes
	// stops it first: even empty messages take 22 bytes), so a larger value
	// is a typo, not a tuning.
	if c.BatchSize < 1 || c.BatchSize > maxBatchSize {
		return fmt.Errorf("kafka.batch_size is %d; use a number of messages per produce call from 1 to %d (default 10000)", c.BatchSize, maxBatchSize)
	}
	// BatchBytes is also the largest message the relay sends: anything larger
	// fails as too large and goes to the retry table dead. Below 64 KiB
	// ordinary events would (kafka.batch_bytes: 1 made every event dead).
	// Kafka sizes are int32: a produce request cannot be larger.
	if c.BatchBytes < minBatchBytes || c.BatchBytes > math.MaxInt32 {
		return fmt.Errorf("kafka.batch_bytes is %d; use %d (64 KiB) to %d bytes, at most the topics' max.message.bytes (default 1048576): it is also the largest event the relay sends", c.BatchBytes, minBatchBytes, int64(math.MaxInt32))
	}
	if c.TransactionalID != "" && c.DisableIdempotence {
		return errors.New("a transactional id needs the idempotent producer: enable idempotence, or leave the transactional id empty")
	}
	if c.TransactionTimeout < 0 {
		return errors.New("negative transaction timeout: use 0 for the default")
	}
	if c.TransactionTimeout == 0 {
		c.TransactionTimeout = DefaultTransactionTimeout
	}
	if c.TopicWait == 0 {
		c.TopicWait = defaultTopicWait
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = DefaultBatchTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.RetryMin == 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.RetryMin > c.RetryMax {
		return fmt.Errorf("retry min %s is above retry max %s: lower the min or raise the max", c.RetryMin, c.RetryMax)
	}
	if _, err := c.compression(); err != nil {
		return err
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return errors.New("tls cert file and key file go together: set both or neither")
	}
	if _, err := c.mechanism(); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func (c *Config) compression() (kafka.Compression, error) {
	switch strings.ToLower(c.Compression) {
	case "", "none":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	}
	return 0, fmt.Errorf("unknown compression %q: use none, gzip, snappy, lz4 or zstd", c.Compression)
}

func (c *Config) mechanism() (sasl.Mechanism, error) {
	m := strings.ToLower(c.SASL.Mechanism)
	if m == "" {
		return nil, nil
	}
	if c.SASL.Username == "" {
		return nil, fmt.Errorf("sasl mechanism %s needs a username", m)
	}
	switch m {
	case "plain":
		return plain.Mechanism{Username: c.SASL.Username, Password: c.SASL.Password}, nil
	case "scram-sha-256":
		mech, err := scram.Mechanism(scram.SHA256, c.SASL.Username, c.SASL.Password)
		if err != nil {
			return nil, fmt.Errorf("sasl scram-sha-256: %w", err)
		}
		return mech, nil
	case "scram-sha-512":
		mech, err := scram.Mechanism(scram.SHA512, c.SASL.Username, c.SASL.Password)
		if err != nil {
			return nil, fmt.Errorf("sasl scram-sha-512: %w", err)
		}
		return mech, nil
	}
	return nil, fmt.Errorf("unknown sasl mechanism %q: use plain, scram-sha-256 or scram-sha-512", c.SASL.Mechanism)
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
			return nil, fmt.Errorf("read tls ca file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls ca file %q holds no PEM certificate", c.TLS.CAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLS.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLS.CertFile, c.TLS.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load tls client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
