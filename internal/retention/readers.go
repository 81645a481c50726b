package retention

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/sql"
)

// HeldBySlot is the NoHorizonKind of a round that deletes nothing because
// another reader of the database has not passed any history row (see
// "Other readers" in the package doc).
const HeldBySlot checkpoint.NoHorizonKind = "held_by_slot"

// MaxKeptCount bounds the count of Result.KeptForReaders in a round that
// deletes (a dry run counts them all): the rows held back can be many, and a
// round runs every interval.
const MaxKeptCount = 100_000

// A Reader is another consumer of the database's WAL whose delivery
// retention waits for: a logical slot of this database other than the
// relay's own, or a row of the checkpoint table for another slot (another
// relay on the same tables, its slot perhaps lost and awaiting a refill).
type Reader struct {
	Slot string
	// Position is what it has delivered up to: its relay's saved
	// checkpoint when the checkpoint table has a row for it (a refill
	// starts there), else the slot's confirmed_flush_lsn. 0 when unknown.
	Position pglogrepl.LSN
	// Checkpoint: Position is a checkpoint row's, not the slot's.
	Checkpoint bool
	// Lost: the slot is invalidated (wal_status lost, or a conflict);
	// Missing: a checkpoint row names a slot the server does not have.
	Lost, Missing bool
	// Buffer: the relay's own WAL buffer, which holds undelivered events
	// of transactions from Position (their commit LSN) on.
	Buffer bool
	// Xmin is the horizon of Position (0: none): the snapshot_xmin of the
	// newest history row whose snapshot_lsn it has reached. Rows of
	// transactions older than it were committed before Position, so the
	// reader has passed them. A reader with a checkpoint row is mapped
	// through its own history rows, as its refill maps its checkpoint (so
	// that no refill needs a row retention deleted); a plain slot through
	// the relay's own slot's.
	Xmin uint64
	// Age is how many transaction ids were assigned since Xmin.
	Age int64
}

// State says what kind of reader it is, for people.
func (r Reader) State() string {
	if r.Buffer {
		return "its WAL buffer holds undelivered events committed from " + r.Position.String() + " on"
	}
	var s []string
	switch {
	case r.Missing:
		s = append(s, "its slot does not exist")
	case r.Lost:
		s = append(s, "its slot is lost (invalidated)")
	}
	if r.Position == 0 {
		s = append(s, "position unknown")
	} else if r.Checkpoint {
		s = append(s, "its relay's checkpoint "+r.Position.String())
	} else {
		s = append(s, "confirmed_flush_lsn "+r.Position.String())
	}
	return strings.Join(s, ", ")
}

// held says why the reader keeps rows, and how to let retention go on.
func (r Reader) held(cfg Config, own string) string {
	if r.Buffer {
		return fmt.Sprintf("slot %q %s and no checkpoint history row precedes them: nothing is deleted until they are delivered", r.Slot, r.State())
	}
	fix := fmt.Sprintf("if slot %q does not read %s, list it in outbox.retention_ignore_slots", r.Slot, cfg.Table)
	switch {
	case r.Missing || r.Lost:
		fix += fmt.Sprintf("; if it does, heal it (outbox-relay recover with that relay's configuration refills from its checkpoint), "+
			"or, if its events are not wanted, drop the slot and its row of %s", cfg.CheckpointTable)
	default:
		fix += "; if it does, this resolves itself once it reads on"
	}
	if r.Xmin == 0 {
		return fmt.Sprintf("slot %q (%s) has not reached any checkpoint history row (its relay's own when it has a checkpoint row, else slot %q's), so the rows it may not have read cannot be told apart: nothing is deleted; %s",
			r.Slot, r.State(), own, fix)
	}
	return fmt.Sprintf("slot %q (%s) is %d transactions old, too old to compare 32-bit row xids with: nothing is deleted; %s",
		r.Slot, r.State(), r.Age, fix)
}

