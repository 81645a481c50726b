package pgslot

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/sql"
)

// # Knowing the slot (DESIGN invariant 14)
//
// A checkpoint is a position in one server's WAL, and a slot resumes from a
// position of its own. The relay may stream on only when its checkpoint
// explains the slot's position: the slot is the one the relay (or its HA
// group, which shares the checkpoint row) confirmed to, on the same WAL.
// Verify decides that from what the relay records:
//
//   - Every position the relay confirms to a slot is saved in the checkpoint
//     row first, idle advances included (relay's committer). So a slot whose
//     confirmed_flush_lsn is ahead of the checkpoint was moved by something
//     else: it was dropped and created again (a new slot starts at the
//     current WAL position), advanced by hand, or read by another consumer.
//     The transactions committed between the two were never sent. A slot
//     behind the checkpoint is normal (a Postgres crash loses the slot's
//     unflushed position; the checkpoint skips what is resent).
//   - A slot with wal_status lost was invalidated (max_slot_wal_keep_size):
//     it can never stream again, and what it had not decoded is gone.
//   - The checkpoint row records the server's system identifier and
//     timeline (checkpoint.Server). Another system identifier is another
//     database cluster (a restored backup, a new cluster, or the wrong DSN):
//     the checkpoint's LSNs mean nothing on it. A later timeline is a
//     promotion: it continues the checkpoint's WAL only if the checkpoint's
//     timeline ended at or after the checkpoint (the timeline history says
//     where); otherwise the transactions the relay delivered after the fork
//     are not in this server's WAL, and the ones this server wrote in their
//     place would be skipped as already delivered.

// Cause says why a slot cannot be streamed on from a checkpoint.
type Cause string

// The causes of a GapError.
const (
	CauseSlotAhead   Cause = "slot_ahead"       // confirmed by something other than this relay: dropped and created again, advanced, or read by another consumer
	CauseSlotLost    Cause = "slot_invalidated" // wal_status lost
	CauseOtherSystem Cause = "other_system"     // another system identifier
	CauseForked      Cause = "timeline_forked"  // a timeline that forked before the checkpoint
	CauseSlotMissing Cause = "slot_missing"     // no slot of that name: dropped, or a failover to a server that never had it
	// Another host of the DSN is the same system on a later timeline that
	// branched off this server's: an old primary back after a promotion.
	CauseSuperseded Cause = "server_superseded"
)

// Refillable reports whether the outbox rows of the uncovered range can be
// found with the checkpoint history (relay.Refill): the checkpoint's LSNs
// belong to this server's WAL. On another system or a forked timeline they
// do not, and only a replay by time can deliver the range.
func (c Cause) Refillable() bool {
	return c == CauseSlotAhead || c == CauseSlotLost || c == CauseSlotMissing
}

// A GapError says that streaming on from a slot would silently skip the
// transactions committed after the checkpoint, and how to deliver them.
// From..To is the uncovered range: From is the checkpoint (delivered up to
// and including it), To where the slot would resume (0 when it cannot).
// A later refill (issue 21) re-delivers the outbox rows of that range.
type GapError struct {
	Slot           string
	Cause          Cause
	From, To       pglogrepl.LSN
	LastCommitTime time.Time         // of the checkpoint's transaction; zero unknown
	Recorded, Now  checkpoint.Server // the checkpoint's server, and the one reached
	Fork           pglogrepl.LSN     // CauseForked, CauseSuperseded: where the checkpoint's (this server's) timeline ended
	// CauseSuperseded: the host of the DSN that superseded this server, and
	// its server.
	Successor       string
	SuccessorServer checkpoint.Server
}

// ErrGap is wrapped by every *GapError.
var ErrGap = fmt.Errorf("replication slot does not continue from the checkpoint")

func (e *GapError) Unwrap() error { return ErrGap }

// Range is the uncovered range as text: "From..To", or "From.." when the
// slot has no position to resume from.
func (e *GapError) Range() string {
	if e.To == 0 {
		return e.From.String() + ".."
	}
	return e.From.String() + ".." + e.To.String()
}

