package replay_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/replay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// relayEnv is the environment of outbox-relay processes on the fixture.
func (f *fixture) relayEnv(t *testing.T) []string {
	return append(os.Environ(),
		"RELAY_POSTGRES_DSN="+f.pg.DSN,
		"RELAY_POSTGRES_SLOT="+f.slot,
		"RELAY_KAFKA_BROKERS="+strings.Join(f.kafka.Brokers, ","),
		"RELAY_TOPICS_TEMPLATE="+f.prefix+"{aggregate_type}",
		"RELAY_METRICS_LISTEN=",
		"RELAY_LOG_FORMAT=json",
	)
}

func relay(t *testing.T, env []string, args ...string) (string, *syscall.Rusage) {
	t.Helper()
	cmd := exec.Command(testenv.RelayBinary(t), args...)
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("outbox-relay %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), cmd.ProcessState.SysUsage().(*syscall.Rusage)
}

// A replay beside the live relay: the live relay keeps delivering every new
// event (its slot and checkpoint untouched), the replay sends its selection
// and stops where it started.
func TestReplayBesideLiveRelay(t *testing.T) {
	f := newFixture(t)
	env := f.relayEnv(t)
	relay(t, env, "setup")
	live := exec.Command(testenv.RelayBinary(t), "run")
	live.Env = env
	var liveOut bytes.Buffer
	live.Stdout, live.Stderr = &liveOut, &liveOut
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		live.Process.Kill()
		live.Wait()
		if t.Failed() {
			t.Logf("live relay:\n%s", liveOut.String())
		}
	}()

	// History to replay, then a producer the live relay serves meanwhile.
	f.insert(t, "Order", 1, 3000, time.Now().Add(-time.Hour))
	var produced atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			f.pg.Exec(t, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (gen_random_uuid(), 'Live', 'L', 'E', $1)`,
				fmt.Sprintf(`{"n": %d}`, 100000+i))
			produced.Add(1)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	began := time.Now()
	out, _ := relay(t, env, "replay", "--id", "beside", "--aggregate-type", "Order", "--batch", "200", "--rate", "1500")
	if took := time.Since(began); took < 1800*time.Millisecond {
		t.Errorf("3000 events at --rate 1500 took %s; want about 2s", took)
	}
	close(stop)
	<-done
	if !strings.Contains(out, "replay beside done: 3000 events sent") {
		t.Errorf("replay output:\n%s", out)
	}
	got := f.read(t, f.prefix+"Order", "beside")
	if count(got) != 3000 {
		t.Errorf("replayed %d; want 3000", count(got))
	}
	increasing(t, got)

	// The live relay delivered the history once (live) and every new event,
	// none marked as a replay.
	want := int(produced.Load())
	deadline := time.Now().Add(60 * time.Second)
	var liveN int
	for {
		liveN = 0
		for _, m := range f.kafka.ReadAll(t, f.prefix+"Live") {
			for _, h := range m.Headers {
				if h.Key == replay.HeaderReplayID {
					t.Fatalf("a live message carries %s", replay.HeaderReplayID)
				}
			}
			liveN++
		}
		if liveN >= want || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if liveN != want {
		t.Errorf("the live relay delivered %d of %d new events during the replay", liveN, want)
	}
	t.Logf("replay of 3000 beside the live relay, which delivered %d new events meanwhile", liveN)
}

// TestReplayLarge replays RELAY_REPLAY_ROWS rows (default 20000; `make
// bench-replay` runs 1,000,000) through the binary and reports its
// throughput and peak RSS: memory must not grow with the selection.
func TestReplayLarge(t *testing.T) {
	rows := 20000
	if s := os.Getenv("RELAY_REPLAY_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("RELAY_REPLAY_ROWS=%q: want a positive number", s)
		}
		rows = n
	}
	f := newFixture(t)
	ctx := context.Background()
	env := f.relayEnv(t)
	relay(t, env, "setup") // the live relay's slot, to compare with its drain of the same rows
	// ~200-byte payloads, 1,000 aggregates.
	if _, err := f.pg.Pool(t).Exec(ctx, `INSERT INTO public.outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
SELECT gen_random_uuid(), 'Order', 'A-' || (i % 1000), 'E', jsonb_build_object('n', i, 'pad', repeat('x', 180)), now() - interval '1 hour'
FROM generate_series(1, $1::int) i`, rows); err != nil {
		t.Fatal(err)
	}
	f.pg.Exec(t, `ANALYZE public.outbox`)
	var walEnd string
	if err := f.pg.Pool(t).QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&walEnd); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	out, ru := relay(t, env, "replay", "--id", "large", "--topic", f.prefix+"large", "--batch", "1000")
	took := time.Since(began)
	if !strings.Contains(out, fmt.Sprintf("replay large done: %d events sent", rows)) {
		t.Fatalf("replay output:\n%s", out)
	}
	rss := float64(ru.Maxrss) / 1024 // KiB on Linux
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	t.Logf("replayed %d events in %s: %.0f events/s, peak RSS %.1f MiB, CPU %s (%.2f s per million)",
		rows, took.Round(time.Millisecond), float64(rows)/took.Seconds(), rss, cpu.Round(time.Millisecond), cpu.Seconds()/float64(rows)*1e6)

	// The live relay draining the same rows from its slot, in the same run.
	live := exec.Command(testenv.RelayBinary(t), "run")
	live.Env = env
	var liveOut bytes.Buffer
	live.Stdout, live.Stderr = &liveOut, &liveOut
	began = time.Now()
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()
	for {
		var done bool
		if err := f.pg.Pool(t).QueryRow(ctx, `SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1`, f.slot, walEnd).Scan(&done); err != nil {
			t.Fatal(err)
		}
		if done {
			break
		}
		if time.Since(began) > 15*time.Minute {
			t.Fatalf("the live relay did not drain %d events in 15m\n%s", rows, liveOut.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	drain := time.Since(began)
	t.Logf("the live relay drained the same %d events in %s: %.0f events/s; replay/live throughput %.2f",
		rows, drain.Round(time.Millisecond), float64(rows)/drain.Seconds(), drain.Seconds()/took.Seconds())

	// Pages of 1,000 small rows: the heap stays small whatever the selection.
	if rss > 96 {
		t.Errorf("peak RSS %.1f MiB; want at most 96 MiB: memory must not grow with the selection", rss)
	}
}

// A replay process killed with SIGKILL half-way continues from its last
// acknowledged page when run again with the same id: nothing missing, at
// most one page sent twice.
func TestReplayKilledAndResumed(t *testing.T) {
	f := newFixture(t)
	f.insert(t, "Order", 1, 3000, time.Now().Add(-time.Hour))
	env := f.relayEnv(t)
	cmd := exec.Command(testenv.RelayBinary(t), "replay", "--id", "killed", "--batch", "100", "--rate", "2000")
	cmd.Env = env
	var out testenv.Output
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Killed 400 ms after its producer is up (at 2,000 events/s, under
	// half-way), not 700 ms after start: on a loaded machine the process
	// could still be starting then.
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out.String(), "kafka idempotent producer"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("replay's producer not up 30s after start\n%s", out.String())
		}
	}
	time.Sleep(400 * time.Millisecond)
	cmd.Process.Kill()
	cmd.Wait()
	before := count(f.read(t, f.prefix+"Order", "killed"))
	if before == 0 || before >= 3000 {
		t.Fatalf("%d events sent before the kill; want some, not all\n%s", before, out.String())
	}
	res, _ := relay(t, env, "replay", "--id", "killed", "--batch", "100")
	if !strings.Contains(res, "resuming after") {
		t.Errorf("the second run does not say it resumes:\n%s", res)
	}
	got := f.read(t, f.prefix+"Order", "killed")
	dups := resumed(t, got, 3000)
	if dups > 100 {
		t.Errorf("%d events sent twice; want at most one page (100)", dups)
	}
	t.Logf("killed after %d of 3000 events; resumed: all delivered, %d sent twice", before, dups)
}
