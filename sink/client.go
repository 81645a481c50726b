package sink

import (
	"fmt"

	"github.com/segmentio/kafka-go"
)

// Client returns a kafka-go client that connects as a Kafka of cfg would:
// its brokers, TLS, SASL and client id, each request bounded by WriteTimeout.
// It is for a reader beside the relay (the sink only writes): the caller
// closes it with Close. It neither dials nor starts goroutines.
func Client(cfg Config) (*ReadClient, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	mech, _ := cfg.mechanism()
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, fmt.Errorf("kafka config: %w", err)
	}
	t := &kafka.Transport{ClientID: cfg.ClientID, TLS: tc, SASL: mech, Dial: cfg.Dial}
	return &ReadClient{Client: &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: t, Timeout: cfg.WriteTimeout}, transport: t}, nil
}

// A ReadClient is a kafka-go client with the sink's connection settings.
type ReadClient struct {
	*kafka.Client
	transport *kafka.Transport
}

// Close closes the client's idle connections.
func (c *ReadClient) Close() { c.transport.CloseIdleConnections() }
