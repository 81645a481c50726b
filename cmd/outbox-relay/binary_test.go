package main

import (
	"bytes"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// buildBinary builds the command as users get it.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "outbox-relay")
	cmd := exec.Command("go", "build", "-ldflags", "-X main.version=v9.9.9-test", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestBinary(t *testing.T) {
	cleanEnv(t)
	bin := buildBinary(t)

	t.Run("version", func(t *testing.T) {
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil {
			t.Fatalf("outbox-relay version: %v\n%s", err, out)
		}
		for _, want := range []string{"outbox-relay v9.9.9-test", runtime.Version()} {
			if !strings.Contains(string(out), want) {
				t.Errorf("outbox-relay version = %q; want it to contain %q", out, want)
			}
		}
	})

	t.Run("run with a bad config connects nowhere", func(t *testing.T) {
		// One listener stands for both Postgres and Kafka: any connection
		// attempt would be accepted and counted.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		var accepted atomic.Int32
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		addr := ln.Addr().String()
		cmd := exec.Command(bin, "run", "--log-format", "json")
		cmd.Env = append(cmd.Environ(),
			"RELAY_POSTGRES_DSN=postgres://relay:hunter2@"+addr+"/app",
			"RELAY_KAFKA_BROKERS="+addr,
			"RELAY_KAFKA_COMPRESSION=brotli")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err = cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitcode.Usage {
			t.Errorf("outbox-relay run with a bad config: %v; want exit code %d", err, exitcode.Usage)
		}
		if !strings.Contains(stderr.String(), "kafka.compression") {
			t.Errorf("stderr = %q; want it to name kafka.compression", stderr.String())
		}
		if strings.Contains(stderr.String()+stdout.String(), "hunter2") {
			t.Errorf("output contains the password: %q", stderr.String()+stdout.String())
		}
		time.Sleep(50 * time.Millisecond) // let a late dial land, if any
		if n := accepted.Load(); n != 0 {
			t.Errorf("connections made before the config error = %d; want 0", n)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("run took %s to reject its config; want it at once", d)
		}
	})

	t.Run("run exits 0 on SIGTERM", func(t *testing.T) {
		dbEnv(t) // the binary inherits the test's environment
		t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
		t.Setenv("RELAY_METRICS_LISTEN", "")
		if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
			t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
		}
		cmd := exec.Command(bin, "run")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // past start-up: connected and streaming
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- cmd.Wait() }()
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("outbox-relay run after SIGTERM: %v; want exit 0\nstderr:\n%s", err, stderr.String())
			}
		case <-time.After(45 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("outbox-relay run did not stop within 45s of SIGTERM\nstderr:\n%s", stderr.String())
		}
		if !strings.Contains(stderr.String(), "msg=starting") {
			t.Errorf("stderr lacks the start-up line:\n%s", stderr.String())
		}
	})

	t.Run("bad flag value", func(t *testing.T) {
		cmd := exec.Command(bin, "run", "--start-lsn", "nonsense")
		cmd.Env = append(cmd.Environ(), "RELAY_POSTGRES_DSN=postgres://relay@127.0.0.1:9/app", "RELAY_KAFKA_BROKERS=127.0.0.1:9")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != exitcode.Usage || !strings.Contains(string(out), "--start-lsn") {
			t.Errorf("run --start-lsn nonsense = %v, %q; want exit %d naming --start-lsn", err, out, exitcode.Usage)
		}
	})
}

// startWaited starts cmd with its stderr in an Output the test reads while
// cmd writes it, and returns that and a channel that receives cmd.Wait's
// result once (a reader that takes it and leaves cmd to others puts it back).
func startWaited(t *testing.T, cmd *exec.Cmd) (*testenv.Output, chan error) {
	t.Helper()
	stderr := &testenv.Output{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	return stderr, waited
}
