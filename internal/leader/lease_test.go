package leader

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// leaderBook is a Store in memory: the checkpoint row's epoch.
type leaderBook struct {
	mu       sync.Mutex
	epoch    int64
	verifies int
	fail     error // returned by Verify while set (an unreachable database)
}

func (b *leaderBook) TakeOver(_ context.Context, _, _ string, _ checkpoint.Server) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.epoch++
	return b.epoch, nil
}

func (b *leaderBook) Verify(_ context.Context, slot string, epoch int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.verifies++
	if b.fail != nil {
		return b.fail
	}
	if epoch != b.epoch {
		return &checkpoint.FencedError{Slot: slot, Epoch: epoch, Newest: b.epoch}
	}
	return nil
}

func (b *leaderBook) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.verifies
}

func newTestLease(b *leaderBook, dur time.Duration) *Lease {
	return New("s", "test", dur, slog.New(slog.DiscardHandler), b, nil, func() checkpoint.Server { return checkpoint.Server{} })
}

// A lease writes nothing before the stream holds the slot and the former
// leaders' leases ran out; then it writes without asking while its proof is
// fresh, asks once it is stale, and fails (fenced) once another relay took
// over.
func TestLease(t *testing.T) {
	ctx := t.Context()
	book := &leaderBook{epoch: 4} // four leaders before
	l := newTestLease(book, 200*time.Millisecond)
	taken := make(chan error, 1)
	go func() { taken <- l.Take(ctx) }()

	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := l.Check(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("check before the stream holds the slot = %v; want it to wait", err)
	}
	cancel()

	began := time.Now()
	l.Started()
	if err := <-taken; err != nil {
		t.Fatalf("take = %v", err)
	}
	if waited := time.Since(began); waited < 200*time.Millisecond {
		t.Errorf("take returned after %s; want it to wait out the lease (200ms) after fencing", waited)
	}
	if epoch, _ := l.Wait(ctx); epoch != 5 {
		t.Errorf("epoch = %d; want 5 (one above the former leaders')", epoch)
	}

	n := book.count()
	if err := l.Check(ctx); err != nil {
		t.Fatalf("check with a fresh proof = %v", err)
	}
	if book.count() != n {
		t.Errorf("check with a fresh proof asked the database; want no query")
	}

	time.Sleep(250 * time.Millisecond) // the proof goes stale
	if err := l.Check(ctx); err != nil {
		t.Fatalf("check with a stale proof, still leading = %v", err)
	}
	if book.count() != n+1 {
		t.Errorf("check with a stale proof made %d queries; want 1", book.count()-n)
	}

	// A successful fenced save is a proof too.
	time.Sleep(250 * time.Millisecond)
	l.proven(time.Now())
	n = book.count()
	if err := l.Check(ctx); err != nil || book.count() != n {
		t.Errorf("check after a save's proof = %v with %d queries; want nil, 0", err, book.count()-n)
	}

	// Another relay takes over while this one is frozen.
	book.TakeOver(ctx, "s", "rival", checkpoint.Server{})
	time.Sleep(250 * time.Millisecond)
	err := l.Check(ctx)
	var fe *checkpoint.FencedError
	if !errors.As(err, &fe) || fe.Newest != 6 || fe.Epoch != 5 {
		t.Errorf("check after a takeover = %v; want a *FencedError (ours 5, newest 6)", err)
	}
}

// While the database cannot say, a stale lease waits: no write on hope.
func TestLeaseUnreachable(t *testing.T) {
	book := &leaderBook{}
	l := newTestLease(book, 50*time.Millisecond)
	l.Started()
	if err := l.Take(t.Context()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	book.mu.Lock()
	book.fail = errors.New("connection refused")
	book.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if err := l.Check(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("check while the database is unreachable = %v; want it to keep waiting", err)
	}
	if book.count() < 2 {
		t.Errorf("%d verify attempts; want retries", book.count())
	}
}

// saveBook is a SaveStore in memory: what was saved and recorded, and
// whether the row holds a newer epoch.
type saveBook struct {
	mu      sync.Mutex
	saved   []pglogrepl.LSN
	servers []checkpoint.Server
	newer   int64 // a newer epoch in the row: saves are fenced
}

func (b *saveBook) SaveFenced(_ context.Context, slot string, epoch int64, lsn pglogrepl.LSN, _ time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.newer > epoch {
		return &checkpoint.FencedError{Slot: slot, Epoch: epoch, Newest: b.newer}
	}
	b.saved = append(b.saved, lsn)
	return nil
}

func (b *saveBook) RecordServer(_ context.Context, _ string, _ int64, srv checkpoint.Server) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.servers = append(b.servers, srv)
	return nil
}

// A lease's save is fenced by its epoch and proves leadership; the server
// is recorded with the checkpoint again only when the stream followed a
// promotion to a new timeline, once.
func TestLeaseSave(t *testing.T) {
	ctx := t.Context()
	book, saves := &leaderBook{}, &saveBook{}
	srv := checkpoint.Server{SystemID: "7", Timeline: 1}
	l := New("s", "test", 50*time.Millisecond, slog.New(slog.DiscardHandler), book, saves, func() checkpoint.Server { return srv })
	l.Started()
	if err := l.Take(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Save(ctx, 0x10, time.Now()); err != nil {
		t.Fatalf("save = %v", err)
	}
	srv.Timeline = 2 // a promotion the stream followed
	for _, lsn := range []pglogrepl.LSN{0x20, 0x30} {
		if err := l.Save(ctx, lsn, time.Now()); err != nil {
			t.Fatalf("save %s = %v", lsn, err)
		}
	}
	if want := []checkpoint.Server{{SystemID: "7", Timeline: 2}}; !slices.Equal(saves.servers, want) {
		t.Errorf("servers recorded = %v; want %v (the takeover recorded timeline 1)", saves.servers, want)
	}
	if want := []pglogrepl.LSN{0x10, 0x20, 0x30}; !slices.Equal(saves.saved, want) {
		t.Errorf("saved = %v; want %v", saves.saved, want)
	}

	time.Sleep(60 * time.Millisecond) // the proof goes stale
	if err := l.Save(ctx, 0x40, time.Now()); err != nil {
		t.Fatal(err)
	}
	n := book.count()
	if err := l.Check(ctx); err != nil || book.count() != n {
		t.Errorf("check after a save = %v with %d queries; want nil, 0 (the save proved leadership)", err, book.count()-n)
	}

	saves.newer = 2 // another relay took over
	if err := l.Save(ctx, 0x50, time.Now()); !errors.Is(err, checkpoint.ErrFenced) {
		t.Errorf("save after a takeover = %v; want checkpoint.ErrFenced", err)
	}
}
