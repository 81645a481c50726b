package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// setUp runs setup --create-outbox-table in the test's database.
func setUp(t *testing.T) {
	t.Helper()
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
}

// insertEvents inserts n events of aggregate type at, each in its own
// transaction, created age ago, and returns their ids.
func insertEvents(t *testing.T, dsn, at string, n int, age time.Duration) []string {
	t.Helper()
	var ids []string
	for range n {
		ids = append(ids, testenv.QueryString(t, dsn, `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at)
VALUES (gen_random_uuid(), $1, 'a-1', 'Created', '{"n": 1}', now() - make_interval(secs => $2)) RETURNING id::text`, at, age.Seconds()))
	}
	return ids
}

func walNow(t *testing.T, dsn string) pglogrepl.LSN {
	t.Helper()
	lsn, err := pglogrepl.ParseLSN(testenv.QueryString(t, dsn, `SELECT pg_current_wal_lsn()::text`))
	if err != nil {
		t.Fatal(err)
	}
	return lsn
}

// setUntilPrunable sets the checkpoint at the end of the WAL until prune
// --dry-run says want, for a minute, and returns prune's last exit code and
// output. Each set records a history row; the next one covers it, making a
// horizon. The history's snapshot_xmin is the oldest transaction on the
// whole server, which other tests' transactions may hold back: hence again.
func setUntilPrunable(t *testing.T, dsn, want string) (code int, out, errOut string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if code, out, errOut := run(t, "checkpoint", "set", walNow(t, dsn).String(), "--yes"); code != exitcode.OK {
			t.Fatalf("checkpoint set = exit %d\n%s%s", code, out, errOut)
		}
		code, out, errOut = run(t, "prune", "--dry-run")
		if strings.Contains(out, want) || time.Now().After(deadline) {
			return code, out, errOut
		}
	}
}

func TestCheckpointShowCmd(t *testing.T) {
	_, slot := dbEnv(t)
	setUp(t)
	code, out, errOut := run(t, "checkpoint", "show")
	if code != exitcode.OK {
		t.Fatalf("checkpoint show = exit %d\n%s%s", code, out, errOut)
	}
	testenv.WantLines(t, "checkpoint show", out,
		"slot               "+slot+" (inactive)",
		"checkpoint         none saved",
		"resumes at ",
		"history            no rows in outbox_relay_checkpoint_history for this slot",
		"retention horizon  none: no history row in outbox_relay_checkpoint_history has a snapshot_lsn the checkpoint")

	code, out, _ = run(t, "checkpoint", "show", "--json")
	var r map[string]any
	if err := json.Unmarshal([]byte(out), &r); code != exitcode.OK || err != nil {
		t.Fatalf("checkpoint show --json = exit %d, %q: %v", code, out, err)
	}
	for _, k := range []string{"slot_name", "checked_at", "checkpoint", "slot", "resume_lsn", "current_wal_lsn", "history", "retention_horizon", "retention_horizon_missing"} {
		if _, ok := r[k]; !ok {
			t.Errorf("checkpoint show --json lacks %q: %s", k, out)
		}
	}
	if h, _ := r["history"].(map[string]any); h == nil || h["count"] != 0.0 || h["table"] != "outbox_relay_checkpoint_history" {
		t.Errorf("checkpoint show --json: history = %v; want the table with 0 rows", r["history"])
	}
}

