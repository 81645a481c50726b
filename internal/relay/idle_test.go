package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// steps records saves and confirmations in the order they happen.
type steps struct {
	mu  sync.Mutex
	log []string
}

func (s *steps) add(format string, args ...any) {
	s.mu.Lock()
	s.log = append(s.log, fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

func (s *steps) Save(_ context.Context, lsn pglogrepl.LSN, _ time.Time) error {
	s.add("save %s", lsn)
	return nil
}

func (s *steps) Confirm(lsn pglogrepl.LSN) { s.add("confirm %s", lsn) }
func (s *steps) Restart()                  { s.add("restart") }

// TestIdlePositionSavedBeforeConfirmed: an idle position offered by the
// stream (replication.Config.Idle, wired to the committer by newTerm) is saved as the checkpoint and only then confirmed (DESIGN
// invariant 14: the checkpoint explains every position of the slot), and an
// offer below what is acknowledged changes nothing.
func TestIdlePositionSavedBeforeConfirmed(t *testing.T) {
	s := &steps{}
	log := slog.New(slog.DiscardHandler)
	cfg := Config{CheckpointInterval: time.Millisecond, MaxInFlightEvents: 10}
	win := newWindow(10, 1<<20)
	com := newCommitter(s, s, win, newHealth(time.Minute, log), newHistorian(noHistory{}, log, cfg), nil, log, cfg, 0x100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- com.run(ctx) }()

	com.idle(0x200)
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		n := len(s.log)
		s.mu.Unlock()
		if n >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	com.idle(0x180) // behind what is saved: nothing
	com.close()
	if err := <-done; err != nil {
		t.Fatalf("committer run = %v", err)
	}
	cancel()
	want := []string{"save 0/200", "confirm 0/200"}
	if fmt.Sprint(s.log) != fmt.Sprint(want) {
		t.Errorf("steps = %v; want %v", s.log, want)
	}
}
