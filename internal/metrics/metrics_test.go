package metrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func ptr[T any](v T) *T { return &v }

func TestHandlerServesMetrics(t *testing.T) {
	m := New()
	m.Table("public.outbox").Received(3)
	orders := m.Topic("outbox.event.Order")
	orders.Delivered(2)
	orders.Failed(1)
	m.ObserveDelivery(time.Now().Add(-20*time.Millisecond), time.Now(), 2)
	m.ObserveBatch(2)
	m.SetInFlight(5, 1500)
	m.SetConfirmedLSN(0x16B3748)
	m.Reconnected()
	m.DecodeError()
	m.IgnoredChange("update")
	m.UnsolicitedMessages("stream_abort", 2)
	m.UnsolicitedMessages("unknown", 0)
	m.sampled.slot = &ops.SlotLag{Active: true, LagBytes: ptr(int64(4096)), RetainedWALBytes: ptr(int64(8192)), SafeWALSizeBytes: ptr(int64(1 << 30))}
	m.sampled.retry = &ops.Retry{Pending: 2, Dead: 1, OldestPendingAgeSeconds: ptr(42.0)}

	code, body := get(t, m.Handler(nil), "/metrics")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics = %d; want 200", code)
	}
	for _, want := range []string{
		`outbox_relay_events_received_total{table="public.outbox"} 3`,
		`outbox_relay_events_delivered_total{topic="outbox.event.Order"} 2`,
		`outbox_relay_events_failed_total{topic="outbox.event.Order"} 1`,
		`outbox_relay_delivery_latency_seconds_count 2`,
		`outbox_relay_delivery_latency_seconds_bucket{le="0.001"} 0`,
		`outbox_relay_delivery_latency_seconds_bucket{le="60"} 2`,
		`outbox_relay_produce_batch_messages_count 1`,
		`outbox_relay_in_flight_events 5`,
		`outbox_relay_in_flight_bytes 1500`,
		`outbox_relay_confirmed_lsn 2.380372e+07`,
		`outbox_relay_reconnects_total 1`,
		`outbox_relay_decode_errors_total 1`,
		`outbox_relay_ignored_changes_total{kind="update"} 1`,
		`outbox_relay_unsolicited_messages_total{kind="stream_abort"} 2`,
		`outbox_relay_sample_errors_total 0`,
		`outbox_relay_slot_active 1`,
		`outbox_relay_slot_lag_bytes 4096`,
		`outbox_relay_slot_retained_wal_bytes 8192`,
		`outbox_relay_slot_safe_wal_size_bytes 1.073741824e+09`,
		`outbox_relay_retry_pending_events 2`,
		`outbox_relay_retry_dead_events 1`,
		`outbox_relay_retry_oldest_pending_age_seconds 42`,
		`go_goroutines `,
		`process_cpu_seconds_total `,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
}

func TestSampledGaugesAbsentUntilKnown(t *testing.T) {
	m := New()
	_, body := get(t, m.Handler(nil), "/metrics")
	for _, name := range []string{"outbox_relay_slot_lag_bytes", "outbox_relay_slot_active", "outbox_relay_retry_pending_events", "outbox_relay_retry_oldest_pending_age_seconds"} {
		if strings.Contains(body, name) {
			t.Errorf("GET /metrics before any sample has %q; want it absent", name)
		}
	}
	// A known slot with unlimited WAL keeps safe_wal_size absent, and an
	// empty retry table reports its oldest pending age as 0.
	m.sampled.slot = &ops.SlotLag{LagBytes: ptr(int64(0)), RetainedWALBytes: ptr(int64(0))}
	m.sampled.retry = &ops.Retry{}
	_, body = get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_slot_active 0\n", "outbox_relay_slot_lag_bytes 0\n", "outbox_relay_retry_oldest_pending_age_seconds 0\n"} {
		if !strings.Contains(body, want) {
			t.Errorf("GET /metrics lacks %q", want)
		}
	}
	if strings.Contains(body, "outbox_relay_slot_safe_wal_size_bytes") {
		t.Errorf("GET /metrics has slot_safe_wal_size_bytes for an unlimited slot; want it absent")
	}
}

