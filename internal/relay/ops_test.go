package relay_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/metrics"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
)

// TestMetricsDuringRun scrapes /metrics while the relay runs: the delivered
// count must equal the events inserted, and the latency histogram must have
// one observation per event. /healthz and /readyz must answer 200.
func TestMetricsDuringRun(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MetricsListen = testenv.FreeAddr(t)
	run := f.start(t, cfg)

	const n = 1200
	for range 12 {
		f.insertTx(t, f.makeEvents(n/12))
	}
	f.waitCount(t, n, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)

	base := "http://" + cfg.MetricsListen
	var body string
	deadline := time.Now().Add(10 * time.Second)
	for {
		body = httpGet(t, base+"/metrics", 200)
		if sumMetric(body, "outbox_relay_events_delivered_total") == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := sumMetric(body, "outbox_relay_events_delivered_total"); got != n {
		t.Errorf("outbox_relay_events_delivered_total summed over topics = %v; want %d", got, n)
	}
	if got := sumMetric(body, "outbox_relay_events_received_total"); got != n {
		t.Errorf("outbox_relay_events_received_total = %v; want %d", got, n)
	}
	if got := sumMetric(body, "outbox_relay_delivery_latency_seconds_count"); got != n {
		t.Errorf("outbox_relay_delivery_latency_seconds_count = %v; want %d (one observation per event)", got, n)
	}
	// The producer's figures, per broker (sink.Observer).
	if got := sumMetric(body, "outbox_relay_kafka_produce_latency_seconds_count"); got < 1 {
		t.Errorf("outbox_relay_kafka_produce_latency_seconds_count = %v; want the produce requests that delivered %d events", got, n)
	}
	broker := `{broker="` + f.kafka.Brokers[0] + `"}`
	for _, want := range []string{"outbox_relay_kafka_produce_latency_seconds_count" + broker, "outbox_relay_kafka_requests_in_flight" + broker,
		"outbox_relay_kafka_produce_retries_total 0", "outbox_relay_kafka_producer_resets_total 0"} {
		if !strings.Contains(body, "\n"+want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if got := sumMetric(body, "outbox_relay_confirmed_lsn"); got < float64(ends[len(ends)-1]) {
		t.Errorf("outbox_relay_confirmed_lsn = %v; want >= %d (%s)", got, uint64(ends[len(ends)-1]), ends[len(ends)-1])
	}
	httpGet(t, base+"/healthz", 200)
	httpGet(t, base+"/readyz", 200)
	run.stop(t)
}

// acquire takes a connection of the pool, as the ops commands take one,
// released when the test ends.
func (f *fixture) acquire(t *testing.T) *pgxpool.Conn {
	t.Helper()
	conn, err := f.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	return conn
}

// TestLagWithRelay: lag grows while the relay is stopped and events are
// inserted, with a time lag of about the age of the oldest undelivered event,
// and returns to about zero once the relay runs again.
func TestLagWithRelay(t *testing.T) {
	f := newFixture(t)
	run := f.start(t, f.config(t))
	f.deliveredTx(t, 10)
	run.stop(t)

	ctx := context.Background()
	conn := f.acquire(t)
	cfg := ops.Config{Slot: f.slot}

	for range 5 {
		f.insertTx(t, f.makeEvents(100))
	}
	time.Sleep(2 * time.Second) // the oldest undelivered event is now >= 2s old
	rep, err := ops.Lag(ctx, conn, cfg)
	if err != nil {
		t.Fatalf("Lag: %v", err)
	}
	if rep.LagBytes == nil || *rep.LagBytes < 500*50 {
		t.Fatalf("relay stopped, 500 events inserted: lag_bytes = %v; want >= %d", rep.LagBytes, 500*50)
	}
	if rep.TimeLag.State != ops.StateBehind || rep.TimeLag.Seconds == nil || *rep.TimeLag.Seconds < 2 || *rep.TimeLag.Seconds > 30 {
		t.Fatalf("relay stopped: time_lag = %s, %v s; want behind, between 2 and 30 s", rep.TimeLag.State, deref(rep.TimeLag.Seconds))
	}

	run = f.start(t, f.config(t))
	f.waitCount(t, 510, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	// Only the WAL the relay's own checkpoint saves wrote may be left, once
	// it has confirmed the server's position. The lag is measured against
	// the whole server's WAL, which other packages' tests write too (bursts
	// of megabytes under make test): look for a moment it says caught up,
	// within a minute, rather than take the first reading.
	deadline := time.Now().Add(time.Minute)
	for {
		rep, err = ops.Lag(ctx, conn, cfg)
		if err != nil {
			t.Fatalf("Lag: %v", err)
		}
		if rep.LagBytes != nil && *rep.LagBytes <= 64<<10 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if rep.LagBytes == nil || *rep.LagBytes > 64<<10 {
		t.Errorf("relay caught up: lag_bytes = %v for a minute; want about 0 (<= 64 KiB)", deref64(rep.LagBytes))
	}
	if rep.TimeLag.State != ops.StateCaughtUp {
		t.Errorf("relay caught up: time_lag.state = %q; want %q", rep.TimeLag.State, ops.StateCaughtUp)
	}
	run.stop(t)
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func deref64(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func httpGet(t *testing.T, url string, want int) string {
	t.Helper()
	var resp *http.Response
	var err error
	for range 50 { // the server starts with the relay
		resp, err = http.Get(url)
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s = %d %s; want %d", url, resp.StatusCode, b, want)
	}
	return string(b)
}

// sumMetric adds up every sample of the metric name in a Prometheus text
// exposition (all label sets).
func sumMetric(body, name string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// TestLagCountsTransactionBeingRead: while the relay reads one large
// transaction (5000 events, 64 KiB in flight, Kafka's writes held until lag
// has shown it, then 0.1 s each), lag reports it (its events and bytes so far, its age), counts it
// in behind_bytes, and a --max-bytes threshold that lag_bytes alone does
// not exceed fires on it; once the transaction is confirmed, the figure is
// gone. Before, only lag_bytes (the slot's WAL lag) was there, which misses
// a transaction the server decoded before it sent it (issue 34: 2.5 MiB
// while 5M events waited).
func TestLagCountsTransactionBeingRead(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.MaxInFlightBytes = 64 << 10
	// Held rather than only slow: how long the relay takes over the
	// transaction must not decide whether lag sees it.
	hold := make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	defer release()
	slow := &slowSink{delay: 100 * time.Millisecond, hold: hold}
	f.startSlowSink(t, cfg, slow)
	ctx := context.Background()
	conn := f.acquire(t)
	ocfg := ops.Config{Slot: f.slot}

	f.insertTx(t, f.makeEvents(5000))
	// A minute from the transaction's first event reaching the sink: on a
	// server loaded by the other packages' tests the slot's walsender may
	// still be decoding their WAL, which it reads too, when this commits.
	var r *ops.LagReport
	var err error
	var deadline time.Time
	giveUp := time.Now().Add(5 * time.Minute)
	for {
		if r, err = ops.Lag(ctx, conn, ocfg); err != nil {
			t.Fatal(err)
		}
		if r.Reading != nil && r.Reading.Events > 0 {
			break
		}
		if deadline.IsZero() && slow.sent.Load() > 0 {
			deadline = time.Now().Add(time.Minute)
		}
		if now := time.Now(); now.After(giveUp) || !deadline.IsZero() && now.After(deadline) {
			var row string
			if err := f.pool.QueryRow(ctx, "SELECT coalesce((SELECT to_jsonb(c)::text FROM outbox_relay_checkpoint c WHERE slot_name = $1), 'no row')", f.slot).Scan(&row); err != nil {
				row = err.Error()
			}
			t.Fatalf("lag reading = nil while the relay holds a transaction of 5000 events committed by %s, %d of them handed to the held sink (a minute after the first; report %+v, checkpoint row %s); want its figures",
				f.commitEnds(t)[0], slow.sent.Load(), r, row)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rd := r.Reading
	if rd.Bytes <= 0 || rd.Events > 5000 || rd.AgeSeconds == nil || *rd.AgeSeconds < 0 {
		t.Errorf("lag reading = %+v; want events in (0, 5000], bytes > 0, an age", rd)
	}
	if r.LagBytes == nil || r.BehindBytes == nil || *r.BehindBytes != *r.LagBytes+rd.Bytes {
		t.Fatalf("lag behind_bytes = %v, lag_bytes %v, reading bytes %d; want behind_bytes = lag_bytes + reading bytes", r.BehindBytes, r.LagBytes, rd.Bytes)
	}
	// A threshold lag_bytes alone meets but does not exceed.
	err = ops.Thresholds{MaxBytes: *r.LagBytes}.Check(r)
	if exitcode.Of(err) != exitcode.Threshold || !strings.Contains(err.Error(), "behind_bytes") || !strings.Contains(err.Error(), rd.CommitLSN) {
		t.Errorf("Thresholds{MaxBytes: lag_bytes %d}.Check = %v; want exceeded by behind_bytes, naming the transaction %s", *r.LagBytes, err, rd.CommitLSN)
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "reading") || !strings.Contains(text.String(), "transaction committed at "+rd.CommitLSN) {
		t.Errorf("lag's text lacks the transaction being read:\n%s", text.String())
	}

	release()
	f.waitCount(t, 5000, 2*time.Minute)
	f.waitConfirmed(t, f.commitEnds(t)[0], time.Minute)
	if r, err = ops.Lag(ctx, conn, ocfg); err != nil {
		t.Fatal(err)
	}
	if r.Reading != nil || r.BehindBytes == nil || r.LagBytes == nil || *r.BehindBytes != *r.LagBytes {
		t.Errorf("lag after the transaction was confirmed: reading %+v, behind_bytes %v, lag_bytes %v; want no reading and behind_bytes = lag_bytes", r.Reading, r.BehindBytes, r.LagBytes)
	}
}

// TestStandbyReadyMetric: the ready metric says what /readyz says. A healthy
// standby answers /readyz 200 "ready: standby…" and must export ready 1 (with
// active 0, which is what tells it from the leader), or the shipped
// OutboxRelayNotReady alert fires for every healthy pair.
func TestStandbyReadyMetric(t *testing.T) {
	f := newFixture(t)
	leaderCfg := f.config(t)
	leaderCfg.MetricsListen = testenv.FreeAddr(t)
	leader := f.start(t, leaderCfg)
	f.insertTx(t, f.makeEvents(3))
	f.waitCount(t, 3, time.Minute) // it leads

	standbyCfg := f.config(t)
	standbyCfg.MetricsListen = testenv.FreeAddr(t)
	standbyCfg.StandbyPoll = 100 * time.Millisecond
	f.start(t, standbyCfg)
	base := "http://" + standbyCfg.MetricsListen
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		if ready := httpGet(t, base+"/readyz", 200); strings.HasPrefix(ready, "ready: standby") {
			body = httpGet(t, base+"/metrics", 200)
			if strings.Contains(body, "\noutbox_relay_ready 1\n") || time.Now().After(deadline) {
				break
			}
		} else if time.Now().After(deadline) {
			t.Fatalf("standby's /readyz = %q; want \"ready: standby…\"", ready)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, want := range []string{"outbox_relay_ready 1", "outbox_relay_active 0", "outbox_relay_takeovers_total 0"} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("standby's /metrics lacks %q (its /readyz is 200 ready: standby)", want)
		}
	}
	// A standby runs none of the leader's checks and never took over.
	for _, absent := range []string{"outbox_relay_health_failing{", "outbox_relay_leader_epoch ", "outbox_relay_confirmed_lsn "} {
		if strings.Contains(body, "\n"+absent) {
			t.Errorf("standby's /metrics has %q; want it absent", absent)
		}
	}

	lb := httpGet(t, "http://"+leaderCfg.MetricsListen+"/metrics", 200)
	for _, want := range []string{"outbox_relay_ready 1", "outbox_relay_active 1", "outbox_relay_takeovers_total 1"} {
		if !strings.Contains(lb, "\n"+want+"\n") {
			t.Errorf("leader's /metrics lacks %q", want)
		}
	}
	leader.stop(t)
}

// The delivered and failed counters of the topics the configuration names
// (overrides, a template without placeholders) are exported at 0 from
// start-up, so that increase() and rate() count their first delivery.
func TestNamedTopicsAtZero(t *testing.T) {
	m := metrics.New()
	cfg := relay.Config{
		Replication: replication.Config{DSN: "postgres://relay@127.0.0.1:1/none", Slot: "s", Publication: "p"},
		Router:      router.Config{Topic: "outbox.{aggregate_type}", Overrides: map[string]string{"Payment": "payments"}},
		Tables:      []relay.OutboxTable{{Table: "public.audit_outbox", Router: router.Config{Topic: "audit"}}},
		Sink:        kafkaclient.Config{Brokers: []string{"127.0.0.1:1"}},
		Metrics:     m,
	}
	if _, err := newRelay(t, cfg); err != nil {
		t.Fatalf("relay.New: %v", err)
	}
	rec := httptest.NewRecorder()
	m.Handler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`outbox_relay_events_delivered_total{topic="payments"} 0`,
		`outbox_relay_events_failed_total{topic="payments"} 0`,
		`outbox_relay_events_delivered_total{topic="audit"} 0`,
		`outbox_relay_events_failed_total{topic="audit"} 0`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics before any event lacks %q", want)
		}
	}
	if strings.Contains(body, `topic="outbox.{aggregate_type}"`) {
		t.Errorf("/metrics has a series for the template itself; want topics only")
	}
}
