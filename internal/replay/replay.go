// Package replay re-delivers events still in the outbox table: a consumer
// that must re-read a day, a topic deleted by mistake, a new consumer that
// needs the history. A replication slot cannot rewind, so a replay reads the
// table, not the WAL, and runs beside a live relay without touching its slot
// or checkpoint.
//
// Invariants:
//
//   - Every replayed message carries the header replay_id (the run's id), so
//     consumers can tell a replay from the live stream; otherwise it is the
//     message the live relay sends (same router: topic, key, value, headers),
//     unless a topic is given for all.
//   - Per-aggregate order within a run is the table order it reads in: the
//     order column when one is given (an identity or serial column: insert
//     order), else created_at then the row's physical position (ctid). See
//     Order for what each guarantees.
//   - Memory is bounded: rows are read in keyset pages of BatchSize, never
//     the whole selection.
//   - A run is resumable: after each page Kafka acknowledged, its position is
//     saved in the replay table under the run's id; the same id continues
//     after the last acknowledged page, so a killed run repeats at most one
//     page.
//   - The selection ends where the run started (created_at before its first
//     start, unless an earlier end is given): rows inserted later are the live
//     relay's, and resuming never grows the selection.
package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// HeaderReplayID is the header every replayed message carries: the run's id.
const HeaderReplayID = "replay_id"

// DefaultBatchSize is the page size: rows read, sent and acknowledged at a
// time, and what a killed run may send twice.
const DefaultBatchSize = 500

// A Selection says which rows a run replays. The zero value is every row
// inserted before the run started.
type Selection struct {
	// From: rows whose created_at (their transaction's start) is at or after
	// it.
	From time.Time
	// FromLSN: rows whose transactions committed after this LSN (a
	// checkpoint the relay saved), found with the checkpoint history: the
	// rows of every transaction not older than the history's snapshot taken
	// at or before it, so also some committed up to one history interval
	// earlier.
	FromLSN pglogrepl.LSN
	// FromEvent: the row with this event id and every row after it in the
	// run's order.
	FromEvent string
	// To: rows whose created_at is before it; default (and at most) the
	// run's first start.
	To time.Time

	AggregateTypes []string
	AggregateIDs   []string
}

// Config configures a run.
type Config struct {
	ID        string // the run's id; the same id resumes it
	Selection Selection
	// Topic, when set, receives every event instead of the routed topic.
	Topic string
	// OrderBy names a unique, NOT NULL column that orders the table as
	// inserted (an identity or bigserial column); "" orders by created_at,
	// then ctid.
	OrderBy string
	// MarkAtLeastOnce adds event.HeaderDelivery to every message: beside a
	// relay that delivers exactly once, a replay's events may repeat ones
	// Kafka holds.
	MarkAtLeastOnce bool
	// Rate limits events per second; 0 is no limit.
	Rate      float64
	BatchSize int // default DefaultBatchSize

	Outbox          sql.Table
	Columns         sql.Columns // filled (the layout's)
	Router          router.Config
	CheckpointTable sql.Table // its history maps LSNs; the replay table sits beside it
	Slot            string

	Log *slog.Logger
	// Progress, when set, gets the counts after every page.
	Progress func(Progress)
}

// Progress is a run's state after a page.
type Progress struct {
	Sent, Total  int64 // events sent so far (over all attempts of the run), of the selection's
	Skipped      int64 // rows the router refused (they were never delivered live either)
	Bytes        int64
	Started      time.Time // this attempt's start
	SentThisRun  int64
	Done         bool
	ResumedAfter int64 // events sent by earlier attempts
}

// A Sink writes events and reports which failed; sink.Kafka is one.
type Sink interface {
	Write(ctx context.Context, events []event.Event) error
}

// Plan is what a run would send: for --dry-run and the progress total.
type Plan struct {
	Events, Bytes int64
	From, To      time.Time // the created_at bounds applied (zero: none)
	Note          string    // how FromLSN was mapped, when given
	// Pruned, when not nil, says that retention may have deleted rows the
	// FromLSN selection needed: the run sends what is left, and the
	// command exits with Pruned's code.
	Pruned *PrunedError
}

