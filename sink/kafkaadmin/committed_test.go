package kafkaadmin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// LastCommitted finds the latest committed value of a key behind other keys'
// records and past an aborted one, on real Kafka, written by a transactional
// kgo producer as the relay's exactly-once checkpoints are.
func TestLastCommitted(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "txc")
	kc.CreateTopic(t, topic, 1)
	cfg := kafkaclient.Config{Brokers: kc.Brokers}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	adm := kafkaadmin.New(cfg)
	defer adm.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, found, err := adm.LastCommitted(ctx, topic, []byte("slot")); err != nil || found {
		t.Fatalf("LastCommitted of an empty topic = %v, %v; want not found", found, err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers...), kgo.TransactionalID(testenv.UniqueName(t, "txid")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	put := func(commit bool, key string, vals ...string) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Key: []byte(key), Value: []byte(v)}).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	put(true, "slot", "1")
	put(true, "slot", "2")
	put(false, "slot", "3")
	// A tail of other keys longer than the first look back (256 records).
	others := make([]string, 600)
	for i := range others {
		others[i] = fmt.Sprint(i)
	}
	put(true, "other", others...)
	v, found, err := adm.LastCommitted(ctx, topic, []byte("slot"))
	if err != nil || !found || string(v) != "2" {
		t.Errorf("LastCommitted = %q, %v, %v; want \"2\" (the aborted \"3\" left out)", v, found, err)
	}
	v, found, err = adm.LastCommitted(ctx, topic, []byte("other"))
	if err != nil || !found || string(v) != "599" {
		t.Errorf("LastCommitted(other) = %q, %v, %v; want \"599\"", v, found, err)
	}
}
