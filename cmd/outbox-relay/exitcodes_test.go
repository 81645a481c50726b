package main

import (
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestExitCodes runs commands into the exit codes of docs/commands.md's
// table. Codes proven elsewhere, on the situations that need a set-up of their
// own: 4 by TestSlotRecreatedWhileStopped and TestSlotMissingSaysRecover (lag,
// status, their --json, run) and deploy's TestAlertsSlotLoss (run on SIGTERM
// while lingering on a gap); 5 by TestRecoverSaysRowsPruned and
// TestReplayFromLSNSaysPruned; 6 by internal/relay's
// TestExactlyOnceTransactionTimeout*; 2 for --yes by TestRetriesRequeueDrop
// and the checkpoint tests.
func TestExitCodes(t *testing.T) {
	dsn, _ := dbEnv(t)
	setUp(t)
	t.Setenv("RELAY_METRICS_LISTEN", "")
	// Committed and not delivered (no relay runs): the slot's lag is above
	// one byte.
	insertEvents(t, dsn, "exit", 1, 0)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{[]string{"status"}, nil, exitcode.OK},
		{[]string{"lag"}, nil, exitcode.OK},
		{[]string{"lag", "--max-bytes", "1"}, nil, exitcode.Threshold},
		{[]string{"lag", "--watch=10ms"}, nil, exitcode.Usage},
		{[]string{"no-such-command"}, nil, exitcode.Usage},
		{[]string{"status", "--json=maybe"}, nil, exitcode.Usage},
		{[]string{"lag"}, map[string]string{"RELAY_POSTGRES_DSN": "postgres://relay@127.0.0.1:9/app?connect_timeout=2"}, exitcode.Failure},
		{[]string{"status"}, map[string]string{"RELAY_POSTGRES_SLOT": uniqueName(t, "never_set_up")}, exitcode.Failure},
	} {
		name := strings.Join(tc.args, " ")
		t.Run(name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if code, out, errOut := run(t, tc.args...); code != tc.want {
				t.Errorf("outbox-relay %s = exit %d; want %d\nstdout:\n%s\nstderr:\n%s", name, code, tc.want, out, errOut)
			}
		})
	}
}

// TestRunSIGTERMDuringKafkaOutage: SIGTERM while Kafka cannot be reached
// (the relay points at a closed port, as a broker down looks to it) drains
// for pipeline.shutdown_timeout, cannot, and exits 1: what was not confirmed
// is delivered again on the next start (issue 37 item 8: docs said 0).
func TestRunSIGTERMDuringKafkaOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the relay binary")
	}
	bin := testenv.RelayBinary(t)
	dsn, _ := dbEnv(t)
	setUp(t)
	ln := freePort(t)
	t.Setenv("RELAY_KAFKA_BROKERS", ln)
	t.Setenv("RELAY_METRICS_LISTEN", "")
	t.Setenv("RELAY_PIPELINE_SHUTDOWN_TIMEOUT", "2s")
	cmd := exec.Command(bin, "run")
	stderr, waited := startWaited(t, cmd)
	defer func() {
		select {
		case <-waited:
		default:
			cmd.Process.Kill()
			<-waited
		}
	}()
	waitLog(t, stderr, "replication started", 30*time.Second)
	insertEvents(t, dsn, "outage", 3, 0)
	waitLog(t, stderr, "kafka unavailable", 30*time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		waited <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != exitcode.Failure {
			t.Errorf("run after SIGTERM during a Kafka outage: %v; want exit status %d\nstderr:\n%s", err, exitcode.Failure, stderr.String())
		}
		if !strings.Contains(stderr.String(), "delivered again on the next start") && !strings.Contains(stderr.String(), "sent again on the next start") {
			t.Errorf("stderr does not say the unconfirmed events are sent again:\n%s", stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("run did not exit within 30s of SIGTERM with a 2s drain budget\nstderr:\n%s", stderr.String())
	}
}

// freePort is a loopback address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	return testenv.FreeAddr(t)
}
