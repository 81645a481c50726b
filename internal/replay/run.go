package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/backoff"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sql"
)

// page returns the query of the rows after the saved position, at most
// limit of them (0: all).
func (r *Replayer) page(limit int) (string, []any) {
	q := query{where: slices.Clone(r.q.where), args: slices.Clone(r.q.args), order: r.q.order}
	if len(r.state.Position) > 0 {
		q.where = append(q.where, r.keysetCondition(&q, r.state.Position, false))
	}
	cols := make([]string, 0, len(r.cols)+len(q.order))
	for _, c := range r.cols {
		cols = append(cols, "o."+sql.Ident(c)+"::text")
	}
	for _, o := range q.order {
		cols = append(cols, o+"::text")
	}
	text := fmt.Sprintf(`SELECT %s FROM %s AS o WHERE %s ORDER BY %s`, strings.Join(cols, ", "), r.cfg.Outbox.Quoted(),
		strings.Join(q.where, " AND "), strings.Join(q.order, ", "))
	if limit > 0 {
		text += fmt.Sprintf(" LIMIT %d", limit)
	}
	return text, q.args
}

// Plan counts what the run has left to send (all of it for a new run).
func (r *Replayer) Plan(ctx context.Context) (Plan, error) {
	q := query{where: slices.Clone(r.q.where), args: slices.Clone(r.q.args), order: r.q.order}
	if len(r.state.Position) > 0 {
		q.where = append(q.where, r.keysetCondition(&q, r.state.Position, false))
	}
	p := r.q.plan
	err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(sum(octet_length(o.%s::text)), 0) FROM %s AS o WHERE %s`,
		sql.Ident(r.cfg.Columns.Payload), r.cfg.Outbox.Quoted(), strings.Join(q.where, " AND ")), q.args...).Scan(&p.Events, &p.Bytes)
	if err != nil {
		return Plan{}, fmt.Errorf("count the rows to replay: %w", err)
	}
	return p, nil
}

// Run sends the selection in pages, saving the position after each page
// Kafka acknowledged, until it is done or ctx ends (the position is then
// saved: the same id resumes). An event Kafka refuses stops the run with
// an error naming it, the position just before it: a replay keeps order
// rather than skip.
func (r *Replayer) Run(ctx context.Context) error {
	plan, err := r.Plan(ctx)
	if err != nil {
		return err
	}
	prog := Progress{Total: r.state.Sent + plan.Events, Sent: r.state.Sent, Skipped: r.state.Skipped,
		Started: time.Now(), ResumedAfter: r.state.Sent}
	if err := r.save(ctx, false); err != nil { // the run exists from its first start: its end is fixed
		return err
	}
	// One cursor over the selection, read a page at a time: a keyset query
	// per page would rescan every row sharing a created_at (one big
	// transaction's thousands) for each page. The cursor's transaction is
	// read-only and takes no xid, so it holds back no other transaction
	// (only vacuum, for the run's duration); a resumed run opens a new one
	// after the saved position.
	conn, err := r.pool.Acquire(ctx)
	if err != nil {
		return r.stopped(ctx, fmt.Errorf("connect: %w", err))
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return r.stopped(ctx, fmt.Errorf("begin: %w", err))
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	text, args := r.page(0)
	if _, err := tx.Exec(ctx, "DECLARE replay NO SCROLL CURSOR FOR "+text, args...); err != nil {
		return r.stopped(ctx, fmt.Errorf("read the outbox table: %w", err))
	}
	fetch := fmt.Sprintf("FETCH FORWARD %d FROM replay", r.cfg.BatchSize)
	mark := router.Header{Key: HeaderReplayID, Value: []byte(r.cfg.ID)}
	for {
		evs, keys, n, err := r.readPage(ctx, tx, fetch, mark, &prog)
		if err != nil {
			return r.stopped(ctx, err)
		}
		if n == 0 {
			break
		}
		if err := r.sendPage(ctx, evs, keys, &prog); err != nil {
			return err
		}
		if n < r.cfg.BatchSize {
			break
		}
	}
	if err := r.save(ctx, true); err != nil {
		return err
	}
	prog.Done, prog.Sent = true, r.state.Sent
	if r.cfg.Progress != nil {
		r.cfg.Progress(prog)
	}
	return nil
}

// readPage fetches the next page from the cursor and routes its rows. It
// returns the events with their keyset positions, a zero event (a hole)
// for each row the router refuses, which is counted as skipped, and n, the
// rows read. Each event carries mark, the replay's header. A schema error
// stops the run.
func (r *Replayer) readPage(ctx context.Context, tx pgx.Tx, fetch string, mark router.Header, prog *Progress) (evs []event.Event, keys [][]string, n int, err error) {
	rows, err := tx.Query(ctx, fetch)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("read the outbox table: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		row, pos, err := r.scan(rows)
		if err != nil {
			return nil, nil, 0, err
		}
		n++
		m, err := r.rt.Route(row)
		if err != nil {
			var se *router.SchemaError
			if errors.As(err, &se) {
				return nil, nil, 0, err
			}
			// The live relay could not send it either (it went to the
			// retry table): count it and go on.
			prog.Skipped++
			r.state.Skipped++
			r.cfg.Log.Warn("replay: row skipped: the router refuses it", "error", err)
			keys = append(keys, pos)
			evs = append(evs, event.Event{}) // a hole, to keep keys aligned
			continue
		}
		e := m.Event
		if r.state.Topic != "" {
			e.Topic = r.state.Topic
		}
		// The replay mark, and beside an exactly-once relay the
		// at-least-once mark (a replay resends what may be in Kafka),
		// in place of any headers-column entry of the same names.
		e.Headers = append(slices.DeleteFunc(e.Headers, func(h router.Header) bool { return h.Key == HeaderReplayID }), mark)
		if r.cfg.MarkAtLeastOnce {
			e.Headers = append(slices.DeleteFunc(e.Headers, func(h router.Header) bool { return h.Key == event.HeaderDelivery }), event.AtLeastOnce())
		}
		prog.Bytes += int64(len(e.Value))
		evs = append(evs, e)
		keys = append(keys, pos)
	}
	if err := rows.Err(); err != nil {
		return nil, nil, 0, fmt.Errorf("read the outbox table: %w", err)
	}
	return evs, keys, n, nil
}

// sendPage writes a page's events (not its holes) to Kafka, saves the
// position after it, reports progress and keeps to the rate. The error it
// returns is the run's: it says how to resume.
func (r *Replayer) sendPage(ctx context.Context, evs []event.Event, keys [][]string, prog *Progress) error {
	send := make([]event.Event, 0, len(evs))
	idx := make([]int, 0, len(evs)) // position in evs of each sent event
	for i := range evs {
		if evs[i].Topic != "" {
			send = append(send, evs[i])
			idx = append(idx, i)
		}
	}
	if err := r.sink.Write(ctx, send); err != nil {
		var we *sink.WriteError
		if !errors.As(err, &we) || len(we.Failures) == 0 {
			return r.stopped(ctx, fmt.Errorf("write to Kafka: %w", err))
		}
		// Everything before the first failure was acknowledged (later
		// events of other aggregates may have been too: resent on resume).
		first := we.Failures[0]
		bad := send[first.Index]
		if i := idx[first.Index]; i > 0 {
			r.state.Position = keys[i-1]
			r.state.Sent += int64(first.Index)
		}
		_ = r.save(context.WithoutCancel(ctx), false)
		return fmt.Errorf("replay stopped at event %s (topic %s): %v; fix the cause and run the replay again with --id %s: it resumes at this event",
			bad.ID, bad.Topic, first.Reason, r.cfg.ID)
	}
	r.state.Position = keys[len(keys)-1]
	r.state.Sent += int64(len(send))
	prog.Sent, prog.SentThisRun = r.state.Sent, prog.SentThisRun+int64(len(send))
	if err := r.save(ctx, false); err != nil {
		return err
	}
	if r.cfg.Progress != nil {
		r.cfg.Progress(*prog)
	}
	if err := r.pace(ctx, *prog); err != nil {
		return r.stopped(ctx, err)
	}
	return nil
}

// pace sleeps so that the run keeps to Rate events per second.
func (r *Replayer) pace(ctx context.Context, p Progress) error {
	if r.cfg.Rate <= 0 {
		return nil
	}
	due := p.Started.Add(time.Duration(float64(p.SentThisRun) / r.cfg.Rate * float64(time.Second)))
	wait := time.Until(due)
	if wait <= 0 {
		return nil
	}
	return backoff.Sleep(ctx, wait)
}

// stopped saves the position (already that of the last acknowledged page)
// and returns err, saying how to resume.
func (r *Replayer) stopped(ctx context.Context, err error) error {
	if serr := r.save(context.WithoutCancel(ctx), false); serr != nil {
		return errors.Join(err, serr)
	}
	if errors.Is(err, context.Canceled) {
		return fmt.Errorf("replay %s interrupted after %d events: run it again with --id %s to continue: %w", r.cfg.ID, r.state.Sent, r.cfg.ID, err)
	}
	return fmt.Errorf("replay %s stopped after %d events (resume with --id %s): %w", r.cfg.ID, r.state.Sent, r.cfg.ID, err)
}

// save writes the run's state; finished marks it done.
func (r *Replayer) save(ctx context.Context, finished bool) error {
	if finished {
		r.state.FinishedAt = time.Now().UTC()
	}
	raw, err := json.Marshal(r.state)
	if err != nil {
		return err
	}
	// A run of an earlier version (no slot) becomes this slot's; one of
	// another slot is never overwritten.
	tag, err := r.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS p (run_id, state, updated_at, slot_name) VALUES ($1, $2, now(), $3)
ON CONFLICT (run_id) DO UPDATE SET state = EXCLUDED.state, updated_at = now(), slot_name = EXCLUDED.slot_name
WHERE p.slot_name IS NULL OR p.slot_name = EXCLUDED.slot_name`, ReplayTable(r.cfg.CheckpointTable).Quoted()), r.cfg.ID, raw, r.cfg.Slot)
	if err != nil {
		return fmt.Errorf("save the replay's position: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("save the replay's position: run %q belongs to another slot than %q: start a run with another --id", r.cfg.ID, r.cfg.Slot)
	}
	return nil
}
