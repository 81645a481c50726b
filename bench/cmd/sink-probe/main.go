// Command sink-probe measures the relay's Kafka sink (package sink, on
// franz-go's kgo since issue 36; before, its own producer) against kgo used
// directly, first the one way that keeps the relay's order rule, which is
// how the sink uses it: a write's records are all buffered before any is
// sent (kgo.ManualFlushing) and the next write is produced only after the
// previous Flush delivered every promise, so a batch that fails cannot be
// overtaken by a later record of its key. It writes the same events (250
// bytes, 3 headers, 200 keys) to a fresh 6-partition topic on the broker of
// RELAY_TEST_KAFKA_BROKERS (scripts/dev.sh env) and prints events/s and the
// p50/p99 of one write:
//
//	sink-write   sink.Write, one write at a time
//	sink-send5   sink.Send, up to 5 writes in flight (what the relay does)
//	kgo-manual   Produce all, then Flush, one write at a time (order-safe)
//	kgo-sync     ProduceSync per write (kgo's own batching, linger 0)
//	kgo-stream   Produce without waiting, one Flush at the end (kgo's
//	             ceiling; not order-safe for the relay: a failed batch's
//	             key can be overtaken by what is produced after it)
//
// Run from bench/: go run ./cmd/sink-probe -runs 3
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

func main() {
	runs := flag.Int("runs", 3, "rounds of every mode")
	total := flag.Int("events", 200000, "events per mode at 1,000 per write (3,000 writes at 100)")
	flag.Parse()
	brokers := strings.Split(os.Getenv("RELAY_TEST_KAFKA_BROKERS"), ",")
	if brokers[0] == "" {
		fmt.Fprintln(os.Stderr, "sink-probe: RELAY_TEST_KAFKA_BROKERS is not set: eval \"$(scripts/dev.sh env)\" first")
		os.Exit(2)
	}
	ctx := context.Background()
	topic := "sink-probe-" + strconv.FormatInt(time.Now().Unix(), 10)
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	check(err)
	_, err = kadm.NewClient(adm).CreateTopic(ctx, 6, 1, nil, topic)
	check(err)
	adm.Close()
	time.Sleep(time.Second) // leaders elected
	for range *runs {
		for _, size := range []int{1000, 100} {
			writes := *total / size
			if size == 100 {
				writes = 3000
			}
			w := workload{brokers: brokers, topic: topic, size: size, writes: writes}
			w.sink(ctx)
			w.kgo(ctx)
		}
		fmt.Println()
	}
}

type workload struct {
	brokers      []string
	topic        string
	size, writes int
}

func (w workload) events(n int) []event.Event {
	evs := make([]event.Event, w.size)
	val := []byte(strings.Repeat("x", 250))
	for i := range evs {
		k := "agg-" + strconv.Itoa((n*w.size+i)%200)
		evs[i] = event.Event{ID: strconv.Itoa(n*w.size + i), Topic: w.topic, Key: []byte(k), Value: val,
			Headers: []event.Header{{Key: "id", Value: []byte("e")}, {Key: "eventType", Value: []byte("Created")}, {Key: "aggregateType", Value: []byte("Order")}}}
	}
	return evs
}

func (w workload) records(n int) []*kgo.Record {
	evs := w.events(n)
	rs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		hs := make([]kgo.RecordHeader, len(e.Headers))
		for j, h := range e.Headers {
			hs[j] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
		}
		rs[i] = &kgo.Record{Topic: e.Topic, Key: e.Key, Value: e.Value, Headers: hs}
	}
	return rs
}

// timed runs write for every write, after one unmeasured, then end, and
// prints the rate (end included) and the p50/p99 of one write.
func (w workload) timed(name string, write func(n int), end func()) {
	write(0)
	end()
	lat := make([]time.Duration, 0, w.writes)
	t0 := time.Now()
	for n := range w.writes {
		s := time.Now()
		write(n)
		lat = append(lat, time.Since(s))
	}
	end()
	el := time.Since(t0)
	slices.Sort(lat)
	fmt.Printf("%-12s size=%4d %8.0f ev/s  p50 %-10v p99 %v\n", name, w.size, float64(w.writes*w.size)/el.Seconds(),
		lat[len(lat)/2].Round(time.Microsecond), lat[(len(lat)-1)*99/100].Round(time.Microsecond))
}

func (w workload) sink(ctx context.Context) {
	k, err := sink.New(kafkaclient.Config{Brokers: w.brokers})
	check(err)
	defer k.Close()
	w.timed("sink-write", func(n int) { check(k.Write(ctx, w.events(n))) }, func() {})
	var ds []sink.Delivery
	w.timed("sink-send5", func(n int) {
		ds = append(ds, k.Send(ctx, w.events(n)))
		if len(ds) >= 5 {
			check(ds[0].Wait(ctx))
			ds = ds[1:]
		}
	}, func() {
		for _, d := range ds {
			check(d.Wait(ctx))
		}
		ds = nil
	})
}

func (w workload) kgo(ctx context.Context) {
	opts := []kgo.Opt{kgo.SeedBrokers(w.brokers...), kgo.MaxBufferedRecords(1 << 20),
		kgo.ProducerBatchCompression(kgo.NoCompression()), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil))}
	cl, err := kgo.NewClient(append(opts, kgo.ManualFlushing())...)
	check(err)
	w.timed("kgo-manual", func(n int) {
		var failed error
		for _, r := range w.records(n) {
			cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
				if err != nil {
					failed = err
				}
			})
		}
		check(cl.Flush(ctx))
		check(failed)
	}, func() {})
	cl.Close()
	cl, err = kgo.NewClient(append(opts, kgo.ProducerLinger(0))...)
	check(err)
	defer cl.Close()
	w.timed("kgo-sync", func(n int) { check(cl.ProduceSync(ctx, w.records(n)...).FirstErr()) }, func() {})
	w.timed("kgo-stream", func(n int) {
		for _, r := range w.records(n) {
			cl.Produce(ctx, r, nil)
		}
	}, func() { check(cl.Flush(ctx)) })
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "sink-probe:", err)
		os.Exit(1)
	}
}
