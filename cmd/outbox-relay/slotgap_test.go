package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// relayProcess is `outbox-relay run` in this process, with the
// environment's configuration.
type relayProcess struct {
	cancel context.CancelFunc
	done   chan error
}

func startRelay(t *testing.T) *relayProcess {
	t.Helper()
	r := envRelay(t, slog.New(slog.NewTextHandler(tLog{t}, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	p := &relayProcess{cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Errorf("relay did not stop within a minute")
		}
	})
	return p
}

// envRelay builds the relay of the environment's configuration as run
// does, logging to log. Its sinks are closed when the test ends, after a
// relay the test stopped in a cleanup registered later: cleanups run last
// first.
func envRelay(t *testing.T, log *slog.Logger) *relay.Relay {
	t.Helper()
	cfg, err := loadConfig("", newRootCmd(nil, nil).PersistentFlags())
	if err != nil {
		t.Fatal(err)
	}
	r, closeSinks, err := newRelay(cfg.relayConfig(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeSinks)
	return r
}

// stop stops the relay cleanly (drain, final checkpoint).
func (p *relayProcess) stop(t *testing.T) {
	t.Helper()
	p.cancel()
	if err := <-p.done; !errors.Is(err, context.Canceled) {
		t.Fatalf("relay Run after cancel = %v; want context.Canceled", err)
	}
	p.done <- context.Canceled // for the cleanup
}

type tLog struct{ t *testing.T }

func (w tLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// relayTopic gives the test an aggregate type of its own (prefix and a unique
// suffix) and its topic in the test Kafka, created with one partition, and
// points the relay of this process (startRelay, run) at that Kafka with the
// metrics listener off, as every end-to-end test of a relay here needs.
func relayTopic(t *testing.T, prefix string) (aggType, topic string, k *testenv.KafkaCluster) {
	t.Helper()
	aggType = prefix + strings.ReplaceAll(uniqueName(t, ""), "_", "")
	topic = "outbox.event." + aggType
	k = testenv.Kafka(t)
	k.CreateTopic(t, topic, 1)
	t.Setenv("RELAY_KAFKA_BROKERS", strings.Join(k.Brokers, ","))
	t.Setenv("RELAY_METRICS_LISTEN", "")
	return aggType, topic, k
}

// eventIDs counts the messages of topic by their id header.
func eventIDs(t *testing.T, k *testenv.KafkaCluster, topic string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, m := range k.ReadAll(t, topic) {
		for _, h := range m.Headers {
			if h.Key == "id" {
				got[string(h.Value)]++
			}
		}
	}
	return got
}

// waitDelivered waits until every id is in topic.
func waitDelivered(t *testing.T, k *testenv.KafkaCluster, topic string, ids []string, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got := eventIDs(t, k, topic)
		var missing []string
		for _, id := range ids {
			if got[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d of %d events not in %s after a minute: %v", what, len(missing), len(ids), topic, missing)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// withHistory is a relay process on a database just set up, recording
// checkpoint history every second (what a refill or replay maps the
// checkpoint with), past its first events.
type withHistory struct {
	dsn, slot, aggType, topic string
	k                         *testenv.KafkaCluster
	first                     []string // three events, delivered
	p                         *relayProcess
}

// startWithHistory sets up, starts the relay on events of an aggregate
// type and topic of the test's own (named after prefix), and waits for its
// first events in Kafka (what names them in the failure).
func startWithHistory(t *testing.T, prefix, what string) *withHistory {
	t.Helper()
	h := &withHistory{}
	h.dsn, h.slot = dbEnv(t)
	setUp(t)
	h.aggType, h.topic, h.k = relayTopic(t, prefix)
	t.Setenv("RELAY_CHECKPOINT_HISTORY_INTERVAL", "1s")
	h.first = insertEvents(t, h.dsn, h.aggType, 3, 0)
	h.p = startRelay(t)
	waitDelivered(t, h.k, h.topic, h.first, what)
	return h
}

// checkSays runs check until its output contains want, for a minute, and
// returns that output.
func checkSays(t *testing.T, want string) string {
	t.Helper()
	var out string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		_, out, _ = run(t, "check")
		if strings.Contains(out, want) {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("check never said %q within a minute; last:\n%s", want, out)
		}
	}
}

// TestSlotRecreatedWhileStopped is issue 21's scenario (d): the slot is
// dropped while the relay is stopped, events are committed, and setup
// creates the slot again. run must refuse to stream on past the events
// committed in between, naming the range and the fix; check, lag and status
// must say the same; and the printed fix must deliver every event (lost 0,
// read back from Kafka).
func TestSlotRecreatedWhileStopped(t *testing.T) {
	// Delivered, and covered by a history entry (what replay --from-lsn
	// maps the checkpoint with), then a clean stop.
	h := startWithHistory(t, "Gap", "before the slot was dropped")
	dsn, slot, aggType, topic, k, before, p := h.dsn, h.slot, h.aggType, h.topic, h.k, h.first, h.p
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		_, out, _ := run(t, "checkpoint", "show", "--json")
		var show struct {
			Horizon *struct{} `json:"retention_horizon"`
		}
		if json.Unmarshal([]byte(out), &show) == nil && show.Horizon != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no history entry covered by the checkpoint within a minute:\n%s", out)
		}
	}
	p.stop(t)
	checkpointAt := testenv.QueryString(t, dsn, `SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, slot)

	// The operator drops the slot; events are committed; setup recreates it.
	testenv.ExecAs(t, dsn, "SELECT pg_drop_replication_slot('"+slot+"')")
	lost := insertEvents(t, dsn, aggType, 4, 0)
	setUp(t)
	slotAt := testenv.QueryString(t, dsn, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot)
	after := insertEvents(t, dsn, aggType, 2, 0)
	rng := checkpointAt + ".." + slotAt

	// run refuses, with the range, the cause and the commands.
	r := envRelay(t, slog.New(slog.NewTextHandler(tLog{t}, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	runErr := r.Run(ctx)
	cancel()
	var gap *pgslot.GapError
	if !errors.As(runErr, &gap) || exitcode.Of(runErr) != exitcode.Gap {
		t.Fatalf("run = %v (exit %d); want a refusal with exit %d", runErr, exitcode.Of(runErr), exitcode.Gap)
	}
	// As the operator reads it: the error, then the command line's fix.
	msg := runErr.Error() + "\n" + hint(runErr)
	t.Logf("run refused: %s", msg)
	for _, want := range []string{rng, "dropped and created again", "\"outbox-relay recover\"", "postgres.on_slot_loss: refill"} {
		if !strings.Contains(msg, want) {
			t.Errorf("run error lacks %q:\n%s", want, msg)
		}
	}
	if got := eventIDs(t, k, topic); len(got) != len(before) {
		t.Errorf("%d events in Kafka after the refused run; want the %d delivered before (nothing streamed past the gap)", len(got), len(before))
	}

	// check, lag and status say the same.
	code, out, errOut := run(t, "check")
	if code != exitcode.Failure || !strings.Contains(out, "FAIL  slot continuity: run refuses slot "+slot) || !strings.Contains(out, rng) {
		t.Errorf("check = exit %d; want %d and a failed slot continuity line naming %s\n%s%s", code, exitcode.Failure, rng, out, errOut)
	}
	code, out, errOut = run(t, "lag")
	if code != exitcode.Gap || !strings.Contains(out, "SLOT GAP") || !strings.Contains(out, rng) {
		t.Errorf("lag = exit %d; want %d and SLOT GAP naming %s\n%s%s", code, exitcode.Gap, rng, out, errOut)
	}
	_, out, _ = run(t, "lag", "--json")
	var lag struct {
		SlotGap *struct {
			Cause string `json:"cause"`
		} `json:"slot_gap"`
	}
	if err := json.Unmarshal([]byte(out), &lag); err != nil || lag.SlotGap == nil || lag.SlotGap.Cause != string(pgslot.CauseSlotAhead) {
		t.Errorf("lag --json slot_gap = %+v, %v; want cause %s\n%s", lag.SlotGap, err, pgslot.CauseSlotAhead, out)
	}
	if code, out, _ := run(t, "status"); code != exitcode.Gap || !strings.Contains(out, "SLOT GAP") || !strings.Contains(out, rng) {
		t.Errorf("status = exit %d; want %d and SLOT GAP naming %s\n%s", code, exitcode.Gap, rng, out)
	}

	// The printed fix, as printed: first what it would do, then do it.
	m := regexp.MustCompile(`"outbox-relay (recover)"`).FindStringSubmatch(msg)
	if m == nil {
		t.Fatalf("run error lacks \"outbox-relay recover\":\n%s", msg)
	}
	code, out, errOut = run(t, "recover", "--dry-run")
	if code != exitcode.OK || !strings.Contains(out, string(pgslot.CauseSlotAhead)) || !strings.Contains(out, checkpointAt) {
		t.Fatalf("recover --dry-run = exit %d; want 0, the cause and the checkpoint %s\n%s%s", code, checkpointAt, out, errOut)
	}
	t.Logf("recover --dry-run: %s", out)
	if got := eventIDs(t, k, topic); len(got) != len(before) {
		t.Errorf("%d events in Kafka after recover --dry-run; want %d (it sends nothing)", len(got), len(before))
	}
	recovering := time.Now()
	code, out, errOut = run(t, m[1])
	if code != exitcode.OK || !strings.Contains(out, "refill ") {
		t.Fatalf("outbox-relay recover = exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("recover: %s (%s)", strings.TrimSpace(out), time.Since(recovering).Round(time.Millisecond))
	// recover itself delivered what the new slot will not: every event
	// committed before it ran.
	got := eventIDs(t, k, topic)
	for _, id := range append(append([]string{}, lost...), after...) {
		if got[id] == 0 {
			t.Errorf("event %s, committed before recover, is not in Kafka after it", id)
		}
	}
	refilled := 0
	for _, m := range k.ReadAll(t, topic) {
		for _, h := range m.Headers {
			if h.Key == "refill_id" {
				refilled++
			}
		}
	}
	if refilled < len(lost)+len(after) {
		t.Errorf("%d messages with the header refill_id; want at least the %d refilled", refilled, len(lost)+len(after))
	}
	if _, out, _ := run(t, "status"); !strings.Contains(out, "LAST REFILL") || !strings.Contains(out, "slot_ahead") {
		t.Errorf("status after recover lacks the LAST REFILL line with the cause:\n%s", out)
	}
	if code, out, errOut := run(t, "recover"); code != exitcode.OK || !strings.Contains(out, "nothing to refill") {
		t.Errorf("recover again = exit %d; want 0 and nothing to refill\n%s%s", code, out, errOut)
	}
	if code, out, _ := run(t, "check"); !strings.Contains(out, "ok    slot continuity") {
		t.Errorf("check after the fix = exit %d; want slot continuity ok\n%s", code, out)
	}

	// The relay streams on; nothing is lost.
	later := insertEvents(t, dsn, aggType, 2, 0)
	p = startRelay(t)
	all := append(append(append(append([]string{}, before...), lost...), after...), later...)
	waitDelivered(t, k, topic, all, "after the fix")
	p.stop(t)
	got = eventIDs(t, k, topic)
	dups := 0
	for _, n := range got {
		dups += n - 1
	}
	// The refill re-sends from the history entry at or before the
	// checkpoint: duplicates, bounded by one history interval.
	t.Logf("lost 0 of %d events; %d duplicates (refilled events delivered before the checkpoint)", len(all), dups)
	if len(got) != len(all) {
		t.Errorf("%d distinct events in Kafka; want %d", len(got), len(all))
	}
}

// TestCheckSlotRefill: check says whether a lost slot could be refilled:
// a warning before a history row is at or before the checkpoint, ok once
// one is, and a warning when rows are deleted from the outbox without
// retention (an application deleting in the same transaction, or a purge
// job): a refill could only re-send the rows still there.
func TestCheckSlotRefill(t *testing.T) {
	h := startWithHistory(t, "Refill", "first events")
	out := checkSays(t, "ok    slot refill: a lost slot can be refilled")
	t.Logf("%s", out)
	h.p.stop(t)

	// The application deletes a row itself: the outbox is no record.
	testenv.ExecAs(t, h.dsn, "DELETE FROM outbox WHERE id = '"+h.first[0]+"'")
	out = checkSays(t, "warn  slot refill: rows are deleted from")
	if !strings.Contains(out, "outbox.retention") {
		t.Errorf("check's warning does not name outbox.retention:\n%s", out)
	}
}

// TestSlotMissingSaysRecover: the slot dropped (or left behind by a
// failover) after the relay delivered from it. lag, status and check name
// the gap (slot_missing, exit 4) and recover, not setup; recover heals it.
func TestSlotMissingSaysRecover(t *testing.T) {
	h := startWithHistory(t, "Missing", "before the slot was dropped")
	dsn, slot, aggType, topic, k, p := h.dsn, h.slot, h.aggType, h.topic, h.k, h.p
	checkSays(t, "ok    slot refill")
	p.stop(t)
	testenv.ExecAs(t, dsn, "SELECT pg_drop_replication_slot('"+slot+"')")
	lost := insertEvents(t, dsn, aggType, 2, 0)

	for _, cmd := range []string{"lag", "status"} {
		code, out, errOut := run(t, cmd)
		if code != exitcode.Gap || !strings.Contains(out+errOut, "slot_missing") && !strings.Contains(out+errOut, "does not exist, though the checkpoint") || !strings.Contains(out+errOut, "outbox-relay recover") {
			t.Errorf("%s = exit %d; want %d naming the missing slot and recover\n%s%s", cmd, code, exitcode.Gap, out, errOut)
		}
	}
	// --json prints the report, with the gap and the checkpoint, before
	// exiting 4 (issue 37: it printed nothing).
	for _, cmd := range []string{"lag", "status"} {
		code, out, errOut := run(t, cmd, "--json")
		var rep struct {
			SlotGap *struct {
				Cause string `json:"cause"`
				Fix   string `json:"fix"`
			} `json:"slot_gap"`
			Checkpoint *struct {
				LSN string `json:"lsn"`
			} `json:"checkpoint"`
		}
		err := json.Unmarshal([]byte(out), &rep)
		if code != exitcode.Gap || err != nil || rep.SlotGap == nil || rep.SlotGap.Cause != string(pgslot.CauseSlotMissing) ||
			!strings.Contains(rep.SlotGap.Fix, "outbox-relay recover") || rep.Checkpoint == nil || rep.Checkpoint.LSN == "" {
			t.Errorf("%s --json = exit %d, %v; want %d and a JSON report with slot_gap.cause %s naming recover, and the checkpoint\nstdout:\n%s\nstderr:\n%s",
				cmd, code, err, exitcode.Gap, pgslot.CauseSlotMissing, out, errOut)
		}
	}
	if _, out, _ := run(t, "check"); !strings.Contains(out, "FAIL  slot continuity") || !strings.Contains(out, "outbox-relay recover") {
		t.Errorf("check: want a failed slot continuity naming recover\n%s", out)
	}
	if code, out, errOut := run(t, "recover"); code != exitcode.OK {
		t.Fatalf("recover = exit %d\n%s%s", code, out, errOut)
	}
	waitDelivered(t, k, topic, lost, "after recover")
}
