package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// With delivery: exactly-once, check takes a transactional id of its own under
// the relay's prefix and writes the checkpoint topic in an aborted
// transaction, as User:relay over SASL_SSL: ok with the TransactionalId ACLs,
// FAIL with the kafka-acls command that fixes it without them.
func TestCheckTransactionsACLs(t *testing.T) {
	pg := testenv.Postgres(t)
	kc := testenv.KafkaSecure(t)
	allowed, refused := newSecNames(t), newSecNames(t)
	cpTopic := kc.TopicPrefix + testenv.UniqueName(t, "checkpoints")
	kc.CreateTopic(t, cpTopic, 1)
	principal := "User:" + kc.User
	acls := []kafka.ACLEntry{
		// The principal may write the prefix already; reading is the resume's.
		{ResourceType: kafka.ResourceTypeTopic, ResourceName: cpTopic, ResourcePatternType: kafka.PatternTypeLiteral,
			Principal: principal, Host: "*", Operation: kafka.ACLOperationTypeRead, PermissionType: kafka.ACLPermissionTypeAllow},
	}
	for _, op := range []kafka.ACLOperationType{kafka.ACLOperationTypeWrite, kafka.ACLOperationTypeDescribe} {
		acls = append(acls, kafka.ACLEntry{ResourceType: kafka.ResourceTypeTransactionalID, ResourceName: relay.TransactionalID(allowed.slot),
			ResourcePatternType: kafka.PatternTypePrefixed, Principal: principal, Host: "*", Operation: op, PermissionType: kafka.ACLPermissionTypeAllow})
	}
	addACLs(t, kc.Brokers, acls)

	for _, tt := range []struct {
		names secNames
		want  string
	}{
		{allowed, "ok    kafka transactions: the relay may take transactional ids like " + relay.TransactionalID(allowed.slot) + "-check and write " + cpTopic},
		{refused, "FAIL  kafka transactions: "},
	} {
		env := append(tt.names.env(pg.DSN), "RELAY_DELIVERY=exactly-once", "RELAY_KAFKA_CHECKPOINT_TOPIC="+cpTopic)
		// Tables, publication and slot, through the plain listener.
		if err, out, errOut := secRun(t, append(env, "RELAY_KAFKA_BROKERS="+strings.Join(kc.Brokers, ",")), "setup", "--create-outbox-table"); err != nil {
			t.Fatalf("setup: %v\n%s%s", err, out, errOut)
		}
		_, out, errOut := secRun(t, append(env, scramEnv(kc, kc.Password)...), "check")
		wantLines(t, "check", out, tt.want)
		if tt.names == refused {
			wantLines(t, "check", out, "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
				"fix: kafka-acls.sh --add --allow-principal "+principal+" --operation Write --operation Describe --transactional-id outbox-relay- --resource-pattern-type prefixed")
		}
		if t.Failed() {
			t.Logf("check stderr:\n%s", errOut)
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