// Reason says in one sentence what happened.
func (e *GapError) Reason() string {
	switch e.Cause {
	case CauseSlotAhead:
		return fmt.Sprintf("the slot's confirmed position %s is ahead of the checkpoint %s, and no relay of this checkpoint confirmed it there: "+
			"the slot was dropped and created again (a new slot starts at the current WAL position), advanced by hand, or read by another consumer",
			e.To, e.From)
	case CauseSlotMissing:
		return fmt.Sprintf("the slot does not exist, though the checkpoint says the relay delivered up to %s: it was dropped, "+
			"or the server failed over to a standby that never had it (before Postgres 17, or without a failover slot)", e.From)
	case CauseSlotLost:
		return "the slot was invalidated (wal_status lost): the server removed WAL it had not decoded, because the relay was stopped or behind for longer than max_slot_wal_keep_size allows"
	case CauseOtherSystem:
		return fmt.Sprintf("the checkpoint was saved on Postgres system %s (timeline %d), and this server is system %s: another database cluster "+
			"(a restored backup, a new cluster or pg_upgrade, a resurrected old primary of another lineage, or a connection string pointing at the wrong server), on which the checkpoint's positions mean nothing",
			e.Recorded.SystemID, e.Recorded.Timeline, e.Now.SystemID)
	case CauseForked:
		if e.Fork == 0 {
			return fmt.Sprintf("the checkpoint was saved on timeline %d, and this server is on timeline %d, whose history does not contain timeline %d: "+
				"it is not a promotion of the checkpoint's server after the checkpoint (an old primary brought back after a failover, or another branch of a restore)",
				e.Recorded.Timeline, e.Now.Timeline, e.Recorded.Timeline)
		}
		return fmt.Sprintf("the checkpoint %s was saved on timeline %d, which this server (timeline %d) left at %s, before the checkpoint: "+
			"the transactions delivered after %s are not in this server's WAL, and the ones it wrote instead would be skipped as delivered",
			e.From, e.Recorded.Timeline, e.Now.Timeline, e.Fork, e.Fork)
	case CauseSuperseded:
		fork := "at an unknown position"
		if e.Fork != 0 {
			fork = "at " + e.Fork.String()
		}
		return fmt.Sprintf("this server (system %s) is an old primary: its timeline %d is behind timeline %d of %s, the same system promoted from timeline %d %s. "+
			"If both accept writes (split brain), what this server wrote after the promotion is not in the new primary's WAL",
			e.Now.SystemID, e.Now.Timeline, e.SuccessorServer.Timeline, e.Successor, e.Now.Timeline, fork)
	}
	return string(e.Cause)
}

// Fix says what an operator does, as operations: when the checkpoint's
// positions belong to this server's WAL (Cause.Refillable), a refill
// re-delivers the uncovered range from the outbox table and creates the slot
// again; otherwise a replay by time delivers it and the checkpoint is
// dropped. Which command or setting does that is the caller's to say.
func (e *GapError) Fix() string {
	if e.Cause == CauseSuperseded {
		return fmt.Sprintf("stop this old primary and keep it from taking writes (it must not be a primary again: rebuild it as a standby of the new primary (%s) with pg_rewind or a new base backup), "+
			"then start the relay: it connects to the new primary. Events the application committed on the old primary after the promotion are in neither the new primary nor Kafka: "+
			"find them in its outbox table (created_at after the promotion) and insert them into the new primary's", e.Successor)
	}
	if e.Cause.Refillable() {
		return "refill the range: create the slot again and re-deliver from the outbox table every event the checkpoint does not cover (marked with the header refill_id; " +
			"events committed up to one checkpoint history interval before the checkpoint are sent again), then stream on from the new slot. " +
			"A refill needs a checkpoint history row at or before the checkpoint, and the rows still in the outbox table" + e.Afterwards()
	}
	return fmt.Sprintf("if the connection string points at the wrong server, fix it. If this server rightly replaced the checkpoint's, with the relay stopped: "+
		"1. replay by time the events committed since %s (the checkpoint history maps LSNs of the other WAL); "+
		"2. delete the checkpoint row, whose positions belong to the other WAL (DELETE FROM <the checkpoint table> WHERE slot_name = %s); 3. start the relay, which then starts at the slot",
		e.ReplayFrom(), sql.Literal(e.Slot))
}