// A PrunedError says that a selection by LSN (replay --from-lsn, a refill
// from a checkpoint) selects the transactions not older than Xmin, but the
// retention of slot By.Slot may have deleted rows of transactions older than
// By.Xmin: rows of transactions between the two may be gone, and how many
// cannot be told (the WAL that carried them is gone too). It exits with
// exitcode.Incomplete.
type PrunedError struct {
	What  string        // "replay --from-lsn", "refill"
	From  pglogrepl.LSN // the LSN selected from
	Xmin  uint64
	By    checkpoint.Pruned
	Table string
	Found int64 // rows found (and sent); -1 before counting
}

func (e *PrunedError) Error() string {
	found := ""
	if e.Found >= 0 {
		found = fmt.Sprintf("%d rows found; ", e.Found)
	}
	return fmt.Sprintf("%s from %s: %sthe range needs the rows of every transaction not older than xid %d in %s, but retention of slot %q may have deleted rows of transactions older than xid %d: "+
		"rows expected: unknown, those pruned are not in the table and cannot be re-sent (their events are missing unless that slot's consumer or Kafka still has them). "+
		"Another slot reading the outbox must not be listed in outbox.retention_ignore_slots, and its checkpoint row must exist while it is away",
		e.What, e.From, found, e.Xmin, e.Table, e.By.Slot, e.By.Xmin)
}

// ExitCode is exitcode.Incomplete.
func (e *PrunedError) ExitCode() int { return exitcode.Incomplete }

// Replayer runs one replay.
type Replayer struct {
	cfg   Config
	pool  *pgxpool.Pool
	sink  Sink
	rt    *router.Router
	rel   *replication.Relation
	cols  []string // the outbox table's columns, in Relation order
	types []string // their SQL types, for casting keyset values
	state state
	q     query
}

