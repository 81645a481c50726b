package kafkaadmin_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// An unreachable Kafka is an outage, which Write waits for, not a refusal:
// CheckAuth lets the relay start.
func TestCheckAuthUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	cfg := kafkaclient.Config{Brokers: []string{addr},
		SASL: kafkaclient.SASLConfig{Mechanism: "scram-sha-512", Username: "u", Password: "p"}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	k := kafkaadmin.New(cfg)
	defer k.Close()
	start := time.Now()
	if err := k.CheckAuth(context.Background()); err != nil {
		t.Errorf("CheckAuth(%s, nothing listening) = %v; want nil", addr, err)
	}
	if took := time.Since(start); took > 6*time.Second {
		t.Errorf("CheckAuth took %s; want at most its 5s bound", took)
	}
}