// Afterwards is what to change so that the gap does not come back, or "".
func (e *GapError) Afterwards() string {
	if e.Cause == CauseSlotLost {
		return "; then raise max_slot_wal_keep_size, or alert on the slot's lag sooner"
	}
	return ""
}

// ReplayFrom is when a replay by time starts to cover the uncovered range: a
// minute before the checkpoint's commit, as RFC 3339, since created_at is the
// inserting transaction's start and a transaction that committed after the
// checkpoint may have started a little before it.
func (e *GapError) ReplayFrom() string { return fromTime(e.LastCommitTime) }

func fromTime(t time.Time) string {
	if t.IsZero() {
		return "<the time of the last event delivered>"
	}
	return t.Add(-time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339)
}

func (e *GapError) Error() string {
	if e.Cause == CauseSuperseded {
		return fmt.Sprintf("replication slot %q: the relay refuses this server: %s; streaming from it would deliver a history the new primary does not have. To fix: %s",
			e.Slot, e.Reason(), e.Fix())
	}
	return fmt.Sprintf("replication slot %q does not continue from the checkpoint: %s; streaming on would silently skip the events committed in %s (the uncovered range), so the relay refuses to. To deliver them, %s",
		e.Slot, e.Reason(), e.Range(), e.Fix())
}

// A Server is what a replication connection says of the server it reached
// (IDENTIFY_SYSTEM, TIMELINE_HISTORY).
type Server struct {
	checkpoint.Server
	// Forks is the current timeline's history: where each earlier timeline
	// ended. Nil with History false when it was not read (an ordinary
	// connection cannot read it).
	Forks   []Fork
	History bool
}

// A Fork is one line of a timeline history file: Timeline ended at End (the
// first position of the next timeline).
type Fork struct {
	Timeline int32
	End      pglogrepl.LSN
}

// Identify asks the server a replication connection reached who it is:
// IDENTIFY_SYSTEM, and TIMELINE_HISTORY of its timeline after a promotion.
// Neither needs a grant beyond the REPLICATION attribute.
func Identify(ctx context.Context, conn *pgconn.PgConn) (Server, error) {
	id, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return Server{}, fmt.Errorf("identify the server (IDENTIFY_SYSTEM): %w", err)
	}
	srv := Server{Server: checkpoint.Server{SystemID: id.SystemID, Timeline: id.Timeline}, History: true}
	if id.Timeline > 1 {
		h, err := pglogrepl.TimelineHistory(ctx, conn, id.Timeline)
		if err != nil {
			return Server{}, fmt.Errorf("read the history of timeline %d (TIMELINE_HISTORY): %w", id.Timeline, err)
		}
		if srv.Forks, err = ParseHistory(h.Content); err != nil {
			return Server{}, fmt.Errorf("timeline %d history %s: %w", id.Timeline, h.FileName, err)
		}
	}
	return srv, nil
}

// IdentifyQuerier reads the system identifier and the timeline of the latest
// checkpoint over an ordinary connection (pg_control_system and
// pg_control_checkpoint are executable by PUBLIC). The timeline history is
// not readable there: History is false.
func IdentifyQuerier(ctx context.Context, q Querier) (Server, error) {
	var srv Server
	err := q.QueryRow(ctx, `SELECT s.system_identifier::text, c.timeline_id
FROM pg_catalog.pg_control_system() s, pg_catalog.pg_control_checkpoint() c`).Scan(&srv.SystemID, &srv.Timeline)
	if err != nil {
		return Server{}, fmt.Errorf("identify the server (pg_control_system): %w", err)
	}
	return srv, nil
}

// ParseHistory parses a timeline history file: lines of "parent timeline,
// switch point, reason", separated by tabs, and # comments.
func ParseHistory(content []byte) ([]Fork, error) {
	var forks []Fork
	sc := bufio.NewScanner(bytes.NewReader(content))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("line %q: want timeline and switch point", line)
		}
		tli, err := strconv.ParseInt(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %q: timeline: %w", line, err)
		}
		end, err := pglogrepl.ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %q: switch point: %w", line, err)
		}
		forks = append(forks, Fork{Timeline: int32(tli), End: end})
	}
	return forks, sc.Err()
}