// TestCheckpointSet: the refusals, the plan without --yes, the move, and a
// relay that then starts there: the events before the new checkpoint are not
// delivered, those after it are.
func TestCheckpointSet(t *testing.T) {
	dsn, slot := dbEnv(t)
	setUp(t)
	aggType, topic, k := relayTopic(t, "CpSet")

	skipped := insertEvents(t, dsn, aggType, 4, 0)
	target := walNow(t, dsn)
	cpLSN := func() string {
		return testenv.QueryString(t, dsn, `SELECT coalesce((SELECT lsn::text FROM outbox_relay_checkpoint WHERE slot_name = $1), 'none')`, slot)
	}

	for _, tt := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"1/2/3"}, exitcode.Usage, `"1/2/3" is not a WAL position`},
		{[]string{"FFFFFFFF/0", "--yes"}, exitcode.Usage, "is beyond the server's current WAL position"},
		{[]string{target.String()}, exitcode.Usage, "checkpoint not moved: skipped events are never delivered"},
	} {
		code, out, errOut := run(t, append([]string{"checkpoint", "set"}, tt.args...)...)
		if code != tt.code || !strings.Contains(errOut, tt.want) {
			t.Errorf("checkpoint set %s = exit %d, %q; want %d saying %q\nstdout: %s", strings.Join(tt.args, " "), code, errOut, tt.code, tt.want, out)
		}
		if strings.HasPrefix(tt.args[0], target.String()) {
			testenv.WantLines(t, "checkpoint set without --yes", out, "new checkpoint  "+target.String(),
				"4 outbox events in 4 transactions (decoded from the slot, which does not move)")
		}
		if got := cpLSN(); got != "none" {
			t.Fatalf("checkpoint after a refused set = %s; want none saved", got)
		}
	}

	// While a relay (here: a replication connection) streams the slot.
	stop := holdSlot(t, dsn, slot)
	if code, _, errOut := run(t, "checkpoint", "set", target.String(), "--yes"); code != exitcode.Failure || !strings.Contains(errOut, "is active") || !strings.Contains(errOut, "stop it first") {
		t.Errorf("checkpoint set on an active slot = exit %d, %q; want %d saying to stop the relay first", code, errOut, exitcode.Failure)
	}
	stop()

	code, out, errOut := run(t, "checkpoint", "set", target.String(), "--yes")
	if code != exitcode.OK || !strings.Contains(out, "moved to "+target.String()) {
		t.Fatalf("checkpoint set --yes = exit %d\n%s%s", code, out, errOut)
	}
	if got := cpLSN(); got != target.String() {
		t.Errorf("checkpoint after set = %s; want %s", got, target)
	}
	if got := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM outbox_relay_checkpoint_history WHERE slot_name = $1 AND lsn = $2::pg_lsn AND last_commit_time IS NULL`, slot, target.String()); got != "1" {
		t.Errorf("history rows of the set = %s; want 1, without a commit time", got)
	}
	if code, _, errOut := run(t, "checkpoint", "set", "0/1", "--yes"); code != exitcode.Usage || !strings.Contains(errOut, "the checkpoint never moves back") {
		t.Errorf("checkpoint set backwards = exit %d, %q; want %d, never moves back", code, errOut, exitcode.Usage)
	}
	if code, out, _ := run(t, "checkpoint", "set", target.String()); code != exitcode.OK || !strings.Contains(out, "nothing to skip") {
		t.Errorf("checkpoint set at the checkpoint = exit %d, %q; want 0, nothing to skip", code, out)
	}

	// The next run starts there.
	delivered := insertEvents(t, dsn, aggType, 2, 0)
	r := envRelay(t, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("relay Run = %v; want context.Canceled", err)
		}
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if len(eventIDs(t, k, topic)) >= len(delivered) || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Second) // anything skipped that slipped through would be here by now
	got := eventIDs(t, k, topic)
	for _, id := range delivered {
		if got[id] == 0 {
			t.Errorf("event %s, committed after the new checkpoint, was not delivered", id)
		}
	}
	for _, id := range skipped {
		if got[id] > 0 {
			t.Errorf("event %s, committed before the new checkpoint, was delivered; want it skipped", id)
		}
	}
}

// holdSlot streams the slot over a replication connection, as a relay would,
// until the returned func is called.
func holdSlot(t *testing.T, dsn, slot string) func() {
	t.Helper()
	release := testenv.HoldSlot(t, dsn, slot, "outbox_relay", "")
	for deadline := time.Now().Add(10 * time.Second); testenv.QueryString(t, dsn, `SELECT active::text FROM pg_replication_slots WHERE slot_name = $1`, slot) != "true"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slot did not become active")
		}
	}
	return func() {
		release()
		for deadline := time.Now().Add(10 * time.Second); testenv.QueryString(t, dsn, `SELECT active::text FROM pg_replication_slots WHERE slot_name = $1`, slot) == "true"; time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the slot stayed active after its connection closed")
			}
		}
	}
}

// TestPrune: nothing without a horizon; a dry run counts and deletes
// nothing; a round deletes the covered, expired rows in batches and keeps
// the recent ones. The horizon comes from two checkpoint sets, as from two
// saves of a relay.
func TestPrune(t *testing.T) {
	dsn, _ := dbEnv(t)
	setUp(t)
	if code, _, errOut := run(t, "prune"); code != exitcode.Usage || !strings.Contains(errOut, "outbox.retention is off") {
		t.Errorf("prune with retention off = exit %d, %q; want %d saying it is off", code, errOut, exitcode.Usage)
	}
	t.Setenv("RELAY_OUTBOX_RETENTION", "1d")
	t.Setenv("RELAY_OUTBOX_RETENTION_BATCH_SIZE", "3")
	old := insertEvents(t, dsn, "Order", 7, 50*time.Hour)
	recent := insertEvents(t, dsn, "Order", 2, time.Hour)
	count := func() string { return testenv.QueryString(t, dsn, `SELECT count(*)::text FROM outbox`) }

	code, out, errOut := run(t, "prune", "--dry-run")
	if code != exitcode.OK {
		t.Fatalf("prune --dry-run = exit %d\n%s%s", code, out, errOut)
	}
	testenv.WantLines(t, "prune --dry-run without a checkpoint", out, "horizon ", " none: no history row in outbox_relay_checkpoint_history",
		"would delete ", " 0 rows: nothing may be deleted without a horizon (dry run)", "oldest expired ", ", older than 1d by 26h")

	code, out, _ = setUntilPrunable(t, dsn, " 7 rows older than 1d (dry run")
	testenv.WantLines(t, "prune --dry-run", out, "horizon ", " checkpoint ", "would delete ", " 7 rows older than 1d (dry run: nothing deleted)")
	if code != exitcode.OK || count() != "9" {
		t.Errorf("prune --dry-run = exit %d, %s rows left; want 0 and all 9", code, count())
	}

	code, out, errOut = run(t, "prune")
	if code != exitcode.OK {
		t.Fatalf("prune = exit %d\n%s%s", code, out, errOut)
	}
	testenv.WantLines(t, "prune", out, "  7 rows older than 1d in 3 batches of at most 3", "  no row older than 1d")
	if left := testenv.QueryString(t, dsn, `SELECT count(*)::text FROM outbox WHERE id = ANY($1::uuid[])`, recent); left != "2" || count() != "2" {
		t.Errorf("after prune: %s rows, %s of the recent ones; want only the 2 recent ones (deleted %v)", count(), left, old)
	}
	if code, out, _ := run(t, "prune", "--retention", "2h"); code != exitcode.OK || !strings.Contains(out, "  0 rows older than 2h in 1 batch of at most 3") {
		t.Errorf("prune --retention 2h over rows 1h old = exit %d, %q; want 0 deleted", code, out)
	}
}

// TestCheckpointPruneUsage: bad command lines exit 2 before connecting.
func TestCheckpointPruneUsage(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@127.0.0.1:9/app?connect_timeout=1")
	for _, args := range [][]string{
		{"checkpoint", "set"},
		{"checkpoint", "set", "1/2", "3/4"},
		{"checkpoint", "set", "1/2/3"},
		{"checkpoint", "set", "16/B374D848x"},
		{"checkpoint", "show", "extra"},
		{"checkpoint", "show", "--json=maybe"},
		{"prune"}, // retention off
		{"prune", "--retention", "soon"},
		{"prune", "--retention", "-1d"},
		{"prune", "extra"},
	} {
		if code, out, errOut := run(t, args...); code != exitcode.Usage {
			t.Errorf("outbox-relay %s = exit %d; want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, exitcode.Usage, out, errOut)
		}
	}
}

// TestLagAfterRestartNothingNew: a relay restarted with nothing new to send
// confirms idle WAL (other tables' writes) and saves the checkpoint without a
// commit time; lag must still say caught up and when the last delivered
// transaction committed (issue 37 item 10: it said "nothing delivered yet" and
// reported the age of the oldest row as a time lag).
func TestLagAfterRestartNothingNew(t *testing.T) {
	dsn, slot := dbEnv(t)
	setUp(t)
	aggType, topic, k := relayTopic(t, "Restart")
	t.Setenv("RELAY_POSTGRES_STATUS_INTERVAL", "1s")
	ids := insertEvents(t, dsn, aggType, 3, time.Minute)
	p := startRelay(t)
	waitDelivered(t, k, topic, ids, "before the restart")
	end := walNow(t, dsn)
	cpAt := func() pglogrepl.LSN {
		return mustParseLSN(t, testenv.QueryString(t, dsn, `SELECT coalesce(max(lsn), '0/0')::text FROM outbox_relay_checkpoint WHERE slot_name = $1`, slot))
	}
	for deadline := time.Now().Add(time.Minute); cpAt() < end; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the checkpoint did not cover the events within a minute")
		}
	}
	p.stop(t)
	saved := cpAt()

	// Restarted; only WAL of a table that is not published.
	p = startRelay(t)
	testenv.ExecAs(t, dsn, `CREATE TABLE not_published (x int)`, `INSERT INTO not_published SELECT generate_series(1, 1000)`)
	for deadline := time.Now().Add(time.Minute); cpAt() <= saved; time.Sleep(200 * time.Millisecond) {
		testenv.ExecAs(t, dsn, `INSERT INTO not_published VALUES (1)`)
		if time.Now().After(deadline) {
			t.Fatal("the restarted relay did not confirm idle WAL within a minute")
		}
	}
	p.stop(t)

	code, out, errOut := run(t, "lag", "--json")
	var rep struct {
		TimeLag struct {
			State                   string   `json:"state"`
			LastDeliveredAgeSeconds *float64 `json:"last_delivered_age_seconds"`
		} `json:"time_lag"`
		Checkpoint *struct {
			LastCommitTime *time.Time `json:"last_commit_time"`
		} `json:"checkpoint"`
	}
	if err := json.Unmarshal([]byte(out), &rep); code != exitcode.OK || err != nil {
		t.Fatalf("lag --json = exit %d, %v\n%s%s", code, err, out, errOut)
	}
	if rep.TimeLag.State != "caught_up" || rep.TimeLag.LastDeliveredAgeSeconds == nil || rep.Checkpoint == nil || rep.Checkpoint.LastCommitTime == nil {
		t.Errorf("lag after a restart with nothing new: time_lag %+v, checkpoint %+v; want caught_up, with the last delivered transaction's commit time\n%s", rep.TimeLag, rep.Checkpoint, out)
	}
	if _, text, _ := run(t, "lag"); strings.Contains(text, "nothing delivered yet") {
		t.Errorf("lag says nothing was delivered after a restart with nothing new:\n%s", text)
	}
}