// state is the run's row in the replay table.
type state struct {
	Selection  Selection `json:"selection"`
	Topic      string    `json:"topic,omitempty"`
	OrderBy    string    `json:"order_by,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	Position   []string  `json:"position,omitempty"` // keyset after the last acknowledged row
	Sent       int64     `json:"sent"`
	Skipped    int64     `json:"skipped"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// ReplayTable is the replay table's name: beside the checkpoint table.
func ReplayTable(checkpoint sql.Table) sql.Table { return sql.ReplayTableName(checkpoint) }

// HistoryTable is the checkpoint history's name (see the checkpoint history
// in setup).
func HistoryTable(checkpoint sql.Table) sql.Table { return sql.CheckpointHistoryName(checkpoint) }

// pageSize is the rows of a page: batch, but at most one second of rate
// (when set), since a page is sent at once and only paced after: a first
// page of 500 at --rate 100 went out in one burst.
func pageSize(batch int, rate float64) int {
	if rate > 0 && float64(batch) > rate {
		return max(1, int(rate))
	}
	return batch
}

// New opens a run: it creates the replay table if missing, loads the run's
// saved state when the id is known (the selection given must then be the
// same, or empty), reads the outbox table's columns and builds the query.
func New(ctx context.Context, pool *pgxpool.Pool, sink Sink, cfg Config) (*Replayer, error) {
	if cfg.ID == "" {
		return nil, errors.New("replay: a run needs an id")
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = DefaultBatchSize
	}
	cfg.BatchSize = pageSize(cfg.BatchSize, cfg.Rate)
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	r := &Replayer{cfg: cfg, pool: pool, sink: sink, rt: rt}
	// Only when missing or of an earlier version (no slot_name): CREATE
	// TABLE IF NOT EXISTS needs CREATE on the schema even when the table
	// exists, which a least-privileged role lacks.
	var current bool
	err = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = to_regclass($1) AND attname = 'slot_name' AND NOT attisdropped)`, ReplayTable(cfg.CheckpointTable).Quoted()).Scan(&current)
	for _, stmt := range sql.ReplayTable(cfg.CheckpointTable) {
		if err != nil || current {
			break
		}
		_, err = pool.Exec(ctx, stmt)
	}
	if err != nil {
		return nil, fmt.Errorf("create or upgrade the replay table %s (run `outbox-relay setup` as its owner, or replay with a role that may create it): %w", ReplayTable(cfg.CheckpointTable), err)
	}
	if err := r.loadState(ctx); err != nil {
		return nil, err
	}
	if err := r.readColumns(ctx); err != nil {
		return nil, err
	}
	if err := r.buildQuery(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// loadState reads the run's saved state, or starts a new one.
func (r *Replayer) loadState(ctx context.Context) error {
	var raw []byte
	var owner *string
	err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT state, slot_name FROM %s WHERE run_id = $1`, ReplayTable(r.cfg.CheckpointTable).Quoted()), r.cfg.ID).Scan(&raw, &owner)
	given := state{Selection: r.cfg.Selection, Topic: r.cfg.Topic, OrderBy: r.cfg.OrderBy}
	switch {
	case err == nil && owner != nil && *owner != r.cfg.Slot:
		// Another relay's run (another slot, maybe another outbox table):
		// its position means nothing here.
		return fmt.Errorf("replay run %q belongs to slot %q, not to this relay's slot %q: start a run with another --id (or run replay with that relay's configuration)",
			r.cfg.ID, *owner, r.cfg.Slot)
	case errors.Is(err, pgx.ErrNoRows):
		given.StartedAt = time.Now().UTC().Truncate(time.Microsecond)
		r.state = given
		return nil
	case err != nil:
		return fmt.Errorf("read replay run %q: %w", r.cfg.ID, err)
	}
	if err := json.Unmarshal(raw, &r.state); err != nil {
		return fmt.Errorf("replay run %q: its saved state is unreadable (%v): start a new run with another --id", r.cfg.ID, err)
	}
	if !sameSelection(given, r.state) && !emptySelection(given) {
		return fmt.Errorf("replay run %q exists with another selection (%s): resume it with the same flags or none, or start a new run with another --id",
			r.cfg.ID, describe(r.state))
	}
	return nil
}

func emptySelection(s state) bool {
	return s.Topic == "" && s.OrderBy == "" && s.Selection.From.IsZero() && s.Selection.FromLSN == 0 && s.Selection.FromEvent == "" &&
		s.Selection.To.IsZero() && len(s.Selection.AggregateTypes) == 0 && len(s.Selection.AggregateIDs) == 0
}

func sameSelection(a, b state) bool {
	ja, _ := json.Marshal(state{Selection: a.Selection, Topic: a.Topic, OrderBy: a.OrderBy})
	jb, _ := json.Marshal(state{Selection: b.Selection, Topic: b.Topic, OrderBy: b.OrderBy})
	return string(ja) == string(jb)
}

func describe(s state) string {
	b, _ := json.Marshal(struct {
		Selection Selection `json:"selection"`
		Topic     string    `json:"topic,omitempty"`
		OrderBy   string    `json:"order_by,omitempty"`
	}{s.Selection, s.Topic, s.OrderBy})
	return string(b)
}

// Resumed reports whether the run continues a saved one, and how far it got.
func (r *Replayer) Resumed() (bool, int64) {
	return len(r.state.Position) > 0 || r.state.Sent > 0, r.state.Sent
}

// Finished reports whether the saved run had already finished.
func (r *Replayer) Finished() bool { return !r.state.FinishedAt.IsZero() }

