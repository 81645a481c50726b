package checkpoint_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

func TestStart(t *testing.T) {
	tests := []struct {
		name                            string
		saved, slotConfirmed, requested pglogrepl.LSN
		want                            pglogrepl.LSN
		wantBackwards                   bool
	}{
		{"fresh slot, nothing saved", 0, 0, 0, 0, false},
		{"nothing saved yet", 0, 0x100, 0, 0x100, false},
		{"checkpoint ahead: slot went back in a crash", 0x300, 0x100, 0, 0x300, false},
		{"slot ahead: keepalive confirmed while idle", 0x100, 0x300, 0, 0x300, false},
		{"requested forward skip", 0x100, 0x100, 0x500, 0x500, false},
		{"requested at slot position", 0x300, 0x100, 0x100, 0x100, false},
		{"requested between slot and checkpoint replays", 0x300, 0x100, 0x200, 0x200, false},
		{"requested behind slot", 0x300, 0x200, 0x100, 0, true},
		{"requested behind slot, nothing saved", 0, 0x200, 0x1, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := checkpoint.Start(tt.saved, tt.slotConfirmed, tt.requested)
			var be *checkpoint.BackwardsError
			if tt.wantBackwards {
				if !errors.As(err, &be) {
					t.Fatalf("Start(%s, %s, %s) = %s, %v; want *BackwardsError", tt.saved, tt.slotConfirmed, tt.requested, got, err)
				}
				if be.Requested != tt.requested || be.SlotConfirmed != tt.slotConfirmed {
					t.Errorf("BackwardsError = %+v; want requested %s, slot %s", be, tt.requested, tt.slotConfirmed)
				}
				for _, want := range []string{tt.requested.String(), tt.slotConfirmed.String(), "re-insert"} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not mention %q", err, want)
					}
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Start(%s, %s, %s) = %s, %v; want %s", tt.saved, tt.slotConfirmed, tt.requested, got, err, tt.want)
			}
		})
	}
}

func newStore(t *testing.T, table string) *checkpoint.Store {
	t.Helper()
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	tbl, err := sql.ParseTable(table)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, sql.CheckpointTable(tbl)); err != nil {
		t.Fatalf("create checkpoint table: %v", err)
	}
	return checkpoint.New(pool, table)
}

func TestSaveLoad(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, "public.outbox_relay_checkpoint")

	if _, err := s.Load(ctx, "s1"); !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Fatalf("Load(%q) before any save: error = %v; want ErrNoCheckpoint", "s1", err)
	}

	commit := time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)
	lsn := pglogrepl.LSN(0x1_0000_2A10) // upper half non-zero: exercises the text format
	before := time.Now()
	if err := s.Save(ctx, "s1", lsn, commit); err != nil {
		t.Fatalf("Save: %v", err)
	}
	got, err := s.Load(ctx, "s1")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got.LSN != lsn || !got.LastCommitTime.Equal(commit) {
		t.Errorf("Load(%q) = %s, %s; want %s, %s", "s1", got.LSN, got.LastCommitTime, lsn, commit)
	}
	if got.SavedAt.Before(before.Add(-time.Minute)) || got.SavedAt.After(time.Now().Add(time.Minute)) {
		t.Errorf("SavedAt = %s; want about now", got.SavedAt)
	}

	// A zero commit time is stored as NULL and comes back zero.
	if err := s.Save(ctx, "s2", 0x10, time.Time{}); err != nil {
		t.Fatalf("Save: %v", err)
	}
	if got, err := s.Load(ctx, "s2"); err != nil || got.LSN != 0x10 || !got.LastCommitTime.IsZero() {
		t.Errorf("Load(%q) = %+v, %v; want LSN 0/10 and zero commit time", "s2", got, err)
	}
	// Slots are independent.
	if got, _ := s.Load(ctx, "s1"); got.LSN != lsn {
		t.Errorf("Load(%q) after saving s2 = %s; want %s", "s1", got.LSN, lsn)
	}
}

func TestSaveNeverBackwards(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, "outbox_relay_checkpoint")
	t1 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	steps := []struct {
		lsn  pglogrepl.LSN
		want pglogrepl.LSN
	}{
		{0x200, 0x200},
		{0x100, 0x200}, // behind: ignored
		{0x200, 0x200}, // equal: ignored
		{0x300, 0x300},
		{0, 0x300},
	}
	var wantCommit time.Time
	for i, st := range steps {
		commit := t1.Add(time.Duration(i) * time.Second)
		if err := s.Save(ctx, "slot", st.lsn, commit); err != nil {
			t.Fatalf("Save(%s): %v", st.lsn, err)
		}
		got, err := s.Load(ctx, "slot")
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if got.LSN != st.want {
			t.Errorf("after Save(%s): Load = %s; want %s", st.lsn, got.LSN, st.want)
		}
		if st.lsn == st.want && (i == 0 || steps[i-1].want < st.want) {
			wantCommit = commit // moved forward: the commit time moves with it
		}
		if !got.LastCommitTime.Equal(wantCommit) {
			t.Errorf("after Save(%s): LastCommitTime = %s; want %s", st.lsn, got.LastCommitTime, wantCommit)
		}
	}
}

func TestSaveConcurrent(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, "outbox_relay_checkpoint")
	const writers, saves = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*saves)
	for w := range writers {
		wg.Go(func() {
			// Interleaved, each writer's LSNs ascending, different writers'
			// crossing: the maximum must win whatever the order.
			for i := range saves {
				lsn := pglogrepl.LSN(1 + i*writers + (writers-1-w)*3)
				if err := s.Save(ctx, "slot", lsn, time.Now()); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("Save: %v", err)
	}
	want := pglogrepl.LSN(1 + (saves-1)*writers + (writers-1)*3)
	if got, err := s.Load(ctx, "slot"); err != nil || got.LSN != want {
		t.Errorf("Load after concurrent saves = %s, %v; want %s", got.LSN, err, want)
	}
}

func TestBadTable(t *testing.T) {
	s := checkpoint.New(nil, "a.b.c")
	if err := s.Save(context.Background(), "slot", 1, time.Time{}); err == nil || !strings.Contains(err.Error(), "a.b.c") {
		t.Errorf("Save with table %q: error = %v; want one naming the table", "a.b.c", err)
	}
	if _, err := s.Load(context.Background(), "slot"); err == nil || errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Errorf("Load with table %q: error = %v; want a table-name error", "a.b.c", err)
	}
}

func TestMissingTable(t *testing.T) {
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	// A missing table must not look like "nothing saved": the relay would
	// then start from the slot alone and lose its dedup floor silently.
	s := checkpoint.New(pool, "no_such_table")
	if _, err := s.Load(ctx, "slot"); err == nil || errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Errorf("Load from a missing table: error = %v; want an error other than ErrNoCheckpoint", err)
	}
}
