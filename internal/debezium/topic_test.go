package debezium

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// produce writes records to topic on real Kafka with franz-go, each to the
// partition it names, and waits for them.
func produce(t *testing.T, brokers []string, topic string, recs ...*kgo.Record) {
	t.Helper()
	for _, r := range recs {
		r.Topic = topic
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// read returns what ReadTopic hands to fn, one "partition?key=value" string
// per record; <nil> marks a null key or value.
func read(t *testing.T, brokers []string, topic string, during func()) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var got []string
	err := readTopic(ctx, kafkaclient.Config{Brokers: brokers}, topic, func(key, value []byte) error {
		got = append(got, show(key)+"="+show(value))
		if during != nil {
			during()
			during = nil
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ReadTopic(%q): %v", topic, err)
	}
	return got
}

func show(b []byte) string {
	if b == nil {
		return "<nil>"
	}
	return string(b)
}

func rec(partition int32, key, value []byte) *kgo.Record {
	return &kgo.Record{Partition: partition, Key: key, Value: value}
}

// Every partition from its start to its end as of the call, in offset order,
// partition after partition; null keys and values (tombstones) stay nil, empty
// ones empty; a partition with no records is fine; a record produced while
// ReadTopic runs is not read.
func TestReadTopic(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "read")
	kc.CreateTopic(t, topic, 3)
	produce(t, kc.Brokers, topic,
		rec(0, []byte(`["c",{"server":"a"}]`), []byte(`{"lsn":1}`)),
		rec(2, []byte("k2"), []byte("v2")),
		rec(0, []byte(`["c",{"server":"b"}]`), []byte(`{"lsn":2}`)),
		rec(0, []byte(`["c",{"server":"a"}]`), nil), // tombstone
		rec(2, nil, []byte("no key")),
		rec(0, []byte("empty"), []byte{}),
		rec(0, []byte(`["c",{"server":"a"}]`), []byte(`{"lsn":3}`)),
	)
	// Partition 1 stays empty.
	late := func() { produce(t, kc.Brokers, topic, rec(2, []byte("late"), []byte("not read"))) }
	got := read(t, kc.Brokers, topic, late)
	want := []string{
		`["c",{"server":"a"}]={"lsn":1}`,
		`["c",{"server":"b"}]={"lsn":2}`,
		`["c",{"server":"a"}]=<nil>`,
		`empty=`,
		`["c",{"server":"a"}]={"lsn":3}`,
		`k2=v2`,
		`<nil>=no key`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ReadTopic read\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// The late record is there for the next call.
	if again := read(t, kc.Brokers, topic, nil); len(again) != len(want)+1 || again[len(again)-1] != "late=not read" {
		t.Errorf("second ReadTopic read %q; want the first read and late=not read", again)
	}
}

// Records of an aborted transaction are skipped, as a read_committed consumer
// skips them: Kafka Connect with exactly-once source support writes its
// offsets in transactions. Committed transactions and plain records are read,
// transaction markers are not.
func TestReadTopicTransactions(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "readtxn")
	kc.CreateTopic(t, topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.Brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(topic), kgo.TransactionTimeout(30*time.Second))
	if err != nil {
		t.Fatalf("kgo.NewClient: %v", err)
	}
	defer cl.Close()
	txn := func(commit bool, recs ...*kgo.Record) {
		t.Helper()
		for _, r := range recs {
			r.Topic = topic
		}
		if err := cl.BeginTransaction(); err != nil {
			t.Fatalf("BeginTransaction: %v", err)
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatalf("produce in transaction: %v", err)
		}
		end := kgo.TryAbort
		if commit {
			end = kgo.TryCommit
		}
		if err := cl.EndTransaction(ctx, end); err != nil {
			t.Fatalf("EndTransaction(%v): %v", commit, err)
		}
	}
	txn(true, rec(0, []byte("a"), []byte("committed 1")), rec(1, []byte("b"), []byte("committed 1")))
	txn(false, rec(0, []byte("a"), []byte("aborted")), rec(0, []byte("a"), []byte("aborted too")), rec(1, []byte("b"), []byte("aborted")))
	produce(t, kc.Brokers, topic, rec(0, []byte("plain"), []byte("not in a transaction")))
	txn(true, rec(0, []byte("a"), []byte("committed 2")))
	txn(false, rec(1, []byte("b"), []byte("aborted at the end")))
	// A transaction still open: its records are past the last stable
	// offset, neither read nor waited for.
	open := rec(0, []byte("a"), []byte("open"))
	open.Topic = topic
	if err := cl.BeginTransaction(); err != nil {
		t.Fatalf("BeginTransaction: %v", err)
	}
	if err := cl.ProduceSync(ctx, open).FirstErr(); err != nil {
		t.Fatalf("produce in transaction: %v", err)
	}
	defer cl.EndTransaction(context.Background(), kgo.TryAbort)

	got := read(t, kc.Brokers, topic, nil)
	want := []string{
		"a=committed 1",
		"plain=not in a transaction",
		"a=committed 2",
		"b=committed 1",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("ReadTopic read\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

func TestReadTopicErrors(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "readerr")
	kc.CreateTopic(t, topic, 1)
	produce(t, kc.Brokers, topic, rec(0, []byte("k"), []byte("v1")), rec(0, []byte("k"), []byte("v2")))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	stop := errors.New("stop here")
	calls := 0
	err := readTopic(ctx, kafkaclient.Config{Brokers: kc.Brokers}, topic, func(key, value []byte) error {
		calls++
		return stop
	})
	if err != stop || calls != 1 {
		t.Errorf("ReadTopic with a failing fn = %v after %d calls; want fn's error itself after 1", err, calls)
	}

	missing := testenv.UniqueName(t, "nosuch")
	err = readTopic(ctx, kafkaclient.Config{Brokers: kc.Brokers}, missing, func(key, value []byte) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("ReadTopic(missing topic) = %v; want an error saying it does not exist", err)
	}

	err = readTopic(ctx, kafkaclient.Config{}, topic, func(key, value []byte) error { return nil })
	var fe *field.Error
	if !errors.As(err, &fe) || fe.Field != "Brokers" || !errors.Is(err, field.ErrRequired) {
		t.Errorf("ReadTopic(no brokers) = %v; want the config error naming the field Brokers, required", err)
	}
}

// A topic read once, with more records than one fetch returns.
func TestReadTopicMany(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "readmany")
	kc.CreateTopic(t, topic, 1)
	var recs []*kgo.Record
	for i := range 3000 {
		recs = append(recs, rec(0, []byte(fmt.Sprintf("k%04d", i)), []byte(strings.Repeat("x", 8000))))
	}
	produce(t, kc.Brokers, topic, recs...)
	got := read(t, kc.Brokers, topic, nil)
	if len(got) != 3000 {
		t.Fatalf("ReadTopic read %d records; want 3000", len(got))
	}
	for i, g := range got {
		if want := fmt.Sprintf("k%04d=", i); !strings.HasPrefix(g, want) {
			t.Fatalf("record %d is %.20q; want key k%04d (offset order)", i, g, i)
		}
	}
}