func TestReadyz(t *testing.T) {
	var reason atomic.Pointer[string] // nil: ready
	reason.Store(ptr("replication not streaming"))
	h := New().Handler(func(ctx context.Context) error {
		if r := reason.Load(); r != nil {
			return errors.New(*r)
		}
		return nil
	})
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "replication not streaming") {
		t.Errorf("GET /readyz = %d %q; want 503 with the reason", code, body)
	}
	if code, _ := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("GET /healthz while not ready = %d; want 200", code)
	}
	reason.Store(nil)
	if code, body := get(t, h, "/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("GET /readyz = %d %q; want 200 ready", code, body)
	}
	reason.Store(ptr("kafka unreachable"))
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "kafka unreachable") {
		t.Errorf("GET /readyz = %d %q; want 503 again with the new reason", code, body)
	}
	if code, _ := get(t, New().Handler(nil), "/readyz"); code != http.StatusOK {
		t.Errorf("GET /readyz with nil ready = %d; want 200", code)
	}
}

func TestReadyzTimesOut(t *testing.T) {
	h := New().Handler(func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	start := time.Now()
	code, _ := get(t, h, "/readyz")
	if code != http.StatusServiceUnavailable || time.Since(start) > ReadyTimeout+time.Second {
		t.Errorf("GET /readyz with a hung check = %d after %v; want 503 within %v", code, time.Since(start), ReadyTimeout)
	}
}

// histogram returns the gathered histogram of the named family.
func histogram(t *testing.T, m *Metrics, name string) *dto.Histogram {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram()
		}
	}
	t.Fatalf("Gather() has no %s", name)
	return nil
}

func cumulative(h *dto.Histogram, le float64) uint64 {
	for _, b := range h.GetBucket() {
		if b.GetUpperBound() == le {
			return b.GetCumulativeCount()
		}
	}
	return 1<<64 - 1
}

func TestDeliveryLatencyHistogram(t *testing.T) {
	commit := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name    string
		latency time.Duration
		events  int
		le      float64 // smallest bucket that must hold them
		below   float64 // largest bucket that must not
	}{
		{"sub-millisecond", 500 * time.Microsecond, 3, 0.001, 0},
		{"20ms", 20 * time.Millisecond, 2, 0.025, 0.01},
		{"clock skew counts as 0", -time.Second, 1, 0.001, 0},
		{"over a minute", 2 * time.Minute, 1, 0, 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New()
			m.ObserveDelivery(commit, commit.Add(tt.latency), tt.events)
			h := histogram(t, m, "outbox_relay_delivery_latency_seconds")
			if got := h.GetSampleCount(); got != uint64(tt.events) {
				t.Errorf("ObserveDelivery(%v, %d): count = %d; want %d", tt.latency, tt.events, got, tt.events)
			}
			if tt.le > 0 && cumulative(h, tt.le) != uint64(tt.events) {
				t.Errorf("ObserveDelivery(%v): bucket le=%g = %d; want %d", tt.latency, tt.le, cumulative(h, tt.le), tt.events)
			}
			if tt.below > 0 && cumulative(h, tt.below) != 0 {
				t.Errorf("ObserveDelivery(%v): bucket le=%g = %d; want 0", tt.latency, tt.below, cumulative(h, tt.below))
			}
		})
	}
	if LatencyBuckets[0] != 0.001 || LatencyBuckets[len(LatencyBuckets)-1] != 60 {
		t.Errorf("LatencyBuckets = %v; want 1ms to 60s", LatencyBuckets)
	}
}

