package retry

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/sql"
)

// Status is a row's state: pending rows are retried, dead ones wait for the
// operator.
type Status string

const (
	StatusPending Status = "pending"
	StatusDead    Status = "dead"
)

// A Header is a Kafka header of a stored event.
type Header struct {
	Key   string
	Value []byte
}

// An Event is what the pipeline diverts to the retry table. Empty strings,
// a zero SourceLSN and a zero CommitTime are stored as NULL.
type Event struct {
	EventKey      string // unique and deterministic: see EventKey
	EventID       string
	Aggregate     string // blocking identity: see Aggregate and UnroutableAggregate
	AggregateType string
	AggregateID   string
	EventType     string
	Topic         string // "" when the event could not be routed
	Key, Value    []byte
	Headers       []Header
	SourceLSN     pglogrepl.LSN // end LSN of the transaction that inserted the event
	CommitTime    time.Time
	Reason        string // what is wrong and how to fix it, in plain words
	Permanent     bool   // will fail the same way again: stored dead at once
	Waiting       bool   // diverted only because an earlier event of the aggregate is in the table
}

// EventKey returns the key that identifies an event in the retry table: its
// id, or, when the id is NULL, the commit LSN of its transaction and its
// position n in it, which a resend after a crash reproduces.
func EventKey(eventID string, commitLSN pglogrepl.LSN, n int) string {
	if eventID != "" {
		return eventID
	}
	return fmt.Sprintf("lsn:%s:%d", commitLSN, n)
}

// Aggregate returns the blocking identity of a routed event: its topic and
// Kafka key, which together decide its partition and so its order. Topic
// names cannot hold '/' or '#', so the result is unambiguous; a key that is
// not valid UTF-8 (Postgres text cannot hold it) is written in hex after '#'.
func Aggregate(topic string, key []byte) string {
	if utf8.Valid(key) && !strings.ContainsRune(string(key), 0) {
		return topic + "/" + string(key)
	}
	return topic + "#" + hex.EncodeToString(key)
}

// UnroutableAggregate returns the blocking identity of an event that has no
// topic. It cannot collide with Aggregate's: ':' is not legal in a topic.
func UnroutableAggregate(aggregateType, aggregateID string) string {
	return "unroutable:" + strings.ToValidUTF8(aggregateType, "\uFFFD") + "/" + strings.ToValidUTF8(aggregateID, "\uFFFD")
}

// An Entry is a row of the retry table.
type Entry struct {
	Seq           int64 // global order, and the short id the CLI takes
	EventKey      string
	EventID       string
	Aggregate     string
	AggregateType string
	AggregateID   string
	EventType     string
	Topic         string
	Key, Value    []byte
	Headers       []Header
	Status        Status
	Waiting       bool
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
	FirstFailedAt time.Time
	SourceLSN     pglogrepl.LSN
	CommitTime    time.Time // zero when unknown
	CreatedAt     time.Time
	UpdatedAt     time.Time
}

// ErrNotFound is returned by Get when no row has the id.
var ErrNotFound = errors.New("retry: no such event")

// NotFoundError lists the ids that Requeue or Drop did not find; they then
// changed nothing.
type NotFoundError struct {
	IDs []string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("no event in the retry table with id %s", strings.Join(e.IDs, ", "))
}

// Is makes errors.Is(err, ErrNotFound) true.
func (e *NotFoundError) Is(target error) bool { return target == ErrNotFound }

// A Store reads and writes the retry table. It is safe for concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	table string // quoted
	name  string // as configured
}

// NewStore returns a Store on table ("table" or "schema.table", exact names;
// default sql.DefaultRetryTable when empty). It does not check that the
// table exists: `outbox-relay setup` creates it.
func NewStore(pool *pgxpool.Pool, table string) (*Store, error) {
	if table == "" {
		table = sql.DefaultRetryTable
	}
	t, err := sql.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("retry table: %w", err)
	}
	return &Store{pool: pool, table: t.Quoted(), name: table}, nil
}

