package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/event"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// runRetries runs `outbox-relay retries args...` in-process and returns the
// exit code and output. Until root.go registers the retries command, it
// registers it itself on a root built the same way.
func runRetries(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	root := newRootCmd(&o, &e)
	if c, _, err := root.Find([]string{"retries"}); err == nil && c.Name() == "retries" {
		return run(t, append([]string{"retries"}, args...)...)
	}
	wrap := func(fn func(cmd *cobra.Command, e *env, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			cfg, err := loadConfigFor("", cmd.Flags(), cmd.Annotations["kafka"] != "optional")
			if err != nil {
				return fmt.Errorf("%w: %w", errConfig, err)
			}
			return fn(cmd, &env{cfg: cfg, log: nil, stdout: cmd.OutOrStdout()}, args)
		}
	}
	root.AddCommand(newRetriesCmd(wrap))
	root.SetArgs(append([]string{"retries"}, args...))
	err := root.ExecuteContext(context.Background())
	switch {
	case err == nil:
		code = exitcode.OK
	case errors.Is(err, errConfig):
		code = exitcode.Usage
	default:
		code = exitcode.Failure
	}
	if err != nil && !errors.Is(err, errReported) {
		fmt.Fprintf(&e, "outbox-relay: %v\n", err)
	}
	return code, o.String(), e.String()
}