func TestBatchHistogram(t *testing.T) {
	m := New()
	for _, n := range []int{1, 1000, 1000, 7000} {
		m.ObserveBatch(n)
	}
	h := histogram(t, m, "outbox_relay_produce_batch_messages")
	if h.GetSampleCount() != 4 || h.GetSampleSum() != 9001 {
		t.Errorf("ObserveBatch: count %d sum %g; want 4, 9001", h.GetSampleCount(), h.GetSampleSum())
	}
	if got := cumulative(h, 1000); got != 3 {
		t.Errorf("ObserveBatch: bucket le=1000 = %d; want 3", got)
	}
}

func TestTopicCached(t *testing.T) {
	m := New()
	if a, b := m.Topic("x"), m.Topic("x"); a != b {
		t.Errorf("Topic(%q) returned two handles; want the cached one", "x")
	}
	if a, b := m.Table("x"), m.Table("x"); a != b {
		t.Errorf("Table(%q) returned two handles; want the cached one", "x")
	}
	topic := m.Topic("hot")
	if n := testing.AllocsPerRun(100, func() { topic.Delivered(1); m.SetInFlight(1, 10); m.ObserveDelivery(time.Time{}, time.Time{}, 1) }); n != 0 {
		t.Errorf("hot path allocates %v times per call; want 0", n)
	}
}

func TestNilMetricsRecordsNothing(t *testing.T) {
	var m *Metrics
	m.Table("t").Received(1)
	m.Topic("t").Delivered(1)
	m.Topic("t").Failed(1)
	m.ObserveDelivery(time.Now(), time.Now(), 1)
	m.ObserveBatch(1)
	m.SetInFlight(1, 1)
	m.SetConfirmedLSN(1)
	m.Reconnected()
	m.DecodeError()
	m.IgnoredChange("update")
	m.RetentionDeleted(1)
	m.RetentionRound(time.Now(), time.Second, time.Second)
}

func TestRetentionMetrics(t *testing.T) {
	m := New()
	_, body := get(t, m.Handler(nil), "/metrics")
	if !strings.Contains(body, "outbox_relay_retention_deleted_total 0\n") {
		t.Errorf("GET /metrics before any round lacks %q", "outbox_relay_retention_deleted_total 0")
	}
	// Before a round (and while retention is off) there is no value: a 0
	// would read as a round in 1970.
	for _, absent := range []string{
		"outbox_relay_retention_lag_seconds ",
		"outbox_relay_retention_last_round_timestamp_seconds ",
		"outbox_relay_retention_round_duration_seconds ",
		"outbox_relay_retention_kept_for_other_slots ",
	} {
		if strings.Contains(body, "\n"+absent) {
			t.Errorf("GET /metrics before any round has %q; want no series", absent)
		}
	}
	m.RetentionDeleted(1000)
	m.RetentionDeleted(234)
	m.RetentionRound(time.Unix(1_800_000_000, 500_000_000), 1500*time.Millisecond, 90*time.Second)
	_, body = get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{
		"outbox_relay_retention_deleted_total 1234",
		"outbox_relay_retention_lag_seconds 90",
		"outbox_relay_retention_last_round_timestamp_seconds 1.8000000005e+09",
		"outbox_relay_retention_round_duration_seconds 1.5",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("GET /metrics after a round lacks %q", want)
		}
	}
}

func TestTookOver(t *testing.T) {
	m := New()
	_, body := get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_active 0", "outbox_relay_takeovers_total 0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("GET /metrics before a takeover lacks %q", want)
		}
	}
	if strings.Contains(body, "\noutbox_relay_leader_epoch ") {
		t.Errorf("GET /metrics before a takeover has a leader_epoch; want none (no epoch yet)")
	}
	m.TookOver(41)
	m.SetActive(false)
	m.TookOver(43)
	_, body = get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_active 1", "outbox_relay_leader_epoch 43", "outbox_relay_takeovers_total 2"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("GET /metrics after two takeovers lacks %q", want)
		}
	}
}

