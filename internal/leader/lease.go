// Package leader is high availability, in one place: which of the relays
// of one slot leads, and the fence that keeps a former leader from writing.
//
// Election: the replication slot. Postgres lets one walsender hold a slot
// (pg_replication_slots.active_pid); START_REPLICATION on a held slot fails
// at once. So the relay whose START_REPLICATION succeeds leads, and the
// others stand by, polling the slot every StandbyPoll and racing for it when
// it is free. Nothing else has to be kept in step with the slot (an advisory
// lock or a lease row could say "leader" while another process streams).
// The slot is freed when the leader's walsender ends: at once when the
// leader's process dies (its sockets close), and after wal_sender_timeout
// (replication.Config.WalSenderTimeout, 10s by default) of silence when the
// leader freezes or loses its network.
//
// Fencing: a frozen leader may wake after a standby took over, with events
// in flight. Postgres and Kafka would accept its writes. So:
//
//   - The new leader, holding the slot, bumps the epoch in the slot's
//     checkpoint row (checkpoint.Store.TakeOver) and every checkpoint save is
//     conditional on it (SaveFenced): a former leader can never move the
//     checkpoint, and learns at its next save that it lost.
//   - A leader starts a Kafka or retry-table write only within LeaseDuration
//     of its last proof of leadership (a fenced save that succeeded, or a
//     Verify), measured on the monotonic clock from before the proof's
//     query. A process that froze wakes with an expired proof, asks the
//     database first, and learns that it lost before it writes anything.
//   - The new leader waits LeaseDuration after its TakeOver before its first
//     write: by then any former leader's last proof (which came before the
//     takeover) has expired, so the two never start writes in the same span.
//
// What is not fenced: a write the former leader started before its proof
// expired and that Kafka appends only later (a produce request held in a
// frozen process's socket buffer, or by a slow broker). Those are duplicates
// of events the new leader sends too, at most a write's worth (one chunk, up
// to kafka.batch_size events) per write path.
package leader

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
)

// ErrStandBy wraps the reasons a leader stands by again: the slot is held
// by another process, or the checkpoint row holds a newer epoch.
var ErrStandBy = errors.New("relay: another relay leads the slot")

// Defaults of the HA settings (Config.LeaseDuration, Config.StandbyPoll).
const (
	DefaultLeaseDuration = time.Second
	DefaultStandbyPoll   = 250 * time.Millisecond
)

// A Fence says whether this relay may start a write (to Kafka or the retry
// table): the term's Lease. Check returns nil while this relay leads,
// proven within the lease. It blocks until the term's epoch is taken, and
// while leadership cannot be proven (the database unreachable: no write on
// hope); it returns ctx's error, or one wrapping checkpoint.ErrFenced once
// another relay took over. Safe for concurrent use.
type Fence interface {
	Check(ctx context.Context) error
}

// A Saver saves the checkpoint of the term's slot: the Lease's
// Save, fenced by its epoch. Save blocks until the term's epoch is taken. It
// is durable when it returns nil, and proves leadership for the fence; an
// error wrapping checkpoint.ErrFenced means another relay leads and the term
// is over (the caller must not retry it); other errors may pass, and are
// retried by the committer. One goroutine calls it.
type Saver interface {
	Save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error
}

// Store is how the lease takes and proves leadership: checkpoint.Store's
// TakeOver (a new epoch in the slot's checkpoint row, fencing every former
// leader) and Verify (nil while epoch is the row's; a *checkpoint.FencedError
// once another relay took over). Safe for concurrent use.
type Store interface {
	TakeOver(ctx context.Context, slot, leader string, srv checkpoint.Server) (int64, error)
	Verify(ctx context.Context, slot string, epoch int64) error
}

// SaveStore is how the lease saves the checkpoint: checkpoint.Store's
// SaveFenced (durable when it returns nil; a *checkpoint.FencedError when the
// row holds a newer epoch, nothing saved) and RecordServer (the server whose
// WAL the saved positions are, under the same fence).
type SaveStore interface {
	SaveFenced(ctx context.Context, slot string, epoch int64, lsn pglogrepl.LSN, commitTime time.Time) error
	RecordServer(ctx context.Context, slot string, epoch int64, srv checkpoint.Server) error
}

// A Lease is one term's leadership: its epoch, once taken, and its last
// proof. It is the term's Fence (Check, before each write) and its
// Saver (Save).
type Lease struct {
	store Store
	saves SaveStore
	slot  string
	who   string
	dur   time.Duration
	log   *slog.Logger
	// server is the server the stream holds the slot on, recorded with the
	// epoch: the checkpoint's positions are that server's WAL.
	server func() checkpoint.Server

	startedOnce sync.Once
	startedC    chan struct{} // closed when the stream first holds the slot
	takenC      chan struct{} // closed when epoch is set and the wait is over

	mu       sync.Mutex
	epoch    int64
	provenAt time.Time         // zero: never proven
	recorded checkpoint.Server // the server the checkpoint row names, as this term last recorded it
}

func New(slot, who string, dur time.Duration, log *slog.Logger, store Store, saves SaveStore, server func() checkpoint.Server) *Lease {
	return &Lease{slot: slot, who: who, dur: dur, log: log, store: store, saves: saves, server: server,
		startedC: make(chan struct{}), takenC: make(chan struct{})}
}

