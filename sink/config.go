package sink

import (
	"log/slog"
	"time"
)

// Config configures a Kafka sink. Zero values mean the documented defaults.
type Config struct {
	Brokers                []string
	ClientID               string        // default "outbox-relay"
	BatchSize              int           // max messages per produce call, default 10000
	BatchBytes             int64         // default 1048576; also the per-call byte cap
	BatchTimeout           time.Duration // default 2ms
	WriteTimeout           time.Duration // default 10s
	Compression            string        // none|gzip|snappy|lz4|zstd
	TLS                    TLSConfig
	SASL                   SASLConfig
	RetryMin               time.Duration // default 100ms: backoff for broker-wide failures
	RetryMax               time.Duration // default 5s
	AllowAutoTopicCreation bool
	Logger                 *slog.Logger
}

// TLSConfig enables TLS to the brokers.
type TLSConfig struct {
	Enabled            bool
	CAFile             string
	CertFile           string
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
