package sink_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// committedValues returns the values a read_committed consumer reads from
// every partition of topic, partition by partition in offset order.
func committedValues(t *testing.T, brokers []string, topic string, partitions int) []string {
	t.Helper()
	c, err := kafkaadmin.NewReader(kafkaclient.Config{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out []string
	for p := range partitions {
		if _, err := c.ReadCommitted(ctx, topic, p, 0, func(r kafkaadmin.Record) error {
			out = append(out, string(r.Value))
			return nil
		}); err != nil {
			t.Fatalf("ReadCommitted(%s[%d]) = %v", topic, p, err)
		}
	}
	return out
}

// txnSink is a transactional sink on the plain listener, its id taken.
func txnSink(t *testing.T, brokers []string, id string) *sink.Kafka {
	t.Helper()
	k := newSink(t, kafkaclient.Config{Brokers: brokers, TransactionalID: id, TransactionTimeout: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.InitTransactions(ctx); err != nil {
		t.Fatalf("InitTransactions = %v; want nil", err)
	}
	return k
}

// A committed transaction's records are read by a read_committed consumer,
// an aborted one's never, and a transaction spans several Writes and topics.
func TestKafkaTransactionCommitAbort(t *testing.T) {
	kc := testenv.Kafka(t)
	a, b := testenv.UniqueName(t, "txa"), testenv.UniqueName(t, "txb")
	kc.CreateTopic(t, a, 3)
	kc.CreateTopic(t, b, 1)
	k := txnSink(t, kc.Brokers, testenv.UniqueName(t, "txid"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	write := func(topic string, vals ...string) {
		t.Helper()
		var ms []event.Event
		for _, v := range vals {
			ms = append(ms, event.Event{Topic: topic, Key: []byte(v), Value: []byte(v)})
		}
		if err := k.Write(ctx, ms); err != nil {
			t.Fatalf("Write(%q) = %v; want nil", vals, err)
		}
	}
	write(a, "c1", "c2")
	write(b, "c3")
	if err := k.Commit(ctx); err != nil {
		t.Fatalf("Commit = %v; want nil", err)
	}
	write(a, "x1", "x2")
	write(b, "x3")
	if err := k.Abort(ctx); err != nil {
		t.Fatalf("Abort = %v; want nil", err)
	}
	write(a, "c4")
	if err := k.Commit(ctx); err != nil {
		t.Fatalf("Commit = %v; want nil", err)
	}
	// A transaction left open is invisible.
	write(b, "open")

	got := append(committedValues(t, kc.Brokers, a, 3), committedValues(t, kc.Brokers, b, 1)...)
	slices.Sort(got)
	if want := []string{"c1", "c2", "c3", "c4"}; !slices.Equal(got, want) {
		t.Errorf("read_committed reads %q; want %q", got, want)
	}
	// kafka-go's reader is read_uncommitted, and hands out the markers too
	// (records without a value of ours): proof that the records are there.
	var all []string
	for _, m := range append(kc.ReadAll(t, a), kc.ReadAll(t, b)...) {
		if v := string(m.Value); v != "" && (v[0] == 'c' || v[0] == 'x' || v == "open") {
			all = append(all, v)
		}
	}
	if len(all) != 8 {
		t.Errorf("read_uncommitted reads %q; want 8 records, aborted and open ones included", all)
	}
}

// A second producer of the transactional id fences the first in Kafka: the
// first's open transaction is aborted, and its next Write or Commit fails
// with ErrFenced, never taking a new epoch that would fence the second.
func TestKafkaTransactionFenced(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "txf")
	kc.CreateTopic(t, topic, 2)
	id := testenv.UniqueName(t, "txid")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := txnSink(t, kc.Brokers, id)
	if err := old.Write(ctx, seqMsgs(topic, 0, 3)); err != nil {
		t.Fatalf("Write = %v; want nil", err)
	}
	newer := txnSink(t, kc.Brokers, id)
	if err := old.Commit(ctx); !errors.Is(err, sink.ErrFenced) {
		t.Errorf("Commit by the fenced producer = %v; want ErrFenced", err)
	}
	if err := old.Write(ctx, seqMsgs(topic, 100, 1)); !errors.Is(err, sink.ErrFenced) {
		t.Errorf("Write by the fenced producer = %v; want ErrFenced", err)
	}
	if err := newer.Write(ctx, seqMsgs(topic, 3, 2)); err != nil {
		t.Fatalf("Write by the newer producer = %v; want nil", err)
	}
	if err := newer.Commit(ctx); err != nil {
		t.Fatalf("Commit by the newer producer = %v; want nil", err)
	}
	got := committedValues(t, kc.Brokers, topic, 2)
	slices.Sort(got)
	if want := []string{"v3", "v4"}; !slices.Equal(got, want) {
		t.Errorf("read_committed reads %q; want only the newer producer's %q", got, want)
	}
}

// A transaction the coordinator aborts on its timeout fences the producer
// (the epoch is bumped): the next Write or Commit fails with an error that
// wraps ErrFenced and, as the transaction was open longer than its timeout,
// a *TxnTimeoutError with how long and which timeout, so that the caller can
// tell it from a newer producer. A transaction within its timeout carries
// none. MaxTransactionTimeout reads the broker's cap.
func TestKafkaTransactionTimedOut(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.UniqueName(t, "txto")
	kc.CreateTopic(t, topic, 1)
	k := newSink(t, kafkaclient.Config{Brokers: kc.Brokers, TransactionalID: testenv.UniqueName(t, "txid"), TransactionTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.InitTransactions(ctx); err != nil {
		t.Fatalf("InitTransactions = %v; want nil", err)
	}
	if max, err := k.MaxTransactionTimeout(ctx); err != nil || max < time.Minute {
		t.Errorf("MaxTransactionTimeout = %s, %v; want the broker's transaction.max.timeout.ms (15m by default)", max, err)
	}
	write := func(v string) error {
		return k.Write(ctx, []event.Event{{Topic: topic, Key: []byte(v), Value: []byte(v)}})
	}
	if err := write("in time"); err != nil {
		t.Fatalf("Write = %v; want nil", err)
	}
	if err := k.Commit(ctx); err != nil {
		t.Fatalf("Commit within the timeout = %v; want nil", err)
	}
	if err := write("too slow"); err != nil {
		t.Fatalf("Write = %v; want nil", err)
	}
	// The coordinator looks for expired transactions every
	// transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s).
	time.Sleep(12 * time.Second)
	err := write("after the abort")
	if err == nil {
		err = k.Commit(ctx)
	}
	var te *sink.TxnTimeoutError
	if !errors.Is(err, sink.ErrFenced) || !errors.As(err, &te) {
		t.Fatalf("Write/Commit after the timeout = %v; want an error wrapping sink.ErrFenced and a *sink.TxnTimeoutError", err)
	}
	if te.Timeout != time.Second || te.Open < 10*time.Second {
		t.Errorf("TxnTimeoutError = %+v; want Timeout 1s and Open >= 10s", te)
	}
	if got := committedValues(t, kc.Brokers, topic, 1); !slices.Equal(got, []string{"in time"}) {
		t.Errorf("read_committed reads %q; want [in time]", got)
	}
}