// readers lists the other readers of the database not in cfg.IgnoreSlots,
// each with its horizon mapped through the own slot's history. own is the
// relay's horizon (FindHorizon found the tables).
func readers(ctx context.Context, db DB, cfg Config, own *checkpoint.Horizon) ([]Reader, error) {
	t, err := sql.ParseTable(cfg.CheckpointTable)
	if err != nil {
		return nil, fmt.Errorf("checkpoint table: %w", err)
	}
	h := sql.CheckpointHistoryName(t)
	ignore := append([]string{cfg.Slot}, cfg.IgnoreSlots...)
	// Every logical slot of this database may decode the outbox table: a
	// slot does not record its publication (or its plugin's filter), which
	// the consumer names when it starts streaming. A checkpoint row at 0/0
	// (a takeover that saved nothing yet) is no checkpoint: such a relay
	// starts from its slot.
	rows, err := queryRows(ctx, db, `WITH s AS (
    SELECT r.slot_name::text AS name, r.confirmed_flush_lsn AS pos,
           coalesce(r.wal_status = 'lost', false) OR coalesce((to_jsonb(r)->>'conflicting')::bool, false) AS lost
    FROM pg_catalog.pg_replication_slots r
    WHERE r.database = current_database() AND r.slot_type = 'logical'),
c AS (SELECT slot_name AS name, lsn AS pos FROM `+t.Quoted()+` WHERE lsn <> '0/0'),
o AS (SELECT coalesce(c.name, s.name) AS name, coalesce(c.pos, s.pos) AS pos, c.name IS NOT NULL AS cp,
             s.name IS NULL AS missing, coalesce(s.lost, false) AS lost
      FROM s FULL JOIN c ON c.name = s.name)
SELECT o.name, coalesce(o.pos::text, ''), o.cp, o.missing, o.lost,
       coalesce((SELECT h.snapshot_xmin::text FROM `+h.Quoted()+` h
                 WHERE h.slot_name = CASE WHEN o.cp THEN o.name ELSE $1 END AND h.snapshot_lsn <= o.pos
                 ORDER BY h.snapshot_lsn DESC LIMIT 1), '')
FROM o WHERE NOT o.name = ANY($2::text[]) ORDER BY o.name`, cfg.Slot, ignore)
	if err != nil {
		return nil, fmt.Errorf("list the other replication slots and checkpoints of the database: %w", err)
	}
	var out []Reader
	for _, r := range rows {
		rd := Reader{Slot: r[0], Checkpoint: r[2] == "true", Missing: r[3] == "true", Lost: r[4] == "true"}
		if r[1] != "" {
			if rd.Position, err = pglogrepl.ParseLSN(r[1]); err != nil {
				return nil, fmt.Errorf("position %q of slot %q: %w", r[1], rd.Slot, err)
			}
		}
		if r[5] != "" {
			if rd.Xmin, err = strconv.ParseUint(r[5], 10, 64); err != nil {
				return nil, fmt.Errorf("history snapshot_xmin %q: %w", r[5], err)
			}
			// Ages relative to the own horizon's, read in the same round.
			rd.Age = own.Age + int64(own.Entry.SnapshotXmin) - int64(rd.Xmin)
		}
		out = append(out, rd)
	}
	if cfg.BufferTable == "" {
		return out, nil
	}
	b, err := bufferReader(ctx, db, cfg, h, own)
	if err != nil || b == nil {
		return out, err
	}
	return append(out, *b), nil
}

// bufferReader is the relay's WAL buffer as a reader: its oldest buffered
// commit mapped through the slot's own history, as a checkpoint is; nil
// when the buffer holds nothing of the slot (or there is no buffer table).
func bufferReader(ctx context.Context, db DB, cfg Config, h sql.Table, own *checkpoint.Horizon) (*Reader, error) {
	bt, err := sql.ParseTable(cfg.BufferTable)
	if err != nil {
		return nil, fmt.Errorf("WAL buffer table: %w", err)
	}
	exists, err := queryRows(ctx, db, `SELECT to_regclass($1) IS NOT NULL`, bt.Quoted())
	if err != nil || exists[0][0] != "true" {
		return nil, err
	}
	rows, err := queryRows(ctx, db, `WITH b AS (SELECT min(commit_lsn) AS pos FROM `+bt.Quoted()+` WHERE slot_name = $1)
SELECT coalesce(b.pos::text, ''), coalesce((SELECT h.snapshot_xmin::text FROM `+h.Quoted()+` h
    WHERE h.slot_name = $1 AND h.snapshot_lsn <= b.pos ORDER BY h.snapshot_lsn DESC LIMIT 1), '') FROM b`, cfg.Slot)
	if err != nil {
		return nil, fmt.Errorf("read the WAL buffer %s: %w", bt, err)
	}
	if rows[0][0] == "" {
		return nil, nil
	}
	r := &Reader{Slot: cfg.Slot, Buffer: true, Checkpoint: true}
	if r.Position, err = pglogrepl.ParseLSN(rows[0][0]); err != nil {
		return nil, err
	}
	if rows[0][1] != "" {
		if r.Xmin, err = strconv.ParseUint(rows[0][1], 10, 64); err != nil {
			return nil, fmt.Errorf("history snapshot_xmin %q: %w", rows[0][1], err)
		}
		r.Age = own.Age + int64(own.Entry.SnapshotXmin) - int64(r.Xmin)
	}
	return r, nil
}

