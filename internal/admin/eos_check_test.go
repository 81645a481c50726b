package admin

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

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
	acls := []kmsg.CreateACLsRequestCreation{
		// The principal may write the prefix already; reading is the resume's.
		{ResourceType: kmsg.ACLResourceTypeTopic, ResourceName: cpTopic, ResourcePatternType: kmsg.ACLResourcePatternTypeLiteral,
			Principal: principal, Host: "*", Operation: kmsg.ACLOperationRead, PermissionType: kmsg.ACLPermissionTypeAllow},
	}
	for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationWrite, kmsg.ACLOperationDescribe} {
		acls = append(acls, kmsg.CreateACLsRequestCreation{ResourceType: kmsg.ACLResourceTypeTransactionalId, ResourceName: sink.TransactionalID(allowed),
			ResourcePatternType: kmsg.ACLResourcePatternTypePrefixed, Principal: principal, Host: "*", Operation: op, PermissionType: kmsg.ACLPermissionTypeAllow})
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
func addACLs(t *testing.T, brokers []string, acls []kmsg.CreateACLsRequestCreation) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateACLsRequest()
	req.Creations = acls
	res, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("create ACLs: %v", err)
	}
	for _, r := range res.Results {
		if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
			t.Fatalf("create ACLs: %v: %v", err, r.ErrorMessage)
		}
	}
	t.Cleanup(func() {
		req := kmsg.NewPtrDeleteACLsRequest()
		for _, a := range acls {
			req.Filters = append(req.Filters, kmsg.DeleteACLsRequestFilter{ResourceType: a.ResourceType, ResourceName: &a.ResourceName,
				ResourcePatternType: a.ResourcePatternType, Principal: &a.Principal, Host: &a.Host,
				Operation: a.Operation, PermissionType: a.PermissionType})
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, err := req.RequestWith(ctx, cl)
		if err == nil {
			for _, r := range res.Results {
				if err = kerr.ErrorForCode(r.ErrorCode); err != nil {
					break
				}
			}
		}
		if err != nil {
			t.Errorf("delete ACLs: %v", err)
		}
	})
}
