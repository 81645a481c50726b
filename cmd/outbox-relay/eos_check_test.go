package main

import (
	"testing"

	"github.com/spf13/pflag"
)

// TestAdminConfigExactlyOnce: with delivery: exactly-once, check and setup
// get the checkpoint topic and the relay's transactional id (what check does
// with them: internal/admin's TestCheckTransactionsACLs).
func TestAdminConfigExactlyOnce(t *testing.T) {
	minimalEnv(t)
	t.Setenv("RELAY_POSTGRES_SLOT", "orders_slot")
	t.Setenv("RELAY_DELIVERY", "exactly-once")
	t.Setenv("RELAY_KAFKA_CHECKPOINT_TOPIC", "orders.checkpoints")
	c, err := loadConfig("", pflag.NewFlagSet("t", pflag.ContinueOnError))
	if err != nil {
		t.Fatalf("loadConfig: %v", err)
	}
	ac := (&env{cfg: c}).adminConfig()
	if !ac.ExactlyOnce || ac.CheckpointTopic != "orders.checkpoints" || ac.TransactionalID != "outbox-relay-orders_slot" {
		t.Errorf("adminConfig() = ExactlyOnce %v, CheckpointTopic %q, TransactionalID %q; want true, %q, %q",
			ac.ExactlyOnce, ac.CheckpointTopic, ac.TransactionalID, "orders.checkpoints", "outbox-relay-orders_slot")
	}
}
