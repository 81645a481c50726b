package admin

import (
	"context"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// testDB is a fresh database on the test server (testenv.Postgres) and a
// Config of the relay's defaults on it with a slot of its own: what the CLI
// builds from a configuration that names only postgres.dsn, since slot names
// are global to a server and other tests may run against it at once.
func testDB(t *testing.T) (*testenv.PG, Config) {
	t.Helper()
	pg := testenv.Postgres(t)
	return pg, defaultConfig(t, pg.DSN, testenv.UniqueName(t, "relay_admin"))
}

// defaultConfig is Config with every name at the relay's default (the
// defaults of the CLI's settings), the relay layout's columns and headers.
func defaultConfig(t *testing.T, dsn, slot string) Config {
	t.Helper()
	table := func(name string) sql.Table {
		tb, err := sql.ParseTable(name)
		if err != nil {
			t.Fatalf("ParseTable(%q): %v", name, err)
		}
		return tb
	}
	cols, err := sql.LayoutRelay.Columns()
	if err != nil {
		t.Fatalf("LayoutRelay.Columns(): %v", err)
	}
	return Config{
		DSN:             dsn,
		Slot:            slot,
		Publication:     sql.DefaultPublication,
		OutboxTable:     table(sql.DefaultOutboxTable),
		Layout:          sql.LayoutRelay,
		Columns:         cols,
		Router:          router.Config{Columns: cols, Headers: sql.LayoutRelay.Headers()},
		CheckpointTable: table(sql.DefaultCheckpointTable),
		RetryTable:      table(sql.DefaultRetryTable),
		RedactedDSN:     dsn,
	}
}

// withKafka sets cfg's brokers to the test Kafka's and returns a sink.Kafka
// on them, as the CLI passes Check one; closed when the test ends.
func withKafka(t *testing.T, cfg *Config) *sink.Kafka {
	t.Helper()
	return kafkaAt(t, cfg, testenv.Kafka(t).Brokers...)
}

// kafkaAt is withKafka on the given brokers (an unreachable address, say).
func kafkaAt(t *testing.T, cfg *Config, brokers ...string) *sink.Kafka {
	t.Helper()
	cfg.Kafka.Brokers = brokers
	k, err := sink.New(cfg.Kafka)
	if err != nil {
		t.Fatalf("sink.New: %v", err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

// runCheck runs Check and returns how many checks failed and what it wrote.
func runCheck(t *testing.T, cfg Config, k Kafka) (failed int, out string) {
	t.Helper()
	var b strings.Builder
	failed = Check(context.Background(), cfg, k, &b)
	return failed, b.String()
}
