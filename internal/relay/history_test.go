package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/replication"
)

// fakeHistory records what the historian writes. hang makes every Record
// block until its context ends; failFirst fails that many calls.
type fakeHistory struct {
	mu        sync.Mutex
	hang      bool
	failFirst int
	calls     int
	recorded  []pglogrepl.LSN
	at        []time.Time
}

func (f *fakeHistory) Record(ctx context.Context, slot string, lsn pglogrepl.LSN, commitTime time.Time) error {
	f.mu.Lock()
	f.calls++
	hang, fail := f.hang, f.calls <= f.failFirst
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	if fail {
		return errors.New("permission denied for table outbox_relay_checkpoint_history")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded = append(f.recorded, lsn)
	f.at = append(f.at, time.Now())
	return nil
}

func (f *fakeHistory) PruneHistory(context.Context, string, time.Duration, int) (int64, error) {
	return 0, nil
}

func (f *fakeHistory) snapshot() (calls int, recorded []pglogrepl.LSN, at []time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, append([]pglogrepl.LSN(nil), f.recorded...), append([]time.Time(nil), f.at...)
}

// TestHistoryNeverDelaysConfirm: with history writes that hang forever, the
// pipeline still saves and confirms every transaction.
func TestHistoryNeverDelaysConfirm(t *testing.T) {
	h := &fakeHistory{hang: true}
	p := startPipe(t, pipeConfig{history: h})
	var last pglogrepl.LSN
	for i := range 50 {
		last = p.send(t, txn{{"Order", "a", string(rune('a' + i%26))}}, 1)
	}
	p.waitConfirmed(t, last)
	if calls, _, _ := h.snapshot(); calls != 1 {
		t.Errorf("history writes started = %d; want 1 (hanging, the others wait for it)", calls)
	}
}

// TestHistorianPacesAndRetries: at most one row per interval, always the
// latest saved checkpoint, and a failed write is retried.
func TestHistorianPacesAndRetries(t *testing.T) {
	const interval = 100 * time.Millisecond
	f := &fakeHistory{failFirst: 1}
	cfg := Config{Replication: replication.Config{DSN: "unused", Slot: "s"}, HistoryInterval: interval, HistoryKeep: time.Hour}
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	h := newHistorian(f, slog.New(slog.DiscardHandler), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// Saves every 5ms for about 600ms.
	var lsn pglogrepl.LSN
	for range 120 {
		lsn += 0x10
		h.offer(lsn, time.Now())
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, rec, _ := f.snapshot(); len(rec) > 0 && rec[len(rec)-1] == lsn {
			break
		}
		if time.Now().After(deadline) {
			_, rec, _ := f.snapshot()
			t.Fatalf("recorded %v; want the last saved checkpoint %s recorded at last", rec, lsn)
		}
		time.Sleep(10 * time.Millisecond)
	}
	calls, rec, at := f.snapshot()
	// ~600ms of saves at one row per 100ms: about 7 writes, one of which
	// failed and was retried; never 120.
	if calls < 4 || calls > 10 {
		t.Errorf("history writes = %d over ~600ms at an interval of %s; want about 7", calls, interval)
	}
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < interval-10*time.Millisecond {
			t.Errorf("rows %d and %d recorded %s apart; want at least %s", i-1, i, gap, interval)
		}
		if rec[i] <= rec[i-1] {
			t.Errorf("recorded %s after %s; want ascending", rec[i], rec[i-1])
		}
	}
}
