package relay_test

import (
	"context"
	"log/slog"
	"runtime"
	"testing"
	"time"
)

// BenchmarkDrain drains a backlog of b.N events (~300-byte JSON payloads, 1000
// per transaction, inserted server-side before the timer starts) from the slot
// to Kafka with the relay in this process, until the slot is confirmed past the
// last transaction. It is the profiling harness behind `make bench`'s figures:
//
//	go test -run '^$' -bench BenchmarkDrain -benchtime 200000x -cpuprofile cpu.out ./internal/relay
func BenchmarkDrain(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	_, err := f.pool.Exec(ctx, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), (ARRAY['Order','Payment','Customer','Invoice','Shipment'])[1 + g % 5],
		       'agg-' || (g % 1000), 'Changed',
		       jsonb_build_object('seq', g, 'pad', repeat('x', 240))
		FROM generate_series(1, $1) g`, b.N)
	if err != nil {
		b.Fatal(err)
	}
	var end string
	if err := f.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&end); err != nil {
		b.Fatal(err)
	}
	cfg := f.config(b)
	cfg.Logger = slog.New(slog.DiscardHandler)
	runtime.GC()
	b.ResetTimer()
	start := time.Now()
	f.start(b, cfg)
	// The slot passes end only when everything before it was delivered and
	// confirmed (then it advances over the idle WAL after the last commit).
	for target := mustLSN(b, end); f.slotConfirmed(b) < target; {
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("not drained after 10 minutes")
		}
		time.Sleep(10 * time.Millisecond)
	}
	b.StopTimer()
	el := time.Since(start)
	b.ReportMetric(float64(b.N)/el.Seconds(), "events/s")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.Sys)/(1<<20), "sys-MiB")
	b.Logf("%d events in %s", b.N, el.Round(time.Millisecond))
}
