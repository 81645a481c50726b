package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/sink/kafkaadmin"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// eosConfig is f's relay config with exactly-once delivery and a checkpoint
// topic of the test's own.
func (f *fixture) eosConfig(t testing.TB) relay.Config {
	t.Helper()
	cfg := f.config(t)
	cfg.Delivery = relay.DeliveryExactlyOnce
	cfg.CheckpointTopic = f.prefix + ".checkpoints"
	f.kafka.CreateTopic(t, cfg.CheckpointTopic, 1)
	return cfg
}

// readCommitted reads the test's topics as a read_committed consumer does.
func (f *fixture) readCommitted(t testing.TB) []delivered {
	t.Helper()
	c, err := kafkaadmin.NewReader(kafkaclient.Config{Brokers: f.kafka.Brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []delivered
	for _, at := range aggregateTypes {
		for p := range 4 {
			if _, err := c.ReadCommitted(ctx, f.prefix+"."+at, p, 0, func(r kafkaadmin.Record) error {
				d := delivered{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Key: string(r.Key),
					Value: string(r.Value), Headers: map[string]string{}}
				for _, h := range r.Headers {
					d.Headers[h.Key] = string(h.Value)
				}
				out = append(out, d)
				return nil
			}); err != nil {
				t.Fatalf("read %s[%d]: %v", at, p, err)
			}
		}
	}
	return out
}

// waitCommitted reads the topics read_committed until at least n events are
// there.
func (f *fixture) waitCommitted(t testing.TB, n int, timeout time.Duration) []delivered {
	t.Helper()
	return waitRead(t, f.readCommitted, n, timeout)
}

// waitCommittedWhole waits 90s for every outbox row to be read_committed
// and requires them in order and as written; it returns what it read.
func (f *fixture) waitCommittedWhole(t *testing.T) []delivered {
	t.Helper()
	var got []delivered
	waitFor(t, 90*time.Second, "every outbox row read_committed", func() (bool, string) {
		got = f.readCommitted(t)
		rep := f.check(t, got)
		return rep.lost == 0, rep.firstProblem
	})
	if rep := f.check(t, got); rep.lost != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("read_committed: lost %d, order violations %d, mismatches %d: %s", rep.lost, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	return got
}

// TestExactlyOnce streams transactions of 1 to 1000 events with exactly-once
// delivery: a read_committed consumer reads each event once, in commit order
// per aggregate, and the slot is confirmed to the last transaction.
func TestExactlyOnce(t *testing.T) {
	f := newFixture(t)
	cfg := f.eosConfig(t)
	cfg.TransactionMaxEvents = 300 // a 1000-event transaction spans chunks
	run := f.start(t, cfg)
	total := 0
	for _, n := range []int{1, 1, 50, 1000, 7, 1} {
		f.insertTx(t, f.makeEvents(n))
		total += n
	}
	for range 50 {
		f.insertTx(t, f.makeEvents(3))
		total += 3
	}
	f.waitCommitted(t, total, 2*time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	run.stop(t)
	got := f.readCommitted(t)
	if rep := f.check(t, got); len(got) != total || rep != (report{}) {
		t.Fatalf("read_committed reads %d events; want %d exactly once: lost %d, duplicates %d, order violations %d, mismatches %d; first: %s",
			len(got), total, rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
}

// TestExactlyOnceKafkaAheadOfPostgres is the crash between the two
// checkpoints: Kafka committed the events with their checkpoint, and the
// Postgres checkpoint was never saved (the slot never confirmed). The next
// run resumes from the Postgres checkpoint, so it reads them again, and must
// not send them again: the Kafka checkpoint says they are delivered.
func TestExactlyOnceKafkaAheadOfPostgres(t *testing.T) {
	f := newFixture(t)
	cfg := f.eosConfig(t)
	// Saves of a position refused, takeovers allowed: the Postgres
	// checkpoint stays behind while Kafka commits.
	f.pg.Exec(t, `CREATE FUNCTION refuse_save() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.lsn IS DISTINCT FROM OLD.lsn THEN RAISE EXCEPTION 'checkpoint saves refused by the test'; END IF;
			RETURN NEW;
		END$$`)
	f.pg.Exec(t, `CREATE TRIGGER refuse_save BEFORE UPDATE ON outbox_relay_checkpoint FOR EACH ROW EXECUTE FUNCTION refuse_save()`)
	first := cfg
	first.ShutdownTimeout = 2 * time.Second
	run := f.start(t, first)
	for range 20 {
		f.insertTx(t, f.makeEvents(10))
	}
	f.waitCommitted(t, 200, time.Minute)
	if cp, first := f.checkpointLSN(t), f.commitEnds(t)[0]; cp >= first {
		t.Fatalf("Postgres checkpoint = %s; want it before the first transaction's end %s while the trigger refuses saves", cp, first)
	}
	run.cancel() // its drain cannot save either: it times out
	<-run.done
	run.done <- nil
	f.pg.Exec(t, `DROP TRIGGER refuse_save ON outbox_relay_checkpoint`)

	for range 5 {
		f.insertTx(t, f.makeEvents(10))
	}
	run = f.start(t, cfg)
	f.waitCommitted(t, 250, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	run.stop(t)
	got := f.readCommitted(t)
	if rep := f.check(t, got); len(got) != 250 || rep != (report{}) {
		t.Fatalf("read_committed reads %d events; want 250 exactly once: lost %d, duplicates %d, order violations %d, mismatches %d; first: %s",
			len(got), rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
}
