package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// High availability, in one place.
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

// errStandBy wraps the reasons a leader stands by again: the slot is held
// by another process, or the checkpoint row holds a newer epoch.
var errStandBy = errors.New("relay: another relay leads the slot")

// Defaults of the HA settings (Config.LeaseDuration, Config.StandbyPoll).
const (
	DefaultLeaseDuration = time.Second
	DefaultStandbyPoll   = 250 * time.Millisecond
)

// A fence says whether this relay may start a write (to Kafka or the retry
// table): the term's lease. check returns nil while this relay leads,
// proven within the lease. It blocks until the term's epoch is taken, and
// while leadership cannot be proven (the database unreachable: no write on
// hope); it returns ctx's error, or one wrapping checkpoint.ErrFenced once
// another relay took over. Safe for concurrent use.
type fence interface {
	check(ctx context.Context) error
}

// A checkpointSaver saves the checkpoint of the term's slot: the lease's
// save, fenced by its epoch. save blocks until the term's epoch is taken. It
// is durable when it returns nil, and proves leadership for the fence; an
// error wrapping checkpoint.ErrFenced means another relay leads and the term
// is over (the caller must not retry it); other errors may pass, and are
// retried by the committer. One goroutine calls it.
type checkpointSaver interface {
	save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error
}

// leaderStore is how the lease takes and proves leadership: checkpoint.Store's
// TakeOver (a new epoch in the slot's checkpoint row, fencing every former
// leader) and Verify (nil while epoch is the row's; a *checkpoint.FencedError
// once another relay took over). Safe for concurrent use.
type leaderStore interface {
	TakeOver(ctx context.Context, slot, leader string, srv checkpoint.Server) (int64, error)
	Verify(ctx context.Context, slot string, epoch int64) error
}

// fencedStore is how the lease saves the checkpoint: checkpoint.Store's
// SaveFenced (durable when it returns nil; a *checkpoint.FencedError when the
// row holds a newer epoch, nothing saved) and RecordServer (the server whose
// WAL the saved positions are, under the same fence).
type fencedStore interface {
	SaveFenced(ctx context.Context, slot string, epoch int64, lsn pglogrepl.LSN, commitTime time.Time) error
	RecordServer(ctx context.Context, slot string, epoch int64, srv checkpoint.Server) error
}