// Table returns the table's name as configured.
func (s *Store) Table() string { return s.name }

type headerJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Insert stores events in one statement, in the given order (seq follows
// it). An event whose EventKey is already in the table is left as it is, so
// inserting again what a crash made the pipeline read again changes nothing.
// The rows are durable when Insert returns nil. Permanent events are stored
// dead; the others pending and due at once, with attempts 0: the retry
// worker counts its own attempts.
func (s *Store) Insert(ctx context.Context, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	n := len(events)
	var (
		keys, aggs                       = make([]string, n), make([]string, n)
		ids, types, aggIDs, evTypes, tps = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		msgKeys, values                  = make([][]byte, n), make([][]byte, n)
		headers, reasons, lsns           = make([]*string, n), make([]*string, n), make([]*string, n)
		commitTimes                      = make([]*time.Time, n)
		dead, waiting                    = make([]bool, n), make([]bool, n)
	)
	for i, e := range events {
		if e.EventKey == "" || e.Aggregate == "" {
			return fmt.Errorf("insert retry event %d: event key and aggregate are required", i)
		}
		keys[i], aggs[i] = e.EventKey, e.Aggregate
		ids[i], types[i], aggIDs[i] = nullable(e.EventID), nullable(e.AggregateType), nullable(e.AggregateID)
		evTypes[i], tps[i], reasons[i] = nullable(e.EventType), nullable(e.Topic), nullable(e.Reason)
		msgKeys[i], values[i] = e.Key, e.Value
		if e.Headers != nil {
			hs := make([]headerJSON, len(e.Headers))
			for j, h := range e.Headers {
				hs[j] = headerJSON{Key: h.Key, Value: string(h.Value)}
			}
			b, err := json.Marshal(hs)
			if err != nil {
				return fmt.Errorf("encode headers of event %q: %w", e.EventKey, err)
			}
			headers[i] = nullable(string(b))
		}
		if e.SourceLSN != 0 {
			lsns[i] = nullable(e.SourceLSN.String())
		}
		if !e.CommitTime.IsZero() {
			ct := e.CommitTime
			commitTimes[i] = &ct
		}
		dead[i], waiting[i] = e.Permanent, e.Waiting && !e.Permanent
	}
	// INSERT … SELECT … ORDER BY draws the serial in the order of the sorted
	// rows, so seq follows the slice.
	q := fmt.Sprintf(`INSERT INTO %s (event_key, event_id, aggregate, aggregate_type, aggregate_id, event_type,
    topic, msg_key, value, headers, status, waiting, next_attempt_at, last_error, source_lsn, commit_time)
SELECT k, id, agg, at, aid, et, tp, mk, v, h::jsonb, CASE WHEN d THEN 'dead' ELSE 'pending' END, w, now(), r, l::pg_lsn, ct
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
    $8::bytea[], $9::bytea[], $10::text[], $11::bool[], $12::bool[], $13::text[], $14::text[], $15::timestamptz[])
    WITH ORDINALITY AS u(k, id, agg, at, aid, et, tp, mk, v, h, d, w, r, l, ct, ord)
ORDER BY ord
ON CONFLICT (event_key) DO NOTHING`, s.table)
	if _, err := s.pool.Exec(ctx, q, keys, ids, aggs, types, aggIDs, evTypes, tps,
		msgKeys, values, headers, dead, waiting, reasons, lsns, commitTimes); err != nil {
		return fmt.Errorf("insert into retry table %s: %w", s.name, err)
	}
	return nil
}

// Aggregates returns the aggregates that have rows in the table, pending or
// dead (a dead row blocks its aggregate too), sorted. The pipeline diverts
// new events of these aggregates here, behind them.
func (s *Store) Aggregates(ctx context.Context) ([]string, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT aggregate FROM %s ORDER BY 1`, s.table))
	if err != nil {
		return nil, fmt.Errorf("read retry aggregates: %w", err)
	}
	aggs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read retry aggregates: %w", err)
	}
	return aggs, nil
}

// Undelivered reports, for each of aggregates, whether it still has rows in
// the table. Every aggregate asked for is a key of the result.
func (s *Store) Undelivered(ctx context.Context, aggregates []string) (map[string]bool, error) {
	out := make(map[string]bool, len(aggregates))
	for _, a := range aggregates {
		out[a] = false
	}
	if len(aggregates) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT aggregate FROM %s WHERE aggregate = ANY($1)`, s.table), aggregates)
	if err != nil {
		return nil, fmt.Errorf("read retry aggregates: %w", err)
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read retry aggregates: %w", err)
	}
	for _, a := range found {
		out[a] = true
	}
	return out, nil
}

