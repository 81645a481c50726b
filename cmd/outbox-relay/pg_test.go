package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// newDatabase returns the DSN of a fresh, empty database that is dropped (with
// any replication slot in it) when the test ends. The one place that knows
// where the test server is: switch it to internal/testenv once that lands.
func newDatabase(t *testing.T) string {
	t.Helper()
	admin := os.Getenv("RELAY_TEST_POSTGRES_DSN")
	if admin == "" {
		t.Fatal("RELAY_TEST_POSTGRES_DSN is not set; point it at a superuser DSN of a PostgreSQL with wal_level=logical")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to test server: %v", err)
	}
	defer conn.Close(ctx)
	b := make([]byte, 6)
	rand.Read(b)
	name := "relay_cmd_test_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("connect to drop database: %v", err)
			return
		}
		defer conn.Close(ctx)
		// Inactive slots retain WAL forever: drop them before the database.
		if _, err := conn.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1`, name); err != nil {
			t.Errorf("drop slots: %v", err)
		}
		if _, err := conn.Exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database: %v", err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("RELAY_TEST_POSTGRES_DSN must be a URL: %v", err)
	}
	u.Path = "/" + name
	return u.String()
}

// kafkaBrokers returns the test Kafka's bootstrap address.
func kafkaBrokers(t *testing.T) string {
	t.Helper()
	b := os.Getenv("RELAY_TEST_KAFKA_BROKERS")
	if b == "" {
		t.Fatal("RELAY_TEST_KAFKA_BROKERS is not set; point it at a Kafka broker, host:port")
	}
	return b
}

// uniqueName returns a name unique on the test server: slot names are global
// to a server, and other tests may run against it at the same time.
func uniqueName(prefix string) string {
	b := make([]byte, 6)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
