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
	testenv.ExecAs(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'big', 'a' || (i %% 10), 't', jsonb_build_object('s', repeat(md5(i::text), %d))
FROM generate_series(1, %d) i`, size/32, rows))
	end := testenv.QueryString(t, dsn, `SELECT pg_current_wal_lsn()::text`)
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

// TestRunMemoryBigEvent runs the binary with its default settings on one
// row of 50 MB, which Kafka refuses as too large (larger than
// kafka.batch_bytes): it passes alone, is stored dead in the retry table,
// and the relay's peak RSS stays within the documented bound for an event
// larger than the window: the event takes the window's place, 32 MiB + 2 ×
// the event + 32 MiB (159 MiB; issue 34's three copies peaked at 169 MiB).
func TestRunMemoryBigEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay binary on a row of 50 MB")
	}
	bin := testenv.RelayBinary(t)
	dsn, slot := dbEnv(t)
	cmd, stderr := startRelayAtDefaults(t, bin)
	idle := peakRSS(t, cmd.Process.Pid)

	const size = 50_000_000
	testenv.ExecAs(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'big', 'a', 't', jsonb_build_object('s', string_agg(md5(i::text), ''))
FROM generate_series(1, %d) i`, size/32))
	end := testenv.QueryString(t, dsn, `SELECT pg_current_wal_lsn()::text`)
	waitCheckpoint(t, dsn, slot, end, stderr, 2*time.Minute)
	if got := testenv.QueryString(t, dsn, `SELECT count(*) || ' ' || coalesce(min(status), '') || ' ' || coalesce(min(length(value)), 0) FROM outbox_relay_retry WHERE slot_name = $1`, slot); !strings.HasPrefix(got, "1 dead ") {
		t.Fatalf("retry rows (count, status, value length) = %q; want the one event, dead (too large for Kafka)", got)
	}
	peak := peakRSS(t, cmd.Process.Pid)
	t.Logf("peak RSS %d MiB (idle %d MiB) for one event of %d MB; bound %d MiB",
		peak>>20, idle>>20, size/1_000_000, memoryBound(size)>>20)
	if peak > memoryBound(size) {
		t.Errorf("peak RSS = %d MiB for one event of %d MB; want at most %d MiB (32 MiB + 2 × the event + 32 MiB)",
			peak>>20, size/1_000_000, memoryBound(size)>>20)
	}
}