// readColumns reads the outbox table's columns as pgoutput would describe
// them, so that the router sees the same Relation as live.
func (r *Replayer) readColumns(ctx context.Context) error {
	rows, err := r.pool.Query(ctx, `SELECT a.attname, a.atttypid, format_type(a.atttypid, a.atttypmod) FROM pg_catalog.pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, r.cfg.Outbox.Quoted())
	if err != nil {
		return fmt.Errorf("read the columns of %s: %w", r.cfg.Outbox, err)
	}
	rel := &replication.Relation{Namespace: r.cfg.Outbox.Schema, Name: r.cfg.Outbox.Name}
	for rows.Next() {
		var name, typ string
		var oid uint32
		if err := rows.Scan(&name, &oid, &typ); err != nil {
			return err
		}
		rel.Columns = append(rel.Columns, replication.Column{Name: name, TypeOID: oid})
		r.cols = append(r.cols, name)
		r.types = append(r.types, typ)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(r.cols) == 0 {
		return fmt.Errorf("outbox table %s not found: check outbox.table", r.cfg.Outbox)
	}
	r.rel = rel
	return nil
}

// query is the run's SQL: a WHERE clause over the outbox table with its
// arguments, and the keyset order.
type query struct {
	where []string
	args  []any
	order []string // keyset columns: OrderBy, or created_at and ctid
	plan  Plan
}

func (q *query) arg(v any) string {
	q.args = append(q.args, v)
	return fmt.Sprintf("$%d", len(q.args))
}

// buildQuery turns the selection into SQL.
func (r *Replayer) buildQuery(ctx context.Context) error {
	s, q := r.state.Selection, &r.q
	if r.state.OrderBy != "" {
		if err := r.checkOrderColumn(ctx); err != nil {
			return err
		}
		q.order = []string{"o." + sql.Ident(r.state.OrderBy)}
	} else {
		// Qualified: ORDER BY would take a bare name for the output column
		// of the same name, which is its text (ctid "(0,10)" before "(0,2)").
		q.order = []string{`o."created_at"`, "o.ctid"}
		if !r.hasColumn("created_at") {
			return fmt.Errorf("outbox table %s has no created_at column: give --order-by COLUMN (an identity or serial column)", r.cfg.Outbox)
		}
	}
	to := r.state.StartedAt
	if !s.To.IsZero() && (to.IsZero() || s.To.Before(to)) {
		to = s.To
	}
	if !to.IsZero() { // zero only for Select: a snapshot bounds it instead
		q.where = append(q.where, `o."created_at" < `+q.arg(to))
		q.plan.To = to
	}
	if !s.From.IsZero() {
		q.where = append(q.where, `o."created_at" >= `+q.arg(s.From))
		q.plan.From = s.From
	}
	if s.FromLSN != 0 {
		cond, note, err := r.lsnCondition(ctx, s.FromLSN)
		if err != nil {
			return err
		}
		q.where = append(q.where, cond)
		q.plan.Note = note
	}
	if s.FromEvent != "" {
		if err := r.fromEvent(ctx, s.FromEvent); err != nil {
			return err
		}
	}
	if len(s.AggregateTypes) > 0 {
		q.where = append(q.where, "o."+sql.Ident(r.cfg.Columns.AggregateType)+`::text = ANY(`+q.arg(s.AggregateTypes)+`::text[])`)
	}
	if len(s.AggregateIDs) > 0 {
		q.where = append(q.where, "o."+sql.Ident(r.cfg.Columns.AggregateID)+`::text = ANY(`+q.arg(s.AggregateIDs)+`::text[])`)
	}
	return nil
}

func (r *Replayer) hasColumn(name string) bool {
	for _, c := range r.cols {
		if c == name {
			return true
		}
	}
	return false
}

// checkOrderColumn requires a unique index on exactly the order column and
// NOT NULL: a keyset over anything else could skip or repeat rows.
func (r *Replayer) checkOrderColumn(ctx context.Context) error {
	col := r.state.OrderBy
	if !r.hasColumn(col) {
		return fmt.Errorf("--order-by %q: %s has no such column", col, r.cfg.Outbox)
	}
	var ok bool
	err := r.pool.QueryRow(ctx, `SELECT EXISTS (
  SELECT 1 FROM pg_catalog.pg_index i JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnatts = 1 AND i.indpred IS NULL AND a.attname = $2 AND a.attnotnull)`,
		r.cfg.Outbox.Quoted(), col).Scan(&ok)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("--order-by %q: the column must be NOT NULL with a unique index of its own (an identity or bigserial primary key is): without one, pages could skip or repeat rows", col)
	}
	return nil
}

// lsnCondition maps a checkpoint LSN to rows with the checkpoint history:
// every transaction that committed after lsn has an xid no older than the
// snapshot_xmin of a history row whose snapshot_lsn is at or before lsn.
func (r *Replayer) lsnCondition(ctx context.Context, lsn pglogrepl.LSN) (string, string, error) {
	hist := HistoryTable(r.cfg.CheckpointTable)
	var (
		xmin        string
		snapLSN     string
		histLSN     string
		commitTime  *time.Time
		oldest      *string
		historyRows int64
	)
	// Ordered by the qualified column: a bare snapshot_lsn would name the
	// output column, its text, and '0/FFFFFFF' sorts above '0/10000000'.
	err := r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT h.snapshot_xmin::text, h.snapshot_lsn::text, h.lsn::text, h.last_commit_time
FROM %s h WHERE h.slot_name = $1 AND h.snapshot_lsn <= $2::text::pg_lsn ORDER BY h.snapshot_lsn DESC LIMIT 1`, hist.Quoted()),
		r.cfg.Slot, lsn.String()).Scan(&xmin, &snapLSN, &histLSN, &commitTime)
	if errors.Is(err, pgx.ErrNoRows) {
		_ = r.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), min(lsn)::text FROM %s WHERE slot_name = $1`, hist.Quoted()), r.cfg.Slot).Scan(&historyRows, &oldest)
		first := "it is empty"
		if oldest != nil {
			first = "it starts at " + *oldest
		}
		return "", "", fmt.Errorf("--from-lsn %s: the checkpoint history of slot %q has no entry at or before it (%s): replay by time with --from instead", lsn, r.cfg.Slot, first)
	}
	if err != nil {
		return "", "", fmt.Errorf("--from-lsn: read the checkpoint history %s (run outbox-relay setup to create it): %w", hist, err)
	}
	at := "unknown"
	if commitTime != nil {
		at = commitTime.UTC().Format(time.RFC3339)
	}
	note := fmt.Sprintf("--from-lsn %s: from the history entry at checkpoint %s (commit time %s, snapshot at %s): every transaction not older than xid %s, which includes all committed after %s and some committed shortly before",
		lsn, histLSN, at, snapLSN, xmin, lsn)
	// xmin is a 32-bit xid; age() compares it with the snapshot's (64-bit,
	// reduced to 32) in the current epoch's terms. A frozen row (xmin
	// 2, FrozenTransactionId) is older than any snapshot: not selected.
	q := &r.q
	cond := fmt.Sprintf(`age(o.xmin) <= age((%s::xid8::text::bigint %% 4294967296)::text::xid)`, q.arg(xmin))
	if err := r.checkPruned(ctx, lsn, xmin); err != nil {
		return "", "", err
	}
	return cond, note, nil
}

// checkPruned sets the plan's Pruned when some slot's retention recorded
// deleting rows of transactions not older than xmin (the selection's).
func (r *Replayer) checkPruned(ctx context.Context, lsn pglogrepl.LSN, xmin string) error {
	x, err := strconv.ParseUint(xmin, 10, 64)
	if err != nil {
		return fmt.Errorf("history snapshot_xmin %q: %w", xmin, err)
	}
	p, ok, err := checkpoint.FindPruned(ctx, r.pool, r.cfg.CheckpointTable.String(), r.cfg.Outbox.Quoted())
	if err != nil {
		return fmt.Errorf("--from-lsn: %w", err)
	}
	if ok && p.Xmin > x {
		r.q.plan.Pruned = &PrunedError{What: "replay --from-lsn", From: lsn, Xmin: x, By: p, Table: r.cfg.Outbox.String(), Found: -1}
	}
	return nil
}

// fromEvent starts the keyset at the row with the given event id.
func (r *Replayer) fromEvent(ctx context.Context, id string) error {
	cols := strings.Join(r.q.order, "::text, ") + "::text"
	var pos []string
	rows, err := r.pool.Query(ctx, fmt.Sprintf(`SELECT %s FROM %s AS o WHERE o.%s::text = $1`, cols, r.cfg.Outbox.Quoted(), sql.Ident(r.cfg.Columns.ID)), id)
	if err != nil {
		return fmt.Errorf("--from-event: %w", err)
	}
	n := 0
	for rows.Next() {
		vals := make([]string, len(r.q.order))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return err
		}
		pos = vals
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	switch n {
	case 0:
		return fmt.Errorf("--from-event %q: no row of %s has that id (deleted by retention, or never inserted)", id, r.cfg.Outbox)
	case 1:
	default:
		return fmt.Errorf("--from-event %q: %d rows have that id: give --from TIME instead", id, n)
	}
	r.q.where = append(r.q.where, r.keysetCondition(&r.q, pos, true))
	return nil
}

// keysetCondition is (order columns) > (pos), or >= with inclusive, with
// its arguments added to q.
func (r *Replayer) keysetCondition(q *query, pos []string, inclusive bool) string {
	op := ">"
	if inclusive {
		op = ">="
	}
	if r.state.OrderBy != "" {
		return fmt.Sprintf(`%s %s %s::%s`, q.order[0], op, q.arg(pos[0]), r.typeOf(r.state.OrderBy))
	}
	return fmt.Sprintf(`(o."created_at", o.ctid) %s (%s::%s, %s::tid)`, op, q.arg(pos[0]), r.typeOf("created_at"), q.arg(pos[1]))
}

// typeOf is a column's SQL type, to cast a keyset value back to it.
func (r *Replayer) typeOf(col string) string {
	for i, c := range r.cols {
		if c == col {
			return r.types[i]
		}
	}
	return "text"
}

// A Selected is a selection as one query, for a caller that reads it in a
// transaction of its own: relay.Refill reads it in the snapshot a new
// replication slot exported, which bounds it instead of a time. Rows come in
// OrderBy's order when given, else by commit time (with
// track_commit_timestamp), created_at, the inserting command, ctid.
type Selected struct {
	r *Replayer
}

// Select builds the query of cfg.Selection, reading the outbox table's
// columns and the checkpoint history with pool. Unlike New it keeps no state:
// no replay table, no run id, and no end unless Selection.To is given.
func Select(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Selected, error) {
	rt, err := router.New(cfg.Router)
	if err != nil {
		return nil, err
	}
	r := &Replayer{cfg: cfg, pool: pool, rt: rt, state: state{Selection: cfg.Selection, OrderBy: cfg.OrderBy}}
	if err := r.readColumns(ctx); err != nil {
		return nil, err
	}
	if err := r.buildQuery(ctx); err != nil {
		return nil, err
	}
	if cfg.OrderBy == "" {
		// Read at once, in one cursor, so the order needs no keyset and
		// can follow the WAL more closely than created_at, ctid: a
		// transaction's rows in the order its statements ran (cmin, the
		// inserting command; ctid alone jumps back to a page with room),
		// and transactions by commit time when the server records it
		// (track_commit_timestamp), else by start (created_at).
		order := []string{`o."created_at"`, "o.cmin::text::bigint", "o.ctid"}
		var track string
		if err := pool.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp')`).Scan(&track); err == nil && track == "on" {
			order = append([]string{"pg_catalog.pg_xact_commit_timestamp(o.xmin)"}, order...)
		}
		r.q.order = order
	}
	return &Selected{r: r}, nil
}

