package ops_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestLagLostSlot makes the fixture's slot lost on the real server (a small
// max_slot_wal_keep_size, then WAL and a CHECKPOINT) and checks that lag
// reports it as such: wal_status lost, the real setting, no "caught up", and
// a *SlotLostError (exit 1). Every slot on the server older than the
// fixture's would be lost too: the test holds testenv.Exclusive (no other
// test uses the server meanwhile) and refuses to run when a slot it does not
// own could be hit; the setting is restored in t.Cleanup.
func TestLagLostSlot(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	ctx := context.Background()
	su := testenv.SuperuserConn(t, f.dsn)
	var others []string
	rows, err := su.Query(ctx, `SELECT slot_name FROM pg_replication_slots WHERE slot_name <> $1 AND wal_status <> 'lost'`, f.cfg.Slot)
	if err != nil {
		t.Fatal(err)
	}
	others, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(others) > 0 {
		t.Fatalf("other slots on the server would be invalidated too: %v; drop them or run this test on its own server", others)
	}
	var before string
	if err := su.QueryRow(ctx, "SELECT current_setting('max_slot_wal_keep_size')").Scan(&before); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := su.Exec(ctx, "ALTER SYSTEM RESET max_slot_wal_keep_size"); err != nil {
			t.Errorf("restore max_slot_wal_keep_size: %v", err)
		}
		su.Exec(ctx, "SELECT pg_reload_conf()")
	})
	// A checkpoint with everything delivered: the lag would be "caught up".
	f.insertEvents(t, 1, time.Minute)
	f.exec(t, "INSERT INTO "+f.table("outbox_relay_checkpoint")+" (slot_name, lsn, last_commit_time) VALUES ($1, pg_current_wal_lsn(), now())", f.cfg.Slot)
	for _, s := range []string{"ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'", "SELECT pg_reload_conf()"} {
		if _, err := su.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, s := range []string{"SELECT pg_switch_wal()", "SELECT pg_logical_emit_message(false, 'h5ops', repeat('x', 100000))", "SELECT pg_switch_wal()", "CHECKPOINT"} {
			if _, err := su.Exec(ctx, s); err != nil {
				t.Fatalf("%s: %v", s, err)
			}
		}
		if r := f.lag(t); r.Slot.Lost() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot not lost after 30s of WAL switches and checkpoints")
		}
	}

	r := f.lag(t)
	if got := *r.Slot.WALStatus; got != ops.WALLost {
		t.Errorf("wal_status = %q; want lost", got)
	}
	if r.MaxSlotWALKeepSize != "1MB" || r.MaxSlotWALKeepSizeBytes == nil || *r.MaxSlotWALKeepSizeBytes != 1<<20 {
		t.Errorf("max_slot_wal_keep_size = %q, %v; want 1MB, 1048576", r.MaxSlotWALKeepSize, r.MaxSlotWALKeepSizeBytes)
	}
	if r.TimeLag.State == ops.StateCaughtUp {
		t.Errorf("time_lag.state = caught_up for a lost slot")
	}
	var out bytes.Buffer
	err = ops.RunLag(ctx, f.conn, f.cfg, &out, ops.LagOptions{})
	var lost *ops.SlotLostError
	if !errors.As(err, &lost) || exitcode.Of(err) != exitcode.Failure {
		t.Errorf("RunLag on a lost slot = %v (exit %d); want a *SlotLostError, exit %d", err, exitcode.Of(err), exitcode.Failure)
	}
	text := out.String()
	for _, want := range []string{"wal status       lost", "max_slot_wal_keep_size = 1MB", "LOST"} {
		if !strings.Contains(text, want) {
			t.Errorf("lag output lacks %q:\n%s", want, text)
		}
	}
	for _, bad := range []string{"caught up", "unlimited", "= -1"} {
		if strings.Contains(text, bad) {
			t.Errorf("lag output of a lost slot says %q:\n%s", bad, text)
		}
	}
	t.Logf("max_slot_wal_keep_size was %s; lag output:\n%s", before, text)
}

func TestPrintable(t *testing.T) {
	tests := []struct{ in, want string }{
		{"Order", "Order"},
		{"\x1b[2JOrder\r\a", `\x1b[2JOrder\r\a`},
		{"line\nnext\ttab", `line\nnext\ttab`},
		{"del\x7f c1\u0085 \u009b", `del\x7f c1\u0085 \u009b`},
		{"bad \xff\xfe utf8", `bad \xff\xfe utf8`},
		{"bidi \u202eevil\u2066 ls\u2028", `bidi \u202eevil\u2066 ls\u2028`},
		{"Bestellung é 注文 🙂", "Bestellung é 注文 🙂"},
		{`{"a":"b\n"} C:\x`, `{"a":"b\n"} C:\x`}, // backslashes are kept
	}
	for _, tt := range tests {
		if got := ops.Printable(tt.in); got != tt.want {
			t.Errorf("Printable(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	if got, want := ops.PrintableText("a\x1b\nb"), "a\\x1b\nb"; got != want {
		t.Errorf("PrintableText = %q; want %q", got, want)
	}
}

// TestTextEscapesControls: a walsender's application_name is set by the
// client; it reaches lag and status escaped.
func TestTextEscapesControls(t *testing.T) {
	s := activeSlot
	s.ApplicationName = ptr("evil\x1b[2J\r")
	var b strings.Builder
	if err := (&ops.StatusReport{SlotName: "outbox_relay", CheckedAt: now, Slot: s}).WriteText(&b); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(b.String(), "\x1b\r") || !strings.Contains(b.String(), `evil\x1b[2J\r`) {
		t.Errorf("status text = %q; want the controls escaped", b.String())
	}
}
