package admin

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// With delivery: exactly-once, check takes a transactional id of its own under
// the relay's prefix and writes the checkpoint topic in an aborted
// transaction, as User:relay over SASL_SSL: ok with the TransactionalId ACLs,
// FAIL with the kafka-acls command that fixes it without them.
func TestCheckTransactionsACLs(t *testing.T) {
	pg := testenv.Postgres(t)
	kc := testenv.KafkaSecure(t)
	allowed, refused := testenv.UniqueName(t, "slot"), testenv.UniqueName(t, "slot")
	cpTopic := kc.TopicPrefix + testenv.UniqueName(t, "checkpoints")
	kc.CreateTopic(t, cpTopic, 1)
	principal := "User:" + kc.User
	acls := []kafka.ACLEntry{
		// The principal may write the prefix already; reading is the resume's.
		{ResourceType: kafka.ResourceTypeTopic, ResourceName: cpTopic, ResourcePatternType: kafka.PatternTypeLiteral,
			Principal: principal, Host: "*", Operation: kafka.ACLOperationTypeRead, PermissionType: kafka.ACLPermissionTypeAllow},
	}
	for _, op := range []kafka.ACLOperationType{kafka.ACLOperationTypeWrite, kafka.ACLOperationTypeDescribe} {
		acls = append(acls, kafka.ACLEntry{ResourceType: kafka.ResourceTypeTransactionalID, ResourceName: sink.TransactionalID(allowed),
			ResourcePatternType: kafka.PatternTypePrefixed, Principal: principal, Host: "*", Operation: op, PermissionType: kafka.ACLPermissionTypeAllow})
	}
	addACLs(t, kc.Brokers, acls)

	for _, tt := range []struct {
		slot string
		want string
	}{
		{allowed, "ok    kafka transactions: the relay may take transactional ids like " + sink.TransactionalID(allowed) + "-check and write " + cpTopic},
		{refused, "FAIL  kafka transactions: "},
	} {
		cfg := defaultConfig(t, pg.DSN, tt.slot)
		cfg.Publication = testenv.UniqueName(t, "pub")
		cfg.ExactlyOnce, cfg.CheckpointTopic, cfg.TransactionalID = true, cpTopic, sink.TransactionalID(tt.slot)
		// Tables, publication and slot, through the plain listener.
		cfg.Topics = kafkaAt(t, &cfg, kc.Brokers...)
		mustSetup(t, cfg, true, "Setup")
		cfg.Kafka.TLS = kafkaclient.TLSConfig{Enabled: true, CAFile: kc.Files.CA}
		cfg.Kafka.SASL = kafkaclient.SASLConfig{Mechanism: "scram-sha-512", Username: kc.User, Password: kc.Password}
		_, out := runCheck(t, cfg, kafkaAt(t, &cfg, kc.SASLBrokers...))
		testenv.WantLines(t, "check", out, tt.want)
		if tt.slot == refused {
			testenv.WantLines(t, "check", out, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
				"fix: kafka-acls.sh --add --allow-principal "+principal+" --operation Write --operation Describe --transactional-id outbox-relay- --resource-pattern-type prefixed")
		}
	}
}

// addACLs creates acls through the plain listener (its principal is a super
// user) and deletes them when the test ends.
func addACLs(t *testing.T, brokers []string, acls []kafka.ACLEntry) {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.CreateACLs(ctx, &kafka.CreateACLsRequest{ACLs: acls})
	if err != nil {
		t.Fatalf("create ACLs: %v", err)
	}
	for _, err := range res.Errors {
		if err != nil {
			t.Fatalf("create ACLs: %v", err)
		}
	}
	t.Cleanup(func() {
		var filters []kafka.DeleteACLsFilter
		for _, a := range acls {
			filters = append(filters, kafka.DeleteACLsFilter{ResourceTypeFilter: a.ResourceType, ResourceNameFilter: a.ResourceName,
				ResourcePatternTypeFilter: a.ResourcePatternType, PrincipalFilter: a.Principal, HostFilter: a.Host,
				Operation: a.Operation, PermissionType: a.PermissionType})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.DeleteACLs(ctx, &kafka.DeleteACLsRequest{Filters: filters}); err != nil {
			t.Errorf("delete ACLs: %v", err)
		}
	})
}
