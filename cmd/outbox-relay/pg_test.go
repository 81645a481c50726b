package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// kafkaBrokers returns the test Kafka's bootstrap addresses, comma-separated
// as RELAY_KAFKA_BROKERS takes them.
func kafkaBrokers(t *testing.T) string {
	t.Helper()
	return strings.Join(testenv.Kafka(t).Brokers, ",")
}

// uniqueName returns a name unique on the test server: slot names are global
// to a server, and other tests may run against it at the same time.
func uniqueName(t *testing.T, prefix string) string {
	return testenv.UniqueName(t, prefix)
}
