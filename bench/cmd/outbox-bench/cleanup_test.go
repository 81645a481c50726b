package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestDropAndLeftBehind runs the bench's clean-up as the dev servers' role (not
// a superuser): a database with an open session of our own and a logical slot
// is dropped, and leftBehind lists what exists before and nothing after.
func TestDropAndLeftBehind(t *testing.T) {
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	name := testenv.UniqueName(t, "outbox_bench_drop")
	db, err := createDatabase(ctx, pg.AdminDSN, "", name)
	if err != nil {
		t.Fatal(err)
	}
	topic := testenv.UniqueName(t, "outbox_bench_topic")
	k.CreateTopic(t, topic, 1)
	c := &created{}
	c.addDB(db.Name)
	c.addSlots(db.slots()...)
	c.addTopics(topic)

	session, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close(context.Background())
	if _, err := session.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", db.RelaySlot); err != nil {
		t.Fatal(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(k.Brokers...), Timeout: 10 * time.Second}

	left, err := c.leftBehind(ctx, pg.AdminDSN, client)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"database " + name, "slot " + db.RelaySlot, "topic " + topic}
	if len(left) != len(want) {
		t.Fatalf("leftBehind() = %q; want entries for %q", left, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(left[i], w) {
			t.Errorf("leftBehind()[%d] = %q; want it to start with %q", i, left[i], w)
		}
	}

	if err := db.drop(ctx); err != nil {
		t.Fatalf("drop() = %v; want the database dropped although a session of ours was connected", err)
	}
	if err := deleteTopics(ctx, client, []string{topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := session.Exec(ctx, "SELECT 1"); err == nil {
		t.Error("our session still works after drop(); want it terminated")
	}
	left, err = c.leftBehind(ctx, pg.AdminDSN, client)
	if err != nil || len(left) != 0 {
		t.Errorf("leftBehind() after drop = %q, %v; want nothing", left, err)
	}
	// Dropping again is a no-op, not an error: clean-up may run twice.
	if err := db.drop(ctx); err != nil {
		t.Errorf("second drop() = %v; want nil", err)
	}
}