func TestServe(t *testing.T) {
	m := New()
	if err := m.Serve(context.Background(), "", nil); err != nil {
		t.Errorf("Serve(\"\") = %v; want nil (disabled)", err)
	}
	if err := m.Serve(context.Background(), "127.0.0.1:-1", nil); err == nil {
		t.Errorf("Serve(bad addr) = nil; want an error")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.serve(ctx, ln, nil) }()
	url := "http://" + ln.Addr().String()
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(url + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s = %d; want 200", path, resp.StatusCode)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve after cancel = %v; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("serve did not return after ctx was cancelled")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Errorf("GET /healthz after shutdown succeeded; want connection refused")
	}
}

// A relay's role is in /readyz's body: a standby is ready to take over,
// which an operator must be able to tell from delivering.
func TestReadyzSaysRole(t *testing.T) {
	m := New()
	role := "standby: walsender pid 7"
	m.SetRole(func() string { return role })
	h := m.Handler(func(context.Context) error { return nil })
	if code, body := get(t, h, "/readyz"); code != http.StatusOK || body != "ready: standby: walsender pid 7\n" {
		t.Errorf("/readyz = %d %q; want 200 with the role", code, body)
	}
	role = "leader"
	if _, body := get(t, h, "/readyz"); body != "ready: leader\n" {
		t.Errorf("/readyz body = %q; want the leader role", body)
	}
}

// At start-up every counter is exported at 0, labelled ones with a series
// for each documented label value, so that increase() counts the first
// event; gauges with no value yet have no series. Scraped, not described:
// this is what Prometheus stores.
func TestSeriesAtStartup(t *testing.T) {
	m := New()
	_, body := get(t, m.Handler(nil), "/metrics")
	want := []string{
		`outbox_relay_ignored_changes_total{kind="update"} 0`,
		`outbox_relay_ignored_changes_total{kind="delete"} 0`,
		`outbox_relay_ignored_changes_total{kind="truncate"} 0`,
		`outbox_relay_ignored_changes_total{kind="non_transactional_message"} 0`,
		`outbox_relay_ignored_changes_total{kind="other_table"} 0`,
		`outbox_relay_unsolicited_messages_total{kind="stream_abort"} 0`,
		`outbox_relay_unsolicited_messages_total{kind="unknown"} 0`,
	}
	for _, name := range []string{"reconnects_total", "replication_pauses_total", "decode_errors_total", "sample_errors_total",
		"retry_attempts_total", "retry_delivered_total", "retry_dead_lettered_total",
		"headers_dropped_total", "headers_invalid_total", "trace_context_invalid_total",
		"schema_stops_total", "placement_stops_total", "takeovers_total", "refills_total",
		"refilled_events_total", "retention_deleted_total"} {
		want = append(want, "outbox_relay_"+name+" 0")
	}
	for _, w := range want {
		if !strings.Contains(body, "\n"+w+"\n") {
			t.Errorf("GET /metrics at start-up lacks %q", w)
		}
	}
	for _, absent := range []string{"confirmed_lsn", "leader_epoch", "retention_lag_seconds",
		"retention_last_round_timestamp_seconds", "retention_round_duration_seconds", "retention_kept_for_other_slots"} {
		if strings.Contains(body, "\noutbox_relay_"+absent+" ") {
			t.Errorf("GET /metrics at start-up has outbox_relay_%s; want no series before its first value", absent)
		}
	}
}

// The kinds exported at 0 are the ones the metrics reference documents.
func TestKindsDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/operating.md")
	if err != nil {
		t.Fatal(err)
	}
	code := regexp.MustCompile("`([a-z_]+)`")
	for _, tt := range []struct {
		row  string
		want []string
	}{
		{"`ignored_changes_total{kind}`", IgnoredKinds},
		{"`unsolicited_messages_total{kind}`", UnsolicitedKinds},
	} {
		var documented []string
		for _, line := range strings.Split(string(b), "\n") {
			cells := strings.Split(line, "|")
			if len(cells) < 4 || !strings.Contains(cells[1], tt.row) {
				continue
			}
			for _, m := range code.FindAllStringSubmatch(cells[3], -1) {
				if m[1] != "kind" {
					documented = append(documented, m[1])
				}
			}
		}
		got, want := slices.Sorted(slices.Values(documented)), slices.Sorted(slices.Values(tt.want))
		if !slices.Equal(got, want) {
			t.Errorf("docs/operating.md documents the kinds of %s as %v; the code exports %v at 0", tt.row, got, want)
		}
	}
}

