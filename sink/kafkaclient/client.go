package kafkaclient

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// This file connects franz-go's client (kgo) as the sink connects: the
// same brokers, client id, TLS (and mTLS), SASL and dialer. Every kgo client
// of the relay is built from clientOpts, so that a setting reaches all of
// them or none.

// clientOpts returns the kgo options that connect as cfg says. cfg has been
// validated.
func (c *Config) clientOpts() ([]kgo.Opt, error) {
	opts := []kgo.Opt{kgo.SeedBrokers(c.Brokers...), kgo.ClientID(c.ClientID)}
	tc, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	switch {
	case c.Dial != nil && tc != nil:
		// kgo takes either a dialer or a TLS config: wrap the dialer.
		dial := c.Dial
		opts = append(opts, kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
			conn, err := dial(ctx, network, host)
			if err != nil {
				return nil, err
			}
			cfg := tc.Clone()
			if cfg.ServerName == "" {
				cfg.ServerName, _, _ = net.SplitHostPort(host)
			}
			tconn := tls.Client(conn, cfg)
			if err := tconn.HandshakeContext(ctx); err != nil {
				conn.Close()
				return nil, err
			}
			return tconn, nil
		}))
	case c.Dial != nil:
		opts = append(opts, kgo.Dialer(c.Dial))
	case tc != nil:
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	mech, err := c.saslMechanism()
	if err != nil {
		return nil, err
	}
	if mech != nil {
		opts = append(opts, kgo.SASL(mech))
	}
	return opts, nil
}

// saslMechanism is SASL as franz-go's mechanism, nil for none; Validate has
// checked the name and the username.
//
// This is where a mechanism plugs in: a name in SASLMechanisms and a case
// here returning its sasl.Mechanism. kgo calls the mechanism on every
// connection, so OAUTHBEARER and AWS_MSK_IAM (sasl.go) read their token or
// credentials there.
func (c *Config) saslMechanism() (sasl.Mechanism, error) {
	auth := scram.Auth{User: c.SASL.Username, Pass: c.SASL.Password}
	switch c.SASL.Mechanism {
	case "":
		return nil, nil
	case "plain":
		return plain.Auth{User: c.SASL.Username, Pass: c.SASL.Password}.AsMechanism(), nil
	case "scram-sha-256":
		return auth.AsSha256Mechanism(), nil
	case "scram-sha-512":
		return auth.AsSha512Mechanism(), nil
	case "oauthbearer", "aws_msk_iam":
		return c.tokenSASL(), nil
	}
	return nil, fmt.Errorf("SASL mechanism %q is not supported", c.SASL.Mechanism)
}

// New validates cfg and returns a kgo client that connects as cfg says,
// with opts added. It dials lazily.
func New(cfg *Config, opts ...kgo.Opt) (*kgo.Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	base, err := cfg.clientOpts()
	if err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	return cl, nil
}