// A lease is one term's leadership: its epoch, once taken, and its last
// proof. It is the term's fence (check, before each write) and its
// checkpointSaver (save).
type lease struct {
	store leaderStore
	saves fencedStore
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

func newLease(slot, who string, dur time.Duration, log *slog.Logger, store leaderStore, saves fencedStore, server func() checkpoint.Server) *lease {
	return &lease{slot: slot, who: who, dur: dur, log: log, store: store, saves: saves, server: server,
		startedC: make(chan struct{}), takenC: make(chan struct{})}
}

// started is the stream's Started hook: START_REPLICATION succeeded.
func (l *lease) started() { l.startedOnce.Do(func() { close(l.startedC) }) }

// take waits until the stream holds the slot, then fences every former
// leader (a new epoch) and waits out their leases. Until it returns, check
// blocks: nothing is written before it.
func (l *lease) take(ctx context.Context) error {
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
	if err := l.verify(ctx); err != nil {
		return err
	}
	l.log.Info("leading: holding the slot, former leaders fenced", "slot", l.slot, "epoch", epoch, "leader", l.who)
	close(l.takenC)
	return nil
}

// taken sets the epoch of a takeover done by the caller, which waited out
// the former leaders' leases (a refill): writes may start.
func (l *lease) taken(epoch int64) {
	l.mu.Lock()
	l.epoch = epoch
	l.mu.Unlock()
	close(l.takenC)
}

// wait returns the epoch once take (or taken) is done.
func (l *lease) wait(ctx context.Context) (int64, error) {
	select {
	case <-l.takenC:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, nil
}

// current returns the epoch without waiting: false until take (or taken)
// is done.
func (l *lease) current() (int64, bool) {
	select {
	case <-l.takenC:
	default:
		return 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.epoch, true
}

// check returns nil when this relay may start a write now: it leads, proven
// within the lease. Otherwise it asks the database (retrying while it is
// unreachable) and returns an error wrapping checkpoint.ErrFenced when
// another relay took over.
func (l *lease) check(ctx context.Context) error {
	if _, err := l.wait(ctx); err != nil {
		return err
	}
	l.mu.Lock()
	fresh := time.Since(l.provenAt) < l.dur
	l.mu.Unlock()
	if fresh {
		return nil
	}
	return l.verify(ctx)
}

func (l *lease) verify(ctx context.Context) error {
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

// proven records a proof of leadership obtained by a query sent at at.
func (l *lease) proven(at time.Time) {
	l.mu.Lock()
	if at.After(l.provenAt) {
		l.provenAt = at
	}
	l.mu.Unlock()
}

// save saves lsn as the checkpoint, fenced by the term's epoch (see
// checkpointSaver). One that succeeds proves leadership for check.
func (l *lease) save(ctx context.Context, lsn pglogrepl.LSN, commitTime time.Time) error {
	epoch, err := l.wait(ctx)
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
func (l *lease) recordServer(ctx context.Context, epoch int64) error {
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

// standBy returns once the slot is free (no walsender holds it), waiting as
// long as another process streams it, and saying who does: in the log (at
// once, then every minute), in Role and in the active metric (0); the ready
// metric says, as /readyz does, whether it reaches Postgres and could lead
// (checkCouldLead, at once and every couldLeadEvery). A missing
// slot or a slot of the wrong kind is an error for the operator.
func (r *Relay) standBy(ctx context.Context, pool *pgxpool.Pool) error {
	r.m.SetActive(false)
	defer r.standby.Store(nil)
	defer r.leadProblem.Store(nil)
	var logged, checked time.Time
	for {
		var sl pgslot.Slot
		err := backoff.RetryIf(ctx, r.log, "postgres unreachable while looking at the slot", unreachable, func() error {
			var err error
			sl, err = pgslot.Read(ctx, pool, r.cfg.Replication.Slot)
			// What /readyz says of a standby (Ready): ready while it
			// reaches Postgres and could lead (checkCouldLead).
			r.m.SetStandby((err == nil || !unreachable(err)) && r.leadProblem.Load() == nil)
			return err
		})
		if errors.Is(err, pgslot.ErrNotFound) {
			return nil // nobody streams it: lead says what is wrong, or refills
		}
		if err != nil {
			return err
		}
		if !sl.Active {
			return nil
		}
		if checked.IsZero() || time.Since(checked) >= couldLeadEvery {
			checked = time.Now()
			r.checkCouldLead(ctx, pool)
			r.m.SetStandby(r.leadProblem.Load() == nil)
		}
		who := r.holder(ctx, pool, sl)
		r.standby.Store(&who)
		if logged.IsZero() || time.Since(logged) >= time.Minute {
			r.log.Info("standby: another process streams the slot; waiting to take over", "slot", sl.Name, "active", who)
			logged = time.Now()
		}
		t := time.NewTimer(r.cfg.StandbyPoll)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// holder describes the process streaming the slot: its walsender, and the
// leader the checkpoint row names (another relay's host, pid and start).
func (r *Relay) holder(ctx context.Context, pool *pgxpool.Pool, sl pgslot.Slot) string {
	var s string
	if sl.ActivePID != nil {
		s = fmt.Sprintf("walsender pid %d", *sl.ActivePID)
	}
	if w := sl.Walsender; w != nil {
		if w.ApplicationName != nil {
			s += fmt.Sprintf(", application %q", *w.ApplicationName)
		}
		if w.ClientAddr != nil {
			s += ", from " + *w.ClientAddr
		}
		if w.BackendStart != nil {
			s += ", since " + w.BackendStart.UTC().Format(time.RFC3339)
		}
	}
	if l, err := checkpoint.New(pool, r.cfg.CheckpointTable).Leader(ctx, sl.Name); err == nil && l.Epoch > 0 {
		s += fmt.Sprintf("; last relay to take over: %s (epoch %d, at %s)", l.Leader, l.Epoch, l.Since.UTC().Format(time.RFC3339))
	}
	return s
}

// guardedSink lets the retry worker write to Kafka only while this relay
// leads, as the pipeline's writer does.
type guardedSink struct {
	fence fence
	sink  retry.Sink
}

func (g guardedSink) Write(ctx context.Context, events []event.Event) error {
	if err := g.fence.check(ctx); err != nil {
		return err
	}
	return g.sink.Write(ctx, events)
}

func (g guardedSink) Ping(ctx context.Context) error { return g.sink.Ping(ctx) }