// A standby is ready as /readyz says (while it reaches Postgres), and shows
// none of a former leadership's check results.
func TestSetStandby(t *testing.T) {
	m := New()
	m.SetHealth(map[string]bool{"kafka": true}, 5*time.Second)
	m.SetStandby(true)
	_, body := get(t, m.Handler(nil), "/metrics")
	for _, want := range []string{"outbox_relay_ready 1", "outbox_relay_stalled_seconds 0"} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("GET /metrics of a standby that reaches Postgres lacks %q", want)
		}
	}
	if strings.Contains(body, "outbox_relay_health_failing{") {
		t.Errorf("GET /metrics of a standby has health_failing series; want none (a former term's)")
	}
	m.SetStandby(false)
	if _, body := get(t, m.Handler(nil), "/metrics"); !strings.Contains(body, "\noutbox_relay_ready 0\n") {
		t.Errorf("GET /metrics of a standby that cannot reach Postgres lacks %q", "outbox_relay_ready 0")
	}
}

// Every kind the relay counts is one exported at 0 from start-up: a kind
// added at a call site without IgnoredKinds or UnsolicitedKinds would be
// missed by increase() at its first occurrence again.
func TestKindsCalledArePrecreated(t *testing.T) {
	// The relay counts what the stream skips; internal/source what a
	// shape of change ignores.
	files, err := filepath.Glob("../relay/*.go")
	more, err2 := filepath.Glob("../source/*.go")
	if err != nil || err2 != nil || len(files) == 0 || len(more) == 0 {
		t.Fatalf("no sources of internal/relay or internal/source: %v, %v", err, err2)
	}
	files = append(files, more...)
	call := regexp.MustCompile(`\.(IgnoredChange|UnsolicitedMessages)\("([^"]*)"`)
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(b), -1) {
			n++
			kinds := IgnoredKinds
			if m[1] == "UnsolicitedMessages" {
				kinds = UnsolicitedKinds
			}
			if !slices.Contains(kinds, m[2]) {
				t.Errorf("%s: %s(%q): the kind is not exported at 0 from start-up; add it to the list and to docs/operating.md", f, m[1], m[2])
			}
		}
	}
	if n < len(IgnoredKinds)+len(UnsolicitedKinds) {
		t.Errorf("found %d calls of IgnoredChange and UnsolicitedMessages in internal/relay and internal/source; want at least one per kind (%d)", n, len(IgnoredKinds)+len(UnsolicitedKinds))
	}
}

// Value reads a counter's and a gauge's series by their labels, 0 when
// absent, as the tests of other packages read them.
func TestValue(t *testing.T) {
	m := New()
	m.IgnoredChange("update")
	m.IgnoredChange("update")
	m.Table("public.outbox").Received(3)
	if v := m.Value("outbox_relay_ignored_changes_total", "kind", "update"); v != 2 {
		t.Errorf(`ignored_changes_total{kind="update"} = %v; want 2`, v)
	}
	if v := m.Value("outbox_relay_ignored_changes_total", "kind", "delete"); v != 0 {
		t.Errorf(`ignored_changes_total{kind="delete"} = %v; want 0`, v)
	}
	if v := m.Value("outbox_relay_events_received_total", "table", "public.outbox"); v != 3 {
		t.Errorf(`events_received_total{table="public.outbox"} = %v; want 3`, v)
	}
	if v := m.Value("outbox_relay_events_received_total", "table", "public.other"); v != 0 {
		t.Errorf("a series that does not exist = %v; want 0", v)
	}
}