// queryRows runs q in a read-only transaction of its own (DB has no Query)
// and returns its rows as text.
func queryRows(ctx context.Context, db DB, q string, args ...any) ([][]string, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		vals, err := rows.Values()
		if err != nil {
			return nil, err
		}
		row := make([]string, len(vals))
		for i, v := range vals {
			row[i] = fmt.Sprint(v)
		}
		out = append(out, row)
	}
	return out, rows.Err()
}

// effective is the horizon a round deletes up to: the own horizon's xmin,
// or an older reader's. It returns 0 and the reader when one has none (or
// one too old to compare xids with), and the readers that hold the horizon
// back.
func effective(own *checkpoint.Horizon, rs []Reader) (xmin uint64, held []Reader, blocker *Reader) {
	xmin = own.Entry.SnapshotXmin
	for i := range rs {
		r := rs[i]
		if r.Xmin == 0 || r.Age > checkpoint.MaxHorizonAge {
			return 0, append(held, r), &rs[i]
		}
		if r.Xmin < own.Entry.SnapshotXmin {
			held = append(held, r)
			xmin = min(xmin, r.Xmin)
		}
	}
	return xmin, held, nil
}

// keptForReaders counts the expired rows of table the own horizon would
// delete but the effective one (0: none) keeps, at most limit (0: no limit).
func keptForReaders(ctx context.Context, db DB, table, name string, cfg Config, own, eff uint64, limit int64) (int64, error) {
	where := expired() + ` AND NOT coalesce($3::bigint IS NOT NULL AND ` + xminOlder("$3") + `, false)`
	q := `SELECT count(*) FROM ` + table + ` WHERE ` + where
	args := []any{cfg.Retention.Seconds(), int64(own), nil}
	if eff != 0 {
		args[2] = int64(eff)
	}
	if limit > 0 {
		q = `SELECT count(*) FROM (SELECT 1 FROM ` + table + ` WHERE ` + where + ` LIMIT $4) k`
		args = append(args, limit)
	}
	var n int64
	if err := db.QueryRow(ctx, q, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count the rows of %s kept for other slots: %w", name, err)
	}
	return n, nil
}

// holdBack lists the other readers, sets the round's effective horizon
// (res.Xmin) and the readers that hold it back, and counts the rows they
// keep. When a reader has no horizon, nothing may be deleted: res.Horizon
// is then nil and res.NoHorizon names the reader and the fix.
func holdBack(ctx context.Context, db DB, t sql.Table, cfg Config, res *Result) error {
	own := res.Horizon
	rs, err := readers(ctx, db, cfg, own)
	if err != nil {
		return err
	}
	xmin, held, blocker := effective(own, rs)
	res.Xmin, res.HeldBy = xmin, held
	if blocker != nil {
		res.Horizon, res.NoHorizon, res.NoHorizonKind = nil, blocker.held(cfg, cfg.Slot), HeldBySlot
	}
	if len(held) == 0 {
		return nil
	}
	limit := int64(MaxKeptCount)
	if cfg.DryRun {
		limit = 0
	}
	res.KeptForReaders, err = keptForReaders(ctx, db, t.Quoted(), t.String(), cfg, own.Entry.SnapshotXmin, xmin, limit)
	return err
}