// A Filter selects rows for List. Zero values select everything.
type Filter struct {
	Status        Status // "" for both
	AggregateType string
	Limit         int // 0 for no limit
}

// columns are the Entry fields in scan order.
const columns = `seq, event_key, coalesce(event_id, ''), aggregate, coalesce(aggregate_type, ''),
    coalesce(aggregate_id, ''), coalesce(event_type, ''), coalesce(topic, ''), msg_key, %s, headers,
    status, waiting, attempts, next_attempt_at, coalesce(last_error, ''), first_failed_at,
    coalesce(source_lsn::text, ''), commit_time, created_at, updated_at`

func scanEntry(row pgx.Row) (Entry, error) {
	var (
		e       Entry
		status  string
		headers []byte
		lsn     string
		ct      *time.Time
	)
	err := row.Scan(&e.Seq, &e.EventKey, &e.EventID, &e.Aggregate, &e.AggregateType, &e.AggregateID,
		&e.EventType, &e.Topic, &e.Key, &e.Value, &headers, &status, &e.Waiting, &e.Attempts,
		&e.NextAttemptAt, &e.LastError, &e.FirstFailedAt, &lsn, &ct, &e.CreatedAt, &e.UpdatedAt)
	if err != nil {
		return Entry{}, err
	}
	e.Status = Status(status)
	if ct != nil {
		e.CommitTime = *ct
	}
	if lsn != "" {
		if e.SourceLSN, err = pglogrepl.ParseLSN(lsn); err != nil {
			return Entry{}, fmt.Errorf("row %d: source lsn %q: %w", e.Seq, lsn, err)
		}
	}
	if headers != nil {
		var hs []headerJSON
		if err := json.Unmarshal(headers, &hs); err != nil {
			return Entry{}, fmt.Errorf("row %d: headers: %w", e.Seq, err)
		}
		e.Headers = make([]Header, len(hs))
		for i, h := range hs {
			e.Headers[i] = Header{Key: h.Key, Value: []byte(h.Value)}
		}
	}
	return e, nil
}

