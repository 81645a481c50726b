package sink_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// recorder is a sink.Observer that keeps what it is told.
type recorder struct {
	mu                 sync.Mutex
	answered           map[string]int
	unanswered         int
	slowest            time.Duration
	inFlight, peak     int
	retries, resets    int
	negativeInFlight   bool
	answeredNotWritten bool
}

func (r *recorder) ProduceAnswered(broker string, took time.Duration, unanswered bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered == nil {
		r.answered = map[string]int{}
	}
	r.answered[broker]++
	r.slowest = max(r.slowest, took)
	if unanswered {
		r.unanswered++
	}
}

func (r *recorder) ProduceInFlight(broker string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight += delta
	r.peak = max(r.peak, r.inFlight)
	r.negativeInFlight = r.negativeInFlight || r.inFlight < 0
}

func (r *recorder) ProduceRetried() { r.mu.Lock(); r.retries++; r.mu.Unlock() }
func (r *recorder) ProducerReset()  { r.mu.Lock(); r.resets++; r.mu.Unlock() }

// TestObserver: the producer tells its Observer of every produce request
// (per broker, in flight until answered, how long it took) and of the
// retries its Stats count, so that the relay's metrics say what Stats say.
func TestObserver(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(4, "orders"))
	h := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Partitions: []int32{1},
		Err: kerr.NotEnoughReplicas, Count: 3})
	defer h.Remove()
	// WriteTimeout short: the retries kgo makes inside are counted by the
	// round's watchdog.
	k := newSink(t, kafkaclient.Config{Brokers: c.ListenAddrs(), BatchSize: 300, MaxInFlight: 3, WriteTimeout: 200 * time.Millisecond})
	rec := &recorder{}
	k.SetObserver(rec)
	in := msgs("orders", 3000, 23)
	var ds []sink.Delivery
	for i := 0; i < len(in); i += 600 {
		ds = append(ds, k.Send(context.Background(), in[i:i+600]))
	}
	for _, d := range ds {
		if err := d.Wait(context.Background()); err != nil {
			t.Fatalf("Wait = %v", err)
		}
	}
	checkOrder(t, readAll(t, c.ListenAddrs(), "orders", len(in)), 4)

	st := k.Stats()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.answered) != 1 || rec.answered[c.ListenAddrs()[0]] < int(st.Writes) {
		t.Errorf("answered = %v; want at least the %d writes' requests, all to broker %s", rec.answered, st.Writes, c.ListenAddrs()[0])
	}
	if rec.inFlight != 0 || rec.negativeInFlight || rec.peak < 1 || rec.peak > 3 {
		t.Errorf("in flight at the end %d (negative on the way: %v), peak %d; want back to 0, peak within 1..3 (max in flight)", rec.inFlight, rec.negativeInFlight, rec.peak)
	}
	if rec.slowest <= 0 || rec.unanswered != 0 {
		t.Errorf("slowest answer %s, unanswered %d; want a positive latency, none unanswered", rec.slowest, rec.unanswered)
	}
	if int64(rec.retries) != st.Retries || rec.retries == 0 || int64(rec.resets) != st.ProducerResets {
		t.Errorf("observed %d retries, %d resets; Stats say %d and %d (want equal, retries > 0: the fault hit %d times)", rec.retries, rec.resets, st.Retries, st.ProducerResets, h.Hits())
	}
}
