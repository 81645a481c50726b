package debezium_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// TestLaunch runs the runner as a command does (outbox-bench): no testing.TB,
// the names given, the JVM's flags and extra properties as Options, and Close
// to end it.
func TestLaunch(t *testing.T) {
	t.Parallel()
	pg, k := servers(t)
	agg := testenv.UniqueName(t, "order")
	prefix := testenv.UniqueName(t, "launch")
	topic := prefix + "." + agg
	k.CreateTopic(t, topic, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	c, err := debezium.Launch(ctx, debezium.Options{
		DSN:         pg.DSN,
		Slot:        testenv.UniqueName(t, "dbz_slot"),
		Publication: testenv.UniqueName(t, "dbz_pub"),
		TopicPrefix: testenv.UniqueName(t, "dbz"),
		JVMFlags:    []string{"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xmx384m"},
		WorkerProps: map[string]string{"producer.linger.ms": "5"},
		Props: map[string]string{
			"max.batch.size": "4096",
			"transforms.outbox.route.topic.replacement": prefix + ".${routedByValue}",
		},
	}, k.Brokers, t.TempDir())
	if err != nil {
		t.Fatalf("Launch() error = %v", err)
	}
	defer c.Close()

	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(c.Pid()) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Split(string(cmdline), "\x00"); !slices.Contains(args, "-Xmx384m") || slices.Contains(args, "-Xmx512m") {
		t.Errorf("JVM arguments = %q; want Options.JVMFlags instead of the default", args)
	}
	for file, want := range map[string]string{c.WorkerFile(): "producer.linger.ms=5", c.ConnectorFile(): "max.batch.size=4096"} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("%s lacks %q:\n%s", file, want, b)
		}
	}

	insert(t, pg, []*event{{aggType: agg, aggID: "order-1", payloadIn: ptr(`{"n": 1}`)}})
	k.WaitMessages(t, topic, 1)
	if err := c.Failed(ctx); err != nil {
		t.Errorf("Failed() = %v; want nil while streaming", err)
	}
	if c.ProcessState() != nil {
		t.Error("ProcessState() is set while the JVM runs; want nil")
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	if st := c.ProcessState(); st == nil || st.UserTime() <= 0 {
		t.Errorf("ProcessState() after Close = %v; want the ended JVM's, with its CPU time", st)
	}
}

// TestLaunchNeedsNames checks the options Launch has no default for, without
// starting a JVM.
func TestLaunchNeedsNames(t *testing.T) {
	_, err := debezium.Launch(context.Background(), debezium.Options{DSN: "postgres://x@127.0.0.1:1/x"}, []string{"127.0.0.1:1"}, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "Slot, Publication and TopicPrefix") {
		t.Errorf("Launch() without names error = %v; want one naming Slot, Publication and TopicPrefix", err)
	}
	_, err = debezium.Launch(context.Background(), debezium.Options{}, nil, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "DSN") {
		t.Errorf("Launch() without a DSN error = %v; want one naming DSN", err)
	}
}