// Started is the stream's Started hook: START_REPLICATION succeeded.
func (l *Lease) Started() { l.startedOnce.Do(func() { close(l.startedC) }) }

// Take waits until the stream holds the slot, then fences every former
// leader (a new epoch) and waits out their leases. Until it returns, Check
// blocks: nothing is written before it.
func (l *Lease) Take(ctx context.Context) error {
	select {
	case <-l.startedC:
	case <-ctx.Done():
		return ctx.Err()
	}
	var epoch int64
	if err := backoff.Persist(ctx, l.log, "take over the slot (new epoch)", func() error {
		var err error
		srv := l.server()
		epoch, err = l.store.TakeOver(ctx, l.slot, l.who, srv)
		if err == nil {
			l.mu.Lock()
			l.recorded = srv
			l.mu.Unlock()
		}
		return err
	}); err != nil {
		return err
	}
	t := time.NewTimer(l.dur)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
	l.mu.Lock()
	l.epoch = epoch
	l.mu.Unlock()
	if err := l.Verify(ctx); err != nil {
		return err
	}
	l.log.Info("leading: holding the slot, former leaders fenced", "slot", l.slot, "epoch", epoch, "leader", l.who)
	close(l.takenC)
	return nil
}

// Taken sets the epoch of a takeover done by the caller, which waited out
// the former leaders' leases (a refill): writes may start.
func (l *Lease) Taken(epoch int64) {
	l.mu.Lock()
	l.epoch = epoch
	l.mu.Unlock()
	close(l.takenC)
}

// Wait returns the epoch once Take (or Taken) is done.
func (l *Lease) Wait(ctx context.Context) (int64, error) {
	select {
	case <-l.takenC:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, nil
}

// Current returns the epoch without waiting: false until Take (or Taken)
// is done.
func (l *Lease) Current() (int64, bool) {
	select {
	case <-l.takenC:
	default:
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, true
}

// Check returns nil when this relay may start a write now: it leads, proven
// within the lease. Otherwise it asks the database (retrying while it is
// unreachable) and returns an error wrapping checkpoint.ErrFenced when
// another relay took over.
func (l *Lease) Check(ctx context.Context) error {
	if _, err := l.Wait(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	fresh := time.Since(l.provenAt) < l.dur
	l.mu.Unlock()
	if fresh {
		return nil
	}
	return l.Verify(ctx)
}

// Verify asks the database whether this term still leads (retrying while
// it is unreachable): nil is a proof for Check, an error wrapping
// checkpoint.ErrFenced says that another relay took over.
func (l *Lease) Verify(ctx context.Context) error {
	l.mu.Lock()
	epoch := l.epoch
	l.mu.Unlock()
	return backoff.RetryIf(ctx, l.log, "verify leadership before writing", func(err error) bool {
		return !errors.Is(err, checkpoint.ErrFenced)
	}, func() error {
		at := time.Now()
		if err := l.store.Verify(ctx, l.slot, epoch); err != nil {
			return err
		}
		l.proven(at)
		return nil
	})
}

// Server is the server the stream holds the slot on (the New's server).
func (l *Lease) Server() checkpoint.Server { return l.server() }

// proven records a proof of leadership obtained by a query sent at at.
func (l *Lease) proven(at time.Time) {
	l.mu.Lock()
	if at.After(l.provenAt) {
		l.provenAt = at
	}
	l.mu.Unlock()
}

// Save saves lsn as the checkpoint, fenced by the term's epoch (see
// Saver). One that succeeds proves leadership for Check.
func (l *Lease) Save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error {
	epoch, err := l.Wait(ctx)
	if err != nil {
		return err
	}
	at := time.Now()
	if err := l.recordServer(ctx, epoch); err != nil {
		return err
	}
	if err := l.saves.SaveFenced(ctx, l.slot, epoch, lsn, commitTime); err != nil {
		return err
	}
	l.proven(at)
	// What the HA tests check across processes: saves of one epoch all
	// begin before any save of a later one, and LSNs never fall.
	l.log.Debug("checkpoint saved", "lsn", lsn.String(), "epoch", epoch, "began", at.UTC().Format(time.RFC3339Nano))
	return nil
}

// recordServer records the stream's server with the checkpoint when it
// changed since the takeover recorded it: after a promotion that the stream
// found continues from the confirmed position (a later timeline), the
// positions saved next are that timeline's. Without it a restart would
// judge them against the old timeline, which ended before them, and refuse
// the slot as forked.
func (l *Lease) recordServer(ctx context.Context, epoch int64) error {
	srv := l.server()
	l.mu.Lock()
	prev := l.recorded
	l.mu.Unlock()
	if srv.Timeline == 0 || srv == prev {
		return nil
	}
	if err := l.saves.RecordServer(ctx, l.slot, epoch, srv); err != nil {
		return err
	}
	l.log.Info("recorded the new timeline with the checkpoint (a promotion the stream followed)",
		"slot", l.slot, "timeline", srv.Timeline, "previous_timeline", prev.Timeline)
	l.mu.Lock()
	l.recorded = srv
	l.mu.Unlock()
	return nil
}
