package relay_test

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// These tests run the outbox-relay binary, because only a process can be
// killed with SIGKILL, and SIGTERM handling lives in cmd/.

// proc is a running outbox-relay process.
type proc struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan error
}

const processWindow = 2000 // pipeline.max_in_flight_events for the process tests

func (f *fixture) startProcess(t *testing.T) *proc {
	t.Helper()
	return f.startProcessWith(t, []string{"run"}, "RELAY_TOPICS_TEMPLATE="+f.prefix+".{aggregate_type}")
}

// startProcessWith runs the relay with args and the fixture's settings,
// then env.
func (f *fixture) startProcessWith(t *testing.T, args []string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(testenv.RelayBinary(t), args...)
	cmd.Env = append(append(os.Environ(),
		"RELAY_POSTGRES_DSN="+f.pg.DSN,
		"RELAY_POSTGRES_SLOT="+f.slot,
		"RELAY_POSTGRES_PUBLICATION="+f.pub,
		"RELAY_POSTGRES_STATUS_INTERVAL=1s",
		"RELAY_KAFKA_BROKERS="+joinComma(f.kafka.Brokers),
		"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS="+strconv.Itoa(processWindow),
		"RELAY_CHECKPOINT_INTERVAL=100ms",
		"RELAY_METRICS_LISTEN=",
		"RELAY_LOG_FORMAT=json",
	), env...)
	return f.runProcess(t, cmd)
}

// runProcess starts cmd, killing it at the end of the test if it runs.
func (f *fixture) runProcess(t *testing.T, cmd *exec.Cmd) *proc {
	t.Helper()
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start outbox-relay: %v", err)
	}
	p := &proc{cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("outbox-relay output:\n%s", out.String())
		}
	})
	return p
}

func joinComma(s []string) string {
	out := ""
	for i, v := range s {
		if i > 0 {
			out += ","
		}
		out += v
	}
	return out
}

// producer inserts transactions of n events until stop is closed.
func (f *fixture) produce(t *testing.T, txns, n int, pause time.Duration) int {
	total := 0
	for range txns {
		f.insertTx(t, f.makeEvents(n))
		total += n
		time.Sleep(pause)
	}
	return total
}

// TestSIGTERMMidStream stops the relay with SIGTERM while it streams: it must
// exit 0 after draining, and a restarted relay must deliver the rest with no
// duplicate and no loss.
func TestSIGTERMMidStream(t *testing.T) {
	f := newFixture(t)
	p := f.startProcess(t)
	total := f.produce(t, 30, 200, 0)
	f.waitCount(t, 1, time.Minute) // streaming: it has delivered something
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("outbox-relay after SIGTERM: %v; want exit status 0\n%s", err, p.out.String())
		}
	case <-time.After(45 * time.Second):
		t.Fatalf("outbox-relay did not exit within 45s of SIGTERM\n%s", p.out.String())
	}
	total += f.produce(t, 10, 200, 0)
	f.startProcess(t)
	f.waitCount(t, total, 2*time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	rep := f.check(t, f.readAll(t))
	if rep != (report{}) {
		t.Fatalf("after SIGTERM and restart: lost %d, duplicates %d, order violations %d, mismatches %d; want 0: %s",
			rep.lost, rep.duplicates, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
}

// TestSIGKILLMidStream kills the relay with SIGKILL three times while it
// streams. Nothing may be lost, order must hold, and duplicates may only come
// from the in-flight window: at most max_in_flight_events per kill.
func TestSIGKILLMidStream(t *testing.T) {
	f := newFixture(t)
	total := 0
	const kills = 3
	for range kills {
		p := f.startProcess(t)
		total += f.produce(t, 20, 250, 0)
		time.Sleep(200 * time.Millisecond)
		p.cmd.Process.Kill()
		<-p.done
	}
	f.startProcess(t)
	f.waitCount(t, total, 3*time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	got := f.readAll(t)
	rep := f.check(t, got)
	if rep.lost != 0 || rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Fatalf("after %d SIGKILLs: lost %d, order violations %d, mismatches %d; want 0: %s",
			kills, rep.lost, rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	if bound := kills * processWindow; rep.duplicates > bound {
		t.Fatalf("after %d SIGKILLs: %d duplicates; want at most %d (max_in_flight_events %d per kill)",
			kills, rep.duplicates, bound, processWindow)
	}
	t.Logf("%d events, %d SIGKILLs, %d duplicates (bound %d)", total, kills, rep.duplicates, kills*processWindow)
}