// retriesEnv creates the retry table in a fresh database with three rows:
// 1 pending (failed), 2 waiting behind it, 3 dead with a binary value.
func retriesEnv(t *testing.T) (*retry.Store, []retry.Entry) {
	t.Helper()
	dsn, slot := dbEnv(t)
	table, _ := sql.ParseTable(sql.DefaultRetryTable)
	testenv.ExecAs(t, dsn, sql.RetryTable(table)...)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := retry.NewStore(pool, "", slot)
	if err != nil {
		t.Fatal(err)
	}
	ev := func(key, id string) retry.Event {
		return retry.Event{EventKey: id, EventID: id, Aggregate: (event.Lane{Topic: "orders", Key: key}).String(),
			AggregateType: "Order", AggregateID: key, EventType: "Created", Topic: "orders",
			Key: []byte(key), Value: []byte(`{"n":1}`), Extra: []retry.Header{{Key: "id", Value: []byte(id)}},
			Reason: `topic "orders" does not exist and the relay does not create topics: create it`}
	}
	a1, a2, b1 := ev("A", "ev-a1"), ev("A", "ev-a2"), ev("B", "ev-b1")
	a1.Code = sink.CodeTopicNotCreated // b1 has none, as rows of earlier versions
	a2.Waiting, a2.Reason = true, "waiting behind ev-a1"
	b1.Permanent, b1.Value, b1.Reason = true, []byte{0xff, 0x00, 0x01}, "the message is larger than Kafka accepts"
	if err := s.Insert(context.Background(), []retry.Event{a1, a2, b1}); err != nil {
		t.Fatal(err)
	}
	entries, err := s.List(context.Background(), retry.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	return s, entries
}

func TestRetriesList(t *testing.T) {
	_, rows := retriesEnv(t)
	code, out, errOut := runRetries(t, "list")
	if code != exitcode.OK {
		t.Fatalf("retries list exit %d; stderr %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 {
		t.Fatalf("retries list printed %d lines; want header + 3:\n%s", len(lines), out)
	}
	testenv.WantLines(t, "retries list", lines[0], "SEQ", "EVENT ID", "AGGREGATE", "TOPIC", "STATUS", "ATTEMPTS", "NEXT ATTEMPT", "AGE", "LAST ERROR")
	for i, want := range [][]string{
		{fmt.Sprint(rows[0].Seq), "ev-a1", "orders/A", "pending", "due", `topic "orders" does not exist`},
		{fmt.Sprint(rows[1].Seq), "ev-a2", "waiting", "waiting behind ev-a1"},
		{fmt.Sprint(rows[2].Seq), "ev-b1", "orders/B", "dead", " - ", "larger than Kafka accepts"},
	} {
		testenv.WantLines(t, "retries list row", lines[i+1], want...)
	}

	code, out, _ = runRetries(t, "list", "--status", "dead", "--json")
	var got []map[string]any
	if err := json.Unmarshal([]byte(out), &got); code != exitcode.OK || err != nil {
		t.Fatalf("retries list --status dead --json = exit %d, %v:\n%s", code, err, out)
	}
	if len(got) != 1 || got[0]["event_id"] != "ev-b1" || got[0]["status"] != "dead" || got[0]["seq"] != float64(rows[2].Seq) {
		t.Errorf("retries list --status dead --json = %v; want ev-b1 only, dead", got)
	}

	if code, _, errOut := runRetries(t, "list", "--status", "stuck"); code != exitcode.Usage || !strings.Contains(errOut, "pending or dead") {
		t.Errorf("retries list --status stuck = exit %d, %q; want %d naming the choices", code, errOut, exitcode.Usage)
	}
}

func TestRetriesShow(t *testing.T) {
	_, rows := retriesEnv(t)
	code, out, errOut := runRetries(t, "show", "ev-a1")
	if code != exitcode.OK {
		t.Fatalf("retries show exit %d; stderr %s", code, errOut)
	}
	testenv.WantLines(t, "retries show", squeeze(out), fmt.Sprintf("seq: %d", rows[0].Seq), "status: pending",
		"topic: orders", `value: {"n":1}`, "key: A", "headers:\n id: ev-a1", "last error: topic",
		"create it (kafka.allow_auto_topic_creation is off)")

	code, out, _ = runRetries(t, "show", fmt.Sprint(rows[2].Seq))
	testenv.WantLines(t, "retries show of a binary value", squeeze(out), "value: (3 bytes, not UTF-8, hex) ff0001", "status: dead",
		"next attempt: none until requeued", "last error: the message is larger than Kafka accepts\n")

	code, out, _ = runRetries(t, "show", "ev-a1", "--json")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); code != exitcode.OK || err != nil {
		t.Fatalf("retries show ev-a1 --json = exit %d, %v:\n%s", code, err, out)
	}
	if got["reason_code"] != sink.CodeTopicNotCreated || !strings.HasSuffix(fmt.Sprint(got["last_error"]), "(kafka.allow_auto_topic_creation is off)") {
		t.Errorf("retries show ev-a1 --json: reason_code %v, last_error %v; want %q and the setting named", got["reason_code"], got["last_error"], sink.CodeTopicNotCreated)
	}
	if code != exitcode.OK {
		t.Errorf("retries show %d exit %d; want 0", rows[2].Seq, code)
	}

	code, _, errOut = runRetries(t, "show", "nope")
	if code != exitcode.Failure || !strings.Contains(errOut, "no event in the retry table with id nope") {
		t.Errorf("retries show nope = exit %d, %q; want 1 saying it does not exist", code, errOut)
	}
}

func TestRetriesRequeueDrop(t *testing.T) {
	s, rows := retriesEnv(t)
	ctx := context.Background()
	seq := func(i int) string { return fmt.Sprint(rows[i].Seq) }

	code, _, errOut := runRetries(t, "requeue", "ev-b1", "999999")
	if code != exitcode.Failure || !strings.Contains(errOut, "999999") {
		t.Errorf("retries requeue with a missing id = exit %d, %q; want 1 naming it", code, errOut)
	}
	if e, _ := s.Get(ctx, "ev-b1"); e.Status != retry.StatusDead {
		t.Errorf("after a refused requeue ev-b1 is %q; want still dead", e.Status)
	}

	code, out, errOut := runRetries(t, "requeue", "--all-dead")
	if want := "requeued 1 event: " + seq(2) + "\n"; code != exitcode.OK || out != want {
		t.Errorf("retries requeue --all-dead = exit %d, %q (%s); want %q", code, out, errOut, want)
	}
	code, out, _ = runRetries(t, "requeue", "--all-dead")
	if code != exitcode.OK || out != "no dead events to requeue\n" {
		t.Errorf("second retries requeue --all-dead = exit %d, %q; want none", code, out)
	}
	code, out, _ = runRetries(t, "requeue", seq(0), "ev-b1")
	if want := fmt.Sprintf("requeued 2 events: %s, %s\n", seq(0), seq(2)); code != exitcode.OK || out != want {
		t.Errorf("retries requeue = exit %d, %q; want %q", code, out, want)
	}
	if code, _, _ := runRetries(t, "requeue"); code != exitcode.Usage {
		t.Errorf("retries requeue without ids = exit %d; want %d", code, exitcode.Usage)
	}

	code, out, errOut = runRetries(t, "drop", "ev-a2")
	if code != exitcode.Usage || out != "" || !strings.Contains(errOut, "lost") || !strings.Contains(errOut, "--yes") {
		t.Errorf("retries drop without --yes = exit %d, %q, %q; want 2 (as checkpoint set without --yes) explaining the loss and --yes", code, out, errOut)
	}
	if _, err := s.Get(ctx, "ev-a2"); err != nil {
		t.Errorf("drop without --yes removed ev-a2: %v", err)
	}
	code, out, errOut = runRetries(t, "drop", "ev-a2", "--yes")
	if want := "dropped 1 event: " + seq(1) + "\n"; code != exitcode.OK || out != want {
		t.Errorf("retries drop --yes = exit %d, %q (%s); want %q", code, out, errOut, want)
	}
	if _, err := s.Get(ctx, "ev-a2"); !errors.Is(err, retry.ErrNotFound) {
		t.Errorf("after drop Get(ev-a2) error = %v; want ErrNotFound", err)
	}
	if code, _, errOut := runRetries(t, "drop", "ev-a2", "--yes"); code != exitcode.Failure || !strings.Contains(errOut, "ev-a2") {
		t.Errorf("dropping ev-a2 again = exit %d, %q; want 1 naming it", code, errOut)
	}
}

// TestRetriesOtherSlot: the retries commands see only the configured slot's
// rows. Another relay's (another slot sharing the table, with rows of the
// same ids) are not listed, shown, requeued or dropped.
func TestRetriesOtherSlot(t *testing.T) {
	_, rows := retriesEnv(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("RELAY_POSTGRES_DSN")) // retriesEnv's database
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	other, err := retry.NewStore(pool, "", "billing_relay")
	if err != nil {
		t.Fatal(err)
	}
	ev := func(id string) retry.Event {
		return retry.Event{EventKey: id, EventID: id, Aggregate: "billing/X", AggregateType: "Invoice", AggregateID: "X",
			EventType: "Issued", Topic: "billing", Key: []byte("X"), Value: []byte(`{"card":"4111"}`), Permanent: true, Reason: "too large"}
	}
	if err := other.Insert(ctx, []retry.Event{ev("ev-a1"), ev("ev-x1")}); err != nil {
		t.Fatal(err)
	}
	theirs, err := other.List(ctx, retry.Filter{})
	if err != nil || len(theirs) != 2 {
		t.Fatalf("other slot's rows = %d, %v; want 2", len(theirs), err)
	}

	code, out, errOut := runRetries(t, "list")
	if lines := strings.Split(strings.TrimSpace(out), "\n"); code != exitcode.OK || len(lines) != 4 || strings.Contains(out, "ev-x1") || strings.Contains(out, "billing") {
		t.Errorf("retries list = exit %d (%s):\n%s\nwant header + this slot's 3 rows, none of slot billing_relay", code, errOut, out)
	}
	for _, id := range []string{"ev-x1", fmt.Sprint(theirs[0].Seq)} {
		if code, _, errOut := runRetries(t, "show", id); code != exitcode.Failure || !strings.Contains(errOut, "no event in the retry table") {
			t.Errorf("retries show %s (a row of another slot) = exit %d, %q; want 1, not found", id, code, errOut)
		}
	}
	if code, out, _ := runRetries(t, "show", "ev-a1"); code != exitcode.OK || !strings.Contains(squeeze(out), fmt.Sprintf("seq: %d", rows[0].Seq)) {
		t.Errorf("retries show ev-a1 = exit %d:\n%s\nwant this slot's row %d", code, out, rows[0].Seq)
	}
	code, out, _ = runRetries(t, "requeue", "--all-dead")
	if want := fmt.Sprintf("requeued 1 event: %d\n", rows[2].Seq); code != exitcode.OK || out != want {
		t.Errorf("retries requeue --all-dead = exit %d, %q; want %q (not the other slot's dead rows)", code, out, want)
	}
	if code, _, _ := runRetries(t, "drop", fmt.Sprint(theirs[1].Seq), "--yes"); code != exitcode.Failure {
		t.Errorf("retries drop of another slot's row = exit %d; want 1, not found", code)
	}
	after, err := other.List(ctx, retry.Filter{Status: retry.StatusDead})
	if err != nil || len(after) != 2 {
		t.Errorf("other slot's dead rows after this slot's commands = %d, %v; want both, untouched", len(after), err)
	}
}

func TestRetriesNoTable(t *testing.T) {
	dbEnv(t)
	unsetenv(t, "RELAY_KAFKA_BROKERS") // not needed by retries
	code, _, errOut := runRetries(t, "list")
	if code != exitcode.Failure || !strings.Contains(errOut, "outbox-relay setup") {
		t.Errorf("retries list without the table = exit %d, %q; want 1 pointing at setup", code, errOut)
	}
}

// squeeze collapses runs of spaces, so that checks do not depend on column widths.
func squeeze(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
		if strings.HasPrefix(l, " ") {
			lines[i] = " " + lines[i]
		}
	}
	return strings.Join(lines, "\n")
}