// SQL returns the query and its arguments.
func (s *Selected) SQL() (string, []any) { return s.r.page(0) }

// Count counts the rows the selection selects (a dry run's figure).
func (s *Selected) Count(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	text, args := s.SQL()
	var n int64
	err := pool.QueryRow(ctx, `SELECT count(*) FROM (`+text+`) q`, args...).Scan(&n)
	return n, err
}

// Note says how Selection.FromLSN was mapped to rows.
func (s *Selected) Note() string { return s.r.q.plan.Note }

// Order says which expressions order the selection (their values as Scan
// returns them are a row's position).
func (s *Selected) Order() []string { return slices.Clone(s.r.q.order) }

// SkipSent narrows the selection for a successor of a refill that stopped:
// rows of transactions older than xmin (full xid) that the predecessor read
// in its snapshot, and handled, are left out: with pos nil every such row
// (an outbox table it finished), else those at or before pos in the order.
// A row of a transaction not older than xmin may not have been in its
// snapshot, and stays. It refuses a pos from another order (the server's
// track_commit_timestamp changed, or an order column given).
func (s *Selected) SkipSent(pos []*string, xmin uint64) error {
	r, q := s.r, &s.r.q
	older := fmt.Sprintf(`(age(o.xmin) > age((%s::bigint %% 4294967296)::text::xid) OR age(o.xmin) < 0)`, q.arg(int64(xmin)))
	if pos == nil {
		q.where = append(q.where, `NOT `+older)
		return nil
	}
	if r.state.OrderBy != "" || len(pos) != len(q.order) {
		return fmt.Errorf("the position %d values long does not fit the order %v", len(pos), q.order)
	}
	// ORDER BY puts NULLs last: so does infinity, for the timestamps that
	// may be NULL (a commit time not recorded, a NULL created_at).
	var cols, vals []string
	for i, expr := range q.order {
		var v any
		if pos[i] != nil {
			v = *pos[i]
		}
		switch {
		case strings.HasPrefix(expr, "pg_catalog.pg_xact_commit_timestamp"):
			cols = append(cols, `coalesce(`+expr+`, 'infinity')`)
			vals = append(vals, `coalesce(`+q.arg(v)+`::timestamptz, 'infinity')`)
		case expr == `o."created_at"`:
			typ := r.typeOf("created_at")
			cols = append(cols, `coalesce(`+expr+`, 'infinity')`)
			vals = append(vals, `coalesce(`+q.arg(v)+`::`+typ+`, 'infinity')`)
		case expr == "o.cmin::text::bigint":
			cols, vals = append(cols, expr), append(vals, q.arg(v)+`::bigint`)
		case expr == "o.ctid":
			cols, vals = append(cols, expr), append(vals, q.arg(v)+`::tid`)
		default:
			return fmt.Errorf("cannot resume in the order %v", q.order)
		}
	}
	q.where = append(q.where, fmt.Sprintf(`((%s) > (%s) OR NOT %s)`, strings.Join(cols, ", "), strings.Join(vals, ", "), older))
	return nil
}

// Pruned says whether retention may have deleted rows of the selection
// (see PrunedError); nil when not. The caller sets What and Found.
func (s *Selected) Pruned() *PrunedError { return s.r.q.plan.Pruned }

// Scan reads the current row of rows (from SQL's query) as pgoutput would
// have delivered it, and its place in the order as text.
func (s *Selected) Scan(rows pgx.Rows) (replication.Row, []string, error) { return s.r.scan(rows) }

// scan reads the current row of rows: the outbox columns as pgoutput would
// have delivered them, then its place in the order as text.
func (r *Replayer) scan(rows pgx.Rows) (replication.Row, []string, error) {
	vals := make([]*string, len(r.cols)+len(r.q.order))
	ptrs := make([]any, len(vals))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return replication.Row{}, nil, err
	}
	row := replication.Row{Relation: r.rel, Values: make([][]byte, len(r.cols))}
	for i := range r.cols {
		if vals[i] != nil {
			row.Values[i] = []byte(*vals[i])
		}
	}
	pos := make([]string, len(r.q.order))
	for i := range pos {
		if v := vals[len(r.cols)+i]; v != nil {
			pos[i] = *v
		}
	}
	return row, pos, nil
}
