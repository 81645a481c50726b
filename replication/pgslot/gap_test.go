package pgslot_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

func TestParseHistory(t *testing.T) {
	// The format of a timeline history file (pg_wal/00000003.history).
	content := "1\t0/3000158\tno recovery target specified\n\n# comment\n2\t0/5A000A0\tat restore point \"before\"\n"
	got, err := pgslot.ParseHistory([]byte(content))
	if err != nil {
		t.Fatal(err)
	}
	want := []pgslot.Fork{{Timeline: 1, End: lsn(t, "0/3000158")}, {Timeline: 2, End: lsn(t, "0/5A000A0")}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("ParseHistory = %v; want %v", got, want)
	}
	if _, err := pgslot.ParseHistory([]byte("x\t0/1\n")); err == nil {
		t.Errorf("ParseHistory of a bad line = nil error; want one")
	}
}

func lsn(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	l, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestVerify is the decision of DESIGN invariant 14, case by case. The
// timeline cases are tested here only: they need a standby to happen for
// real (issue 21, part 5).
func TestVerify(t *testing.T) {
	const sys, other = "7311111111111111111", "7322222222222222222"
	str := func(s string) *string { return &s }
	slot := func(confirmed string, walStatus string) pgslot.Slot {
		return pgslot.Slot{Name: "s", ConfirmedFlushLSN: str(confirmed), WALStatus: str(walStatus)}
	}
	cp := func(at string, tli int32) checkpoint.Checkpoint {
		return checkpoint.Checkpoint{LSN: lsn(t, at), Server: checkpoint.Server{SystemID: sys, Timeline: tli}}
	}
	srv := func(id string, tli int32, forks ...pgslot.Fork) pgslot.Server {
		return pgslot.Server{Server: checkpoint.Server{SystemID: id, Timeline: tli}, Forks: forks, History: true}
	}
	legacy := checkpoint.Checkpoint{LSN: lsn(t, "0/5000000")} // saved by a version that recorded no server
	tests := []struct {
		name   string
		cp     checkpoint.Checkpoint
		slot   pgslot.Slot
		srv    pgslot.Server
		want   pgslot.Cause // "" no gap
		range_ string
	}{
		{"no checkpoint yet", checkpoint.Checkpoint{}, slot("0/9000000", "reserved"), srv(sys, 1), "", ""},
		{"slot at the checkpoint", cp("0/5000000", 1), slot("0/5000000", "reserved"), srv(sys, 1), "", ""},
		{"slot behind: a crash lost its position", cp("0/5000000", 1), slot("0/4000000", "reserved"), srv(sys, 1), "", ""},
		{"slot ahead: recreated", cp("0/5000000", 1), slot("0/9000000", "reserved"), srv(sys, 1), pgslot.CauseSlotAhead, "0/5000000..0/9000000"},
		{"slot ahead of a legacy checkpoint: not judged", legacy, slot("0/9000000", "reserved"), srv(sys, 1), "", ""},
		{"slot invalidated", cp("0/5000000", 1), slot("0/5000000", "lost"), srv(sys, 1), pgslot.CauseSlotLost, "0/5000000.."},
		{"another system", cp("0/5000000", 1), slot("0/1000000", "reserved"), srv(other, 1), pgslot.CauseOtherSystem, "0/5000000..0/1000000"},
		{"system unknown (legacy row)", legacy, slot("0/5000000", "reserved"), srv(other, 1), "", ""},
		{"promoted after the checkpoint", cp("0/5000000", 1), slot("0/5000000", "reserved"),
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/6000000")}), "", ""},
		{"promoted exactly at the checkpoint", cp("0/5000000", 1), slot("0/5000000", "reserved"),
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/5000000")}), "", ""},
		{"two promotions, the first after the checkpoint", cp("0/5000000", 1), slot("0/5000000", "reserved"),
			srv(sys, 3, pgslot.Fork{Timeline: 1, End: lsn(t, "0/6000000")}, pgslot.Fork{Timeline: 2, End: lsn(t, "0/7000000")}), "", ""},
		{"forked before the checkpoint", cp("0/5000000", 1), slot("0/4800000", "reserved"),
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/4000000")}), pgslot.CauseForked, "0/5000000..0/4800000"},
		{"checkpoint from a later timeline: an old primary brought back", cp("0/5000000", 2), slot("0/5000000", "reserved"),
			srv(sys, 1), pgslot.CauseForked, "0/5000000..0/5000000"},
		{"a sibling timeline", cp("0/5000000", 2), slot("0/5000000", "reserved"),
			srv(sys, 3, pgslot.Fork{Timeline: 1, End: lsn(t, "0/4000000")}), pgslot.CauseForked, "0/5000000..0/5000000"},
		{"timeline changed, history not read: not judged", cp("0/5000000", 1), slot("0/5000000", "reserved"),
			pgslot.Server{Server: checkpoint.Server{SystemID: sys, Timeline: 2}}, "", ""},
		{"slot missing: dropped, or a failover", cp("0/5000000", 1), pgslot.Slot{Missing: true}, srv(sys, 1), pgslot.CauseSlotMissing, "0/5000000.."},
		{"slot missing, no checkpoint: setup's to say", checkpoint.Checkpoint{}, pgslot.Slot{Missing: true}, srv(sys, 1), "", ""},
		{"slot missing after a promotion after the checkpoint", cp("0/5000000", 1), pgslot.Slot{Missing: true},
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/6000000")}), pgslot.CauseSlotMissing, "0/5000000.."},
		{"slot missing on another system", cp("0/5000000", 1), pgslot.Slot{Missing: true}, srv(other, 1), pgslot.CauseOtherSystem, "0/5000000.."},
		{"slot missing on a fork before the checkpoint", cp("0/5000000", 1), pgslot.Slot{Missing: true},
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/4000000")}), pgslot.CauseForked, "0/5000000.."},
		{"promoted after the checkpoint, and the slot recreated", cp("0/5000000", 1), slot("0/9000000", "reserved"),
			srv(sys, 2, pgslot.Fork{Timeline: 1, End: lsn(t, "0/6000000")}), pgslot.CauseSlotAhead, "0/5000000..0/9000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.slot.Name = "s"
			err := pgslot.Verify(tt.cp, tt.slot, tt.srv)
			var gap *pgslot.GapError
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Verify = %v; want nil", err)
			case tt.want == "":
				return
			case !errors.As(err, &gap):
				t.Fatalf("Verify = %v; want a *GapError with cause %s", err, tt.want)
			}
			if gap.Cause != tt.want || gap.Range() != tt.range_ {
				t.Errorf("Verify = cause %s, range %s; want %s, %s", gap.Cause, gap.Range(), tt.want, tt.range_)
			}
			if !errors.Is(err, pgslot.ErrGap) || exitcode.Of(err) != exitcode.Gap {
				t.Errorf("Verify error: errors.Is ErrGap %v, exit code %d; want true, %d", errors.Is(err, pgslot.ErrGap), exitcode.Of(err), exitcode.Gap)
			}
			// The message names the range and what fixes it (the command
			// line names the command: cmd/outbox-relay's hints).
			msg := err.Error()
			fix := "replay by time"
			if tt.want.Refillable() {
				fix = "refill the range"
			}
			if !strings.Contains(msg, tt.range_) || !strings.Contains(msg, fix) {
				t.Errorf("Verify error %q: want the range %s and %q", msg, tt.range_, fix)
			}
		})
	}
}

func TestGapFix(t *testing.T) {
	at := time.Date(2026, 11, 24, 10, 30, 15, 0, time.UTC)
	ahead := &pgslot.GapError{Slot: "s", Cause: pgslot.CauseSlotAhead, From: 0x5000000, To: 0x9000000, LastCommitTime: at}
	for _, want := range []string{"refill the range", "re-deliver from the outbox table", "refill_id"} {
		if !strings.Contains(ahead.Fix(), want) {
			t.Errorf("Fix() = %q; want it to contain %q", ahead.Fix(), want)
		}
	}
	// On another system the history's LSNs mean nothing: by time, a minute
	// early (created_at is the transaction's start).
	other := &pgslot.GapError{Slot: "s", Cause: pgslot.CauseOtherSystem, From: 0x5000000, LastCommitTime: at}
	if want := "replay by time the events committed since 2026-11-24T10:29:15Z"; !strings.Contains(other.Fix(), want) {
		t.Errorf("Fix() = %q; want it to contain %q", other.Fix(), want)
	}
}