// Continues reports whether this server's WAL contains position lsn as
// written on timeline tli: tli is its own timeline, or an ancestor that
// ended at or after lsn. fork is where tli ended (0 when tli is not in the
// history). Undecidable without the history (History false): true.
func (s Server) Continues(tli int32, lsn pglogrepl.LSN) (ok bool, fork pglogrepl.LSN) {
	if tli == 0 || s.Timeline == 0 || tli == s.Timeline {
		return true, 0
	}
	if !s.History {
		return true, 0
	}
	for _, f := range s.Forks {
		if f.Timeline == tli {
			return lsn <= f.End, f.End
		}
	}
	return false, 0
}

// Verify returns a *GapError when streaming slot sl of server srv would not
// continue from checkpoint cp, and nil when it would. A slot that Read did
// not find is passed as Slot{Name: name, Missing: true}: with a checkpoint
// that is a gap (CauseSlotMissing), the rows since the checkpoint were never
// sent; without one it is nil, and the caller says to run setup. Nil: no checkpoint yet, the
// slot at or behind it (behind: a crash lost the slot's position, and the
// relay skips what is resent), on the same system and a timeline that
// contains it. A checkpoint saved by a version that did not record its server
// (cp.Server zero) is not judged by the slot's position, as that version
// advanced an idle slot without recording it: the caller says so.
func Verify(cp checkpoint.Checkpoint, sl Slot, srv Server) error {
	if cp.LSN == 0 {
		return nil
	}
	if sl.Missing {
		gap := &GapError{Slot: sl.Name, Cause: CauseSlotMissing, From: cp.LSN, LastCommitTime: cp.LastCommitTime, Recorded: cp.Server, Now: srv.Server}
		if cp.Server.SystemID != "" && srv.SystemID != "" && cp.Server.SystemID != srv.SystemID {
			gap.Cause = CauseOtherSystem
		} else if ok, fork := srv.Continues(cp.Server.Timeline, cp.LSN); !ok {
			gap.Cause, gap.Fork = CauseForked, fork
		}
		return gap
	}
	slotLSN, err := sl.Confirmed()
	if err != nil {
		return err
	}
	gap := &GapError{Slot: sl.Name, From: cp.LSN, To: slotLSN, LastCommitTime: cp.LastCommitTime, Recorded: cp.Server, Now: srv.Server}
	switch {
	case cp.Server.SystemID != "" && srv.SystemID != "" && cp.Server.SystemID != srv.SystemID:
		gap.Cause = CauseOtherSystem
		return gap
	case sl.Lost():
		gap.Cause, gap.To = CauseSlotLost, 0
		return gap
	}
	if ok, fork := srv.Continues(cp.Server.Timeline, cp.LSN); !ok {
		gap.Cause, gap.Fork = CauseForked, fork
		return gap
	}
	if cp.Server.SystemID != "" && slotLSN > cp.LSN {
		gap.Cause = CauseSlotAhead
		return gap
	}
	return nil
}

// Superseded returns a *GapError (CauseSuperseded) when other, the server at
// addr (another host of the DSN, or the one the stream followed), is the same system as srv on a later timeline: srv is an
// old primary that came back after other was promoted (a standby of srv has
// srv's timeline, and only a promotion moves to a later one). Nil otherwise.
func Superseded(slot string, cp pglogrepl.LSN, srv, other Server, addr string) error {
	if other.SystemID == "" || other.SystemID != srv.SystemID || other.Timeline <= srv.Timeline {
		return nil
	}
	gap := &GapError{Slot: slot, Cause: CauseSuperseded, From: cp, Now: srv.Server, Successor: addr, SuccessorServer: other.Server}
	for _, f := range other.Forks {
		if f.Timeline == srv.Timeline {
			gap.Fork = f.End
		}
	}
	return gap
}
