package cloudeventstest

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// repoRoot is the product module's directory: the tests run in this package's
// directory, cmd/outbox-relay/cloudeventstest.
var repoRoot = filepath.Join("..", "..", "..")

var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// relayBinary builds the command once per test binary, as users build it: in the
// product's module, with its go.mod and go.sum. Under -race the relay is built with
// -race too, as it ran under -race in-process when this test lived in cmd/outbox-relay.
var relayBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "outbox-relay-cloudevents")
	if err != nil {
		return "", err
	}
	binDir = dir
	bin := filepath.Join(dir, "outbox-relay")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "./cmd/outbox-relay")...)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", errors.New("go " + strings.Join(cmd.Args[1:], " ") + ": " + err.Error() + "\n" + string(out))
	}
	return bin, nil
})

// relay is the outbox-relay binary pointed at a fresh database and a slot of its
// own, configured through its environment alone.
type relay struct {
	dsn string
	env []string // RELAY_* settings, later ones winning
}

func newRelay(t *testing.T) *relay {
	t.Helper()
	dsn := testenv.Postgres(t).DSN
	return &relay{dsn: dsn, env: []string{
		"RELAY_POSTGRES_DSN=" + dsn,
		"RELAY_POSTGRES_SLOT=" + testenv.UniqueName(t, "relay_cmd"),
		// Setup never contacts Kafka: the address only satisfies validation.
		"RELAY_KAFKA_BROKERS=127.0.0.1:9",
		"RELAY_METRICS_LISTEN=",
	}}
}

// topic gives the test an aggregate type of its own (prefix and a unique suffix)
// and its topic in the test Kafka, created with one partition, and points the
// relay at that Kafka.
func (r *relay) topic(t *testing.T, prefix string) (aggType, topic string, k *testenv.KafkaCluster) {
	t.Helper()
	aggType = prefix + strings.ReplaceAll(testenv.UniqueName(t, ""), "_", "")
	topic = "outbox.event." + aggType
	k = testenv.Kafka(t)
	k.CreateTopic(t, topic, 1)
	r.env = append(r.env, "RELAY_KAFKA_BROKERS="+strings.Join(k.Brokers, ","))
	return aggType, topic, k
}

func (r *relay) command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	bin, err := relayBinary()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	// The test process's own RELAY_* variables (the dev servers' RELAY_POSTGRES_DSN,
	// RELAY_KAFKA_BROKERS) would configure the relay too: only r.env does.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RELAY_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, r.env...)
	return cmd
}

// mustRun runs the command to its end and fails the test unless it exits 0.
func (r *relay) mustRun(t *testing.T, args ...string) {
	t.Helper()
	if out, err := r.command(t, args...).CombinedOutput(); err != nil {
		t.Fatalf("outbox-relay %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// start starts `outbox-relay run`; stop sends SIGTERM and fails the test unless
// the relay drains and exits 0 within a minute.
func (r *relay) start(t *testing.T) (stop func(*testing.T)) {
	t.Helper()
	cmd := r.command(t, "run")
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		t.Logf("relay output:\n%s", out.String())
	})
	return func(t *testing.T) {
		t.Helper()
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			if err != nil {
				t.Fatalf("outbox-relay run after SIGTERM: %v; want exit 0 (a clean stop)", err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("outbox-relay run did not stop within a minute of SIGTERM")
		}
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
