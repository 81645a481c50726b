package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// memoryBound is the peak RSS docs/operating.md promises for events no larger
// than the window: the Go heap's soft limit (32 MiB + 2 × window, run.go's
// memoryLimit) and what is not heap (the binary, goroutine stacks, the
// runtime's own) within 32 MiB.
func memoryBound(window int) int64 { return memoryLimit(window) + 32<<20 }

// TestRunMemoryBound runs the binary with its default settings on one
// Postgres transaction of large rows, the shape of issue 34's (300 rows of
// 0.9 MB peaked at ~300 MB RSS, whatever pipeline.max_in_flight_bytes said:
// one row still in a Kafka write kept the rows decoded with it alive), and
// checks the kernel's high-water mark of its resident memory against the
// documented bound. GOMEMLIMIT and GOGC are left unset, as an operator runs it.
func TestRunMemoryBound(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay binary on 108 MB of rows")
	}
	bin := testenv.RelayBinary(t)
	dsn, slot := dbEnv(t)
	cmd, stderr := startRelayAtDefaults(t, bin)
	idle := peakRSS(t, cmd.Process.Pid)

	// 120 rows of 0.9 MB in one transaction: 108 MB, thirteen times the
	// default window.
	const rows, size = 120, 900_000
	execSQL(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'big', 'a' || (i %% 10), 't', jsonb_build_object('s', repeat(md5(i::text), %d))
FROM generate_series(1, %d) i`, size/32, rows))
	end := queryString(t, dsn, `SELECT pg_current_wal_lsn()::text`)
	waitCheckpoint(t, dsn, slot, end, stderr, 2*time.Minute)
	peak := peakRSS(t, cmd.Process.Pid)
	window := relay.DefaultMaxInFlightBytes
	t.Logf("peak RSS %d MiB (idle %d MiB) for %d rows of %d bytes in one transaction; bound %d MiB (window %d MiB)",
		peak>>20, idle>>20, rows, size, memoryBound(window)>>20, window>>20)
	if peak > memoryBound(window) {
		t.Errorf("peak RSS = %d MiB for one transaction of %d rows of %d bytes; want at most %d MiB (32 MiB + 2 × the %d MiB window + 32 MiB)",
			peak>>20, rows, size, memoryBound(window)>>20, window>>20)
	}
}

// bigEventBound is the peak RSS docs/operating.md promises with an event of
// size bytes larger than the window: the bound of events within the window,
// and bigEventCopies times the event.
func bigEventBound(window, size int) int64 {
	return memoryBound(window) + bigEventCopies*int64(size)
}

// bigEventCopies is how many copies of an event larger than the window the
// relay holds at once at most (docs/operating.md#memory).
const bigEventCopies = 2

// TestRunMemoryBigEvent runs the binary with its default settings on one
// row of 50 MB, which Kafka refuses as too large (larger than
// kafka.batch_bytes): it passes alone, is stored dead in the retry table,
// and the relay's peak RSS stays within the documented bound for an event
// larger than the window (issue 34: 169 MiB).
func TestRunMemoryBigEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay binary on a row of 50 MB")
	}
	bin := testenv.RelayBinary(t)
	dsn, slot := dbEnv(t)
	cmd, stderr := startRelayAtDefaults(t, bin)
	idle := peakRSS(t, cmd.Process.Pid)

	const size = 50_000_000
	execSQL(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'big', 'a', 't', jsonb_build_object('s', string_agg(md5(i::text), ''))
FROM generate_series(1, %d) i`, size/32))
	end := queryString(t, dsn, `SELECT pg_current_wal_lsn()::text`)
	waitCheckpoint(t, dsn, slot, end, stderr, 2*time.Minute)
	if got := queryString(t, dsn, `SELECT count(*) || ' ' || coalesce(min(status), '') || ' ' || coalesce(min(length(value)), 0) FROM outbox_relay_retry WHERE slot_name = $1`, slot); !strings.HasPrefix(got, "1 dead ") {
		t.Fatalf("retry rows (count, status, value length) = %q; want the one event, dead (too large for Kafka)", got)
	}
	peak := peakRSS(t, cmd.Process.Pid)
	window := relay.DefaultMaxInFlightBytes
	t.Logf("peak RSS %d MiB (idle %d MiB) for one event of %d MB; bound %d MiB",
		peak>>20, idle>>20, size/1_000_000, bigEventBound(window, size)>>20)
	if peak > bigEventBound(window, size) {
		t.Errorf("peak RSS = %d MiB for one event of %d MB; want at most %d MiB (the %d MiB bound + %d × the event)",
			peak>>20, size/1_000_000, bigEventBound(window, size)>>20, memoryBound(window)>>20, bigEventCopies)
	}
}

// startRelayAtDefaults sets the relay up (outbox table, slot, tables) in the
// environment dbEnv made and starts `run` at its defaults, with topics of
// their own (none exists: the test creates those it needs), and waits for
// replication to start. GOMEMLIMIT, GOGC and GOMAXPROCS are left unset, as an
// operator runs it. The relay is stopped at the end of the test.
func startRelayAtDefaults(t *testing.T, bin string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	t.Setenv("RELAY_METRICS_LISTEN", "")
	t.Setenv("RELAY_TOPICS_TEMPLATE", uniqueName(t, "mem")+".{aggregate_type}")
	unsetenv(t, "GOMEMLIMIT")
	unsetenv(t, "GOGC")
	unsetenv(t, "GOMAXPROCS")
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != 0 {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	cmd := exec.Command(bin, "run")
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(45 * time.Second):
			cmd.Process.Kill()
		}
	})
	waitLog(t, stderr, "replication started", 30*time.Second)
	return cmd, stderr
}

// waitCheckpoint waits until the relay's checkpoint reaches lsn: everything
// before it acknowledged by Kafka or stored in the retry table.
func waitCheckpoint(t *testing.T, dsn, slot, lsn string, stderr *syncBuffer, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for queryString(t, dsn, `SELECT (coalesce(max(lsn), '0/0') >= $2::pg_lsn)::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, slot, lsn) != "true" {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint did not reach %s within %s\nstderr:\n%s", lsn, timeout, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLog waits until the relay's log holds s.
func waitLog(t *testing.T, log *syncBuffer, s string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(log.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not log %q within %s\nstderr:\n%s", s, timeout, log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peakRSS is the process's VmHWM: the kernel's high-water mark of its
// resident memory, in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the relay's peak RSS: %v", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", pid)
	return 0
}
