package compat_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// seqEvent is a committed event of the migration producer.
type seqEvent struct {
	id, aggType, aggID string
	seq                int
}

// producer inserts transactions of 1 to maxTxn events over a few aggregates,
// each event carrying its aggregate's sequence number, until stopped.
type producer struct {
	mu        sync.Mutex
	committed []seqEvent
	stop      chan struct{}
	done      chan struct{}
	count     atomic.Int64
}

const maxTxn = 3

func startProducer(t *testing.T, dsn string, aggTypes []string) *producer {
	t.Helper()
	p := &producer{stop: make(chan struct{}), done: make(chan struct{})}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]int{}
	go func() {
		defer close(p.done)
		defer conn.Close(context.Background())
		ctx := context.Background()
		for n := 0; ; n++ {
			select {
			case <-p.stop:
				return
			default:
			}
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Errorf("producer: %v", err)
				return
			}
			var evs []seqEvent
			for i := range n%maxTxn + 1 {
				aggType := aggTypes[(n+i)%len(aggTypes)]
				aggID := fmt.Sprintf("A-%d", (n*7+i)%5)
				k := aggType + "/" + aggID
				seqs[k]++
				e := seqEvent{id: fmt.Sprintf("00000000-0000-4000-9000-%012d", n*maxTxn+i), aggType: aggType, aggID: aggID, seq: seqs[k]}
				if _, err := tx.Exec(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1, $2, $3, 'Seq', $4::jsonb)`,
					e.id, e.aggType, e.aggID, fmt.Sprintf(`{"seq": %d}`, e.seq)); err != nil {
					t.Errorf("producer: %v", err)
					return
				}
				evs = append(evs, e)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Errorf("producer: %v", err)
				return
			}
			p.mu.Lock()
			p.committed = append(p.committed, evs...)
			p.mu.Unlock()
			p.count.Add(int64(len(evs)))
			time.Sleep(2 * time.Millisecond)
		}
	}()
	t.Cleanup(p.end)
	return p
}

func (p *producer) end() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// TestMigrateFromDebezium: Debezium, in a standalone Kafka Connect worker,
// delivers part of a stream and is stopped; `outbox-relay migrate debezium`
// turns its config into the relay's and takes over its slot from its offset
// file; the relay delivers the rest, to the same topics, while the
// application keeps writing. Nothing is lost, per-aggregate order holds, and
// the only duplicates are of the one transaction Debezium was in when it
// stopped.
func TestMigrateFromDebezium(t *testing.T) {
	testMigrateFromDebezium(t, false)
}

// TestMigrateFromDebeziumDistributed is TestMigrateFromDebezium with Debezium
// in a distributed Kafka Connect worker: the takeover reads its offsets topic
// (--offsets-topic) with the brokers migrate took from the worker's
// bootstrap.servers.
func TestMigrateFromDebeziumDistributed(t *testing.T) {
	testMigrateFromDebezium(t, true)
}

func testMigrateFromDebezium(t *testing.T, distributed bool) {
	began := time.Now()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	pg.Exec(t, outboxDDL)
	name := testenv.UniqueName(t, "m")
	aggTypes := []string{name + "_Order", name + "_Payment"}
	prefix := "mig." + name + "."
	var topics []string
	for _, a := range aggTypes {
		topics = append(topics, prefix+a)
		k.CreateTopic(t, prefix+a, partitions)
	}
	conn := debezium.Start(t, debezium.Options{DSN: pg.DSN, Distributed: distributed, Props: map[string]string{
		"transforms.outbox.route.topic.replacement": prefix + "${routedByValue}",
	}})

	p := startProducer(t, pg.DSN, aggTypes)
	// Let Debezium deliver part of the stream.
	deadline := time.Now().Add(60 * time.Second)
	for countMessages(t, k, topics) < 300 {
		if time.Now().After(deadline) {
			t.Fatalf("Debezium delivered %d events in 60s", countMessages(t, k, topics))
		}
		time.Sleep(200 * time.Millisecond)
	}
	conn.Stop(t) // the application goes on writing
	byDebezium := countMessages(t, k, topics)

	env := append(os.Environ(), "RELAY_POSTGRES_DSN="+pg.DSN, "RELAY_METRICS_LISTEN=")
	cfg, notes := migrateConfig(t, env, conn.ConnectorFile(), conn.WorkerFile())
	t.Logf("migrate debezium: stderr:\n%s", notes)
	for _, want := range []string{`layout: "debezium"`, `slot: "` + conn.Slot() + `"`, `publication: "` + conn.Publication() + `"`,
		`replacement: "` + prefix + `${routedByValue}"`, `brokers: "` + strings.Join(k.Brokers, ",") + `"`} {
		if !strings.Contains(cfg, want) {
			t.Errorf("migrate's config lacks %q:\n%s", want, cfg)
		}
	}
	cfgFile := filepath.Join(t.TempDir(), "relay.yaml")
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	offsets, from := []string{"--offsets", conn.OffsetFile()}, conn.OffsetFile()
	if distributed {
		offsets, from = []string{"--offsets-topic", conn.OffsetsTopic()}, "topic "+conn.OffsetsTopic()
	}
	out := runRelay(t, env, append([]string{"migrate", "debezium", conn.ConnectorFile(), "--worker", conn.WorkerFile(),
		"--takeover", "--config", cfgFile}, offsets...)...)
	t.Logf("takeover:\n%s", out)
	if !strings.Contains(out, "Debezium's offset (connector \"outbox\", "+from+"): ") {
		t.Errorf("takeover output does not name the offsets it read (%s):\n%s", from, out)
	}
	if !strings.Contains(out, "checkpoint of slot "+conn.Slot()+" set to ") {
		t.Errorf("takeover output does not say it set the checkpoint:\n%s", out)
	}

	relay := startRelay(t, env, "--config", cfgFile)
	time.Sleep(2 * time.Second) // the relay streams while the producer writes
	p.end()
	want := len(p.committed)
	deadline = time.Now().Add(90 * time.Second)
	for countDistinct(t, k, topics) < want && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
	}
	relay.stop(t)

	lost, dups, disorder := check(t, k, topics, p.committed)
	t.Logf("events committed %d; delivered by Debezium before the stop %d; lost %d; duplicates %d; order violations %d (%s)",
		want, byDebezium, lost, dups, disorder, time.Since(began).Round(time.Millisecond))
	if lost != 0 || disorder != 0 {
		t.Errorf("lost %d, order violations %d; want 0 and 0", lost, disorder)
	}
	if dups > maxTxn {
		t.Errorf("duplicates %d; want at most %d (the one transaction Debezium was in)", dups, maxTxn)
	}
}

// migrateConfig runs migrate debezium for the config only: the YAML on
// stdout, the notes on stderr; a gap (exit 1) fails the test.
func migrateConfig(t *testing.T, env []string, connector, worker string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(testenv.RelayBinary(t), "migrate", "debezium", connector, "--worker", worker)
	cmd.Env = env
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("outbox-relay migrate debezium: %v\nstdout:\n%s\nstderr:\n%s", err, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

func countMessages(t *testing.T, k *testenv.KafkaCluster, topics []string) int {
	n := 0
	for _, topic := range topics {
		n += len(k.ReadAll(t, topic))
	}
	return n
}

func countDistinct(t *testing.T, k *testenv.KafkaCluster, topics []string) int {
	seen := map[string]bool{}
	for _, topic := range topics {
		for _, m := range k.ReadAll(t, topic) {
			id, _ := headerValue(m.Headers, "id")
			seen[string(id)] = true
		}
	}
	return len(seen)
}

// check reads the topics and returns the committed events never delivered,
// the messages beyond one per event, and the messages whose aggregate
// sequence number is not the next one expected after dropping repeats of
// earlier ones (a repeat comes after what followed it, as with any
// at-least-once resend, and a consumer that skips seen ids sees commit
// order).
func check(t *testing.T, k *testenv.KafkaCluster, topics []string, committed []seqEvent) (lost, dups, disorder int) {
	t.Helper()
	byKey := map[string][]int{}
	seen := map[string]int{}
	for _, topic := range topics {
		msgs := k.ReadAll(t, topic)
		slices.SortStableFunc(msgs, func(a, b testenv.Message) int {
			if a.Partition != b.Partition {
				return a.Partition - b.Partition
			}
			return int(a.Offset - b.Offset)
		})
		for _, m := range msgs {
			id, _ := headerValue(m.Headers, "id")
			seen[string(id)]++
			var v struct{ Seq int }
			if err := json.Unmarshal(m.Value, &v); err != nil {
				t.Errorf("message %s: value %q: %v", id, m.Value, err)
				continue
			}
			kk := topic + "/" + string(m.Key)
			byKey[kk] = append(byKey[kk], v.Seq)
		}
	}
	for _, e := range committed {
		switch n := seen[e.id]; {
		case n == 0:
			lost++
			if lost <= 5 {
				t.Errorf("lost: event %s (%s/%s seq %d)", e.id, e.aggType, e.aggID, e.seq)
			}
		case n > 1:
			dups += n - 1
		}
	}
	for kk, seqs := range byKey {
		next := 1
		for _, s := range seqs {
			switch {
			case s == next:
				next++
			case s < next: // a repeat
			default:
				disorder++
				t.Errorf("aggregate %s: seq %d after %d", kk, s, next-1)
				next = s + 1
			}
		}
	}
	return lost, dups, disorder
}