func collectEntries(rows pgx.Rows) ([]Entry, error) {
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

// List returns the rows f selects in seq order, without their Value (Get has
// it): a listing of many large events stays small.
func (s *Store) List(ctx context.Context, f Filter) ([]Entry, error) {
	var limit *int
	if f.Limit > 0 {
		limit = &f.Limit
	}
	q := fmt.Sprintf(`SELECT `+columns+` FROM %s
WHERE ($1 = '' OR status = $1) AND ($2 = '' OR aggregate_type = $2)
ORDER BY seq LIMIT $3`, "NULL::bytea", s.table)
	rows, err := s.pool.Query(ctx, q, string(f.Status), f.AggregateType, limit)
	if err != nil {
		return nil, fmt.Errorf("list retry table %s: %w", s.name, err)
	}
	entries, err := collectEntries(rows)
	if err != nil {
		return nil, fmt.Errorf("list retry table %s: %w", s.name, err)
	}
	return entries, nil
}

// matchID is the condition that row r is the one an operator's id names: a
// seq number, an event id, or an event key. A seq match wins over an event
// id that happens to be the same number.
const matchID = `(r.seq = CASE WHEN u.id ~ '^[0-9]{1,18}$' THEN u.id::bigint END OR r.event_key = u.id OR r.event_id = u.id)`

// Get returns the row with id (its seq number or its event id), or an error
// wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Entry, error) {
	q := fmt.Sprintf(`SELECT `+columns+` FROM %s r, (SELECT $1::text AS id) u
WHERE `+matchID+`
ORDER BY (r.seq::text = u.id) DESC, r.seq LIMIT 1`, "value", s.table)
	e, err := scanEntry(s.pool.QueryRow(ctx, q, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, &NotFoundError{IDs: []string{id}}
	}
	if err != nil {
		return Entry{}, fmt.Errorf("get retry event %q: %w", id, err)
	}
	return e, nil
}

// resolve maps ids to seq numbers inside tx, failing with a *NotFoundError
// that lists every id without a row.
func (s *Store) resolve(ctx context.Context, tx pgx.Tx, ids []string) ([]int64, error) {
	q := fmt.Sprintf(`SELECT u.id, m.seq FROM unnest($1::text[]) WITH ORDINALITY AS u(id, ord)
LEFT JOIN LATERAL (SELECT r.seq FROM %s r WHERE `+matchID+`
    ORDER BY (r.seq::text = u.id) DESC, r.seq LIMIT 1) m ON true
ORDER BY u.ord`, s.table)
	rows, err := tx.Query(ctx, q, ids)
	if err != nil {
		return nil, err
	}
	var (
		seqs    []int64
		missing []string
		id      string
		seq     *int64
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &seq}, func() error {
		if seq == nil {
			missing = append(missing, id)
		} else {
			seqs = append(seqs, *seq)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, &NotFoundError{IDs: missing}
	}
	return seqs, nil
}

// change runs stmt (with $1 the seq numbers) on the rows ids name, all or
// none: if an id has no row, nothing changes and the error is a
// *NotFoundError.
func (s *Store) change(ctx context.Context, what string, ids []string, stmt string) ([]int64, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	seqs, err := s.resolve(ctx, tx, ids)
	if err != nil {
		var nf *NotFoundError
		if errors.As(err, &nf) {
			return nil, err
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rows, err := tx.Query(ctx, stmt, seqs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	changed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return changed, nil
}

// requeueSet is what a requeue changes: a fresh start, as if the event had
// just failed, except that the last error stays for the operator to see.
const requeueSet = `status = 'pending', next_attempt_at = now(), attempts = 0,
    first_failed_at = now(), updated_at = now()`

// Requeue makes the rows ids name (seq numbers or event ids) pending and due
// now, with attempts 0 and a fresh max-age window, keeping their last error.
// It returns the seq numbers it changed, in ascending order. If an id has no
// row, nothing changes and the error is a *NotFoundError.
func (s *Store) Requeue(ctx context.Context, ids []string) ([]int64, error) {
	return s.change(ctx, "requeue retry events", ids, fmt.Sprintf(`WITH c AS (
    UPDATE %s SET `+requeueSet+` WHERE seq = ANY($1) RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table))
}

// RequeueAllDead requeues every dead row, like Requeue, and returns their seq
// numbers in ascending order.
func (s *Store) RequeueAllDead(ctx context.Context) ([]int64, error) {
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`WITH c AS (
    UPDATE %s SET `+requeueSet+` WHERE status = 'dead' RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table))
	if err != nil {
		return nil, fmt.Errorf("requeue dead retry events: %w", err)
	}
	seqs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("requeue dead retry events: %w", err)
	}
	return seqs, nil
}

// Drop deletes the rows ids name: those events are then never delivered. It
// returns the seq numbers it deleted, in ascending order. If an id has no row,
// nothing changes and the error is a *NotFoundError. The rows behind a
// dropped one become deliverable.
func (s *Store) Drop(ctx context.Context, ids []string) ([]int64, error) {
	return s.change(ctx, "drop retry events", ids, fmt.Sprintf(`WITH c AS (
    DELETE FROM %s WHERE seq = ANY($1) RETURNING seq)
SELECT seq FROM c ORDER BY seq`, s.table))
}