// TestRunMemoryWaitingAggregates runs the binary with its default settings
// (but kafka.allow_auto_topic_creation false, so that a topic can be
// missing) on two events of each of many aggregates whose topic does not
// exist: every event waits in the retry table, more aggregates than the gate
// holds in memory. The peak RSS stays within the documented bound while they
// are parked and while they wait, and the waiting relay does not spin: its
// CPU time over the wait is a small part of one core. Issue 34's case is
// 100,000 aggregates (200,000 retry rows: 756 MiB peak and ~0.5 core, then
// 80 MiB with the gate's set still growing with them); `make test` runs
// 20,000 of them and `make test-faults` (RELAY_FAULTS=full) the 100,000.
func TestRunMemoryWaitingAggregates(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay binary on tens of thousands of events waiting for a missing topic")
	}
	aggregates, wait := 20_000, 15*time.Second
	if os.Getenv("RELAY_FAULTS") == "full" {
		aggregates, wait = 100_000, 20*time.Second
	}
	bin := testenv.RelayBinary(t)
	dsn, slot := dbEnv(t)
	t.Setenv("RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION", "false")
	cmd, stderr := startRelayAtDefaults(t, bin)
	idle := peakRSS(t, cmd.Process.Pid)

	testenv.ExecAs(t, dsn, fmt.Sprintf(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload)
SELECT gen_random_uuid(), 'missing', 'a' || (i %% %d), 't', jsonb_build_object('n', i)
FROM generate_series(1, %d) i`, aggregates, 2*aggregates))
	end := testenv.QueryString(t, dsn, `SELECT pg_current_wal_lsn()::text`)
	parkStart := time.Now()
	waitCheckpoint(t, dsn, slot, end, stderr, 3*time.Minute)
	parked := time.Since(parkStart)
	// Parking this many events is slow enough that, at the defaults, the
	// slot can retain half of postgres.max_retained_wal: the relay then
	// buffers the rest (the WAL buffer) and its drainer parks them from
	// there. Every event ends in the retry table, the buffer empty.
	want := fmt.Sprintf("%d rows, %d aggregates, 0 buffered", 2*aggregates, aggregates)
	var got string
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(time.Second) {
		got = testenv.QueryString(t, dsn, `SELECT count(*) || ' rows, ' || count(DISTINCT aggregate) || ' aggregates, ' ||
	(SELECT count(*) FROM outbox_relay_wal_buffer WHERE slot_name = $1) || ' buffered'
FROM outbox_relay_retry WHERE slot_name = $1 AND status = 'pending'`, slot)
		if got == want || time.Now().After(deadline) {
			break
		}
	}
	parked = time.Since(parkStart)
	if got != want {
		all := testenv.QueryString(t, dsn, `SELECT coalesce(string_agg(slot_name || '/' || status || ': ' || n, ', '), 'none') FROM (SELECT slot_name, status, count(*) n FROM outbox_relay_retry GROUP BY 1, 2) c`)
		buffered := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM outbox_relay_wal_buffer`)
		t.Fatalf("pending retry rows: %s; want %s (every event waiting for its topic); retry table: %s; WAL buffer: %s rows\n%s",
			got, want, all, buffered, lastLines(stderr.String(), 40))
	}
	parkedPeak := peakRSS(t, cmd.Process.Pid)

	cpu0 := cpuTime(t, cmd.Process.Pid)
	time.Sleep(wait)
	busy := cpuTime(t, cmd.Process.Pid) - cpu0
	peak := peakRSS(t, cmd.Process.Pid)
	window := relay.DefaultMaxInFlightBytes
	// Whether the relay buffered depends on how fast Postgres and the
	// relay park: said, so that a measurement says which case it is.
	buffered := strings.Contains(stderr.String(), "WAL buffer: buffering")
	t.Logf("%d aggregates, %d events parked in %s (WAL buffer used: %t): peak RSS %d MiB while parking, %d MiB after a wait of %s (idle %d MiB), CPU %s over the wait; bound %d MiB",
		aggregates, 2*aggregates, parked.Round(time.Second), buffered, parkedPeak>>20, peak>>20, wait, idle>>20, busy, memoryBound(window)>>20)
	if peak > memoryBound(window) {
		t.Errorf("peak RSS = %d MiB with %d aggregates waiting for a missing topic; want at most %d MiB (32 MiB + 2 × the %d MiB window + 32 MiB)",
			peak>>20, aggregates, memoryBound(window)>>20, window>>20)
	}
	if busy > wait/10 {
		t.Errorf("the relay used %s of CPU in %s while %d aggregates waited for a missing topic; want under a tenth of a core (%s)",
			busy, wait, aggregates, wait/10)
	}
	if !strings.Contains(stderr.String(), "than the relay holds in memory") {
		t.Errorf("the relay did not log that more aggregates wait than it holds in memory (%d of them wait)\nstderr:\n%s", aggregates, stderr.String())
	}
	if !strings.Contains(stderr.String(), "does not exist") {
		t.Errorf("the relay did not log that the topic does not exist\nstderr:\n%s", stderr.String())
	}
}

// cpuTime is the CPU time (user and system) the process has used, from
// /proc/<pid>/stat, whose clock ticks are USER_HZ: 100 a second on Linux.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatalf("read the relay's CPU time: %v", err)
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is field 3, utime 14 and stime 15.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %q: %v", pid, s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * (time.Second / 100)
}

// startRelayAtDefaults sets the relay up (outbox table, slot, tables) in the
// environment dbEnv made and starts `run` at its defaults, with topics of
// their own (none exists: the test creates those it needs), and waits for
// replication to start. GOMEMLIMIT, GOGC and GOMAXPROCS are left unset, as an
// operator runs it. The relay is stopped at the end of the test.
func startRelayAtDefaults(t *testing.T, bin string) (*exec.Cmd, *testenv.Output) {
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
	stderr, waited := startWaited(t, cmd)
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
func waitCheckpoint(t *testing.T, dsn, slot, lsn string, stderr *testenv.Output, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for testenv.QueryString(t, dsn, `SELECT (coalesce(max(lsn), '0/0') >= $2::pg_lsn)::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, slot, lsn) != "true" {
		if time.Now().After(deadline) {
			t.Fatalf("the checkpoint did not reach %s within %s\nstderr:\n%s", lsn, timeout, stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitLog waits until the relay's log holds s.
func waitLog(t *testing.T, log *testenv.Output, s string, timeout time.Duration) {
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

// lastLines is the end of a relay's log, for a failure's message.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
