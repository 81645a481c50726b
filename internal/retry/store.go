package retry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Status is a row's state: pending rows are retried, dead ones wait for the
// operator.
type Status string

const (
	StatusPending Status = "pending"
	StatusDead    Status = "dead"
)

// A Header is a Kafka header of a stored event: the envelope's.
type Header = event.Header

// An Event is what the pipeline diverts to the retry table. Empty strings,
// a zero SourceLSN and a zero CommitTime are stored as NULL.
//
// Extra are the event's extra headers (event.Event.Extra: the header fields
// and the outbox headers column's); as in the envelope, they never include
// the relay's own. The Worker sends the relay's own (id, event_type,
// aggregate_type) from EventID, EventType and AggregateType with
// router.Headers, which also drops extra entries of those names.
type Event struct {
	EventKey      string // unique and deterministic: event.PositionKey
	EventID       string // sent as header id; the relay's own headers come from these three fields
	Aggregate     string // blocking identity: the event's event.Lane, as a string
	AggregateType string // sent as header aggregate_type
	AggregateID   string
	EventType     string // sent as header event_type
	Topic         string // "" when the event could not be routed
	Key, Value    []byte
	Extra         []Header      // extra headers only (event.Event.Extra), any bytes
	SourceLSN     pglogrepl.LSN // end LSN of the transaction that inserted the event
	CommitTime    time.Time
	MessageTime   time.Time // the message's timestamp (event.Event.Time); zero: when sent
	Reason        string    // what is wrong and how to fix it, in plain words
	Permanent     bool      // will fail the same way again: stored dead at once
	Waiting       bool      // diverted only because an earlier event of the aggregate is in the table
}

// NewEvent is the retry row of the envelope e, in e's ordering lane: keyed
// by its place in the WAL, never by its data, with its extra headers only
// (the Worker adds the relay's own from the row's columns, as the router
// does).
func NewEvent(e *event.Event) Event {
	return Event{
		EventKey:      e.PositionKey(),
		EventID:       e.ID,
		Aggregate:     e.Lane().String(),
		AggregateType: e.AggregateType,
		AggregateID:   e.AggregateID,
		EventType:     e.Type,
		Topic:         e.Topic,
		Key:           e.Key,
		Value:         e.Value,
		Extra:         e.Extra,
		SourceLSN:     e.CommitLSN,
		CommitTime:    e.CommitTime,
		MessageTime:   e.Time,
	}
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
	Extra         []Header // extra headers (event.Event.Extra); older rows may hold id, event_type, aggregate_type too
	Status        Status
	Waiting       bool
	Attempts      int
	NextAttemptAt time.Time
	LastError     string
	FirstFailedAt time.Time
	SourceLSN     pglogrepl.LSN
	CommitTime    time.Time // zero when unknown
	MessageTime   time.Time // zero: the time it is sent
	CreatedAt     time.Time
	UpdatedAt     time.Time
	// LastResort is true for a row that holds the event only as a document
	// (see Store.Insert): the relay never delivers it. Get fills the fields
	// above from the document; List leaves out what only it holds.
	LastResort bool

	// unreadable says why the stored row cannot be decoded (headers or
	// document edited by hand); the Worker sends such a row dead.
	unreadable string
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
	t     sql.Table
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
	return &Store{pool: pool, t: t, table: t.Quoted(), name: table}, nil
}

// Table returns the table's name as configured.
func (s *Store) Table() string { return s.name }

// Migrate upgrades a retry table made by an earlier version (the
// statements of sql.RetryTable: the last_resort column, the index on
// md5(aggregate) instead of one on the aggregate's text, which refused long
// aggregates), creating the table if it is missing. It does nothing, and takes
// no lock, when the table is current, so every relay may call it at start-up;
// concurrent calls wait for each other. It needs the rights to alter the
// table.
func (s *Store) Migrate(ctx context.Context) error {
	idx, oldIdx := sql.RetryAggregateIndex(s.t)
	var current bool
	err := s.pool.QueryRow(ctx, `SELECT c.oid IS NOT NULL
    AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_resort' AND NOT a.attisdropped)
    AND EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND ic.relname = $2)
    AND NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND ic.relname = $3)
FROM (SELECT to_regclass($1)::oid AS oid) c`, s.t.Quoted(), idx, oldIdx).Scan(&current)
	if err != nil {
		return fmt.Errorf("check retry table %s: %w", s.name, err)
	}
	if current {
		return nil
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("upgrade retry table %s: %w", s.name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// Two relays starting together would otherwise race on the catalog.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "outbox-relay retry table "+s.t.Quoted()); err != nil {
		return fmt.Errorf("upgrade retry table %s: %w", s.name, err)
	}
	for _, stmt := range sql.RetryTable(s.t) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("upgrade retry table %s: %w", s.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("upgrade retry table %s: %w", s.name, err)
	}
	return nil
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// Insert stores events, in the given order (seq follows it). An event whose
// EventKey is already in the table is left as it is, so inserting again what
// a crash made the pipeline read again changes nothing. The rows are durable
// when Insert returns nil. Permanent events are stored dead; the others
// pending and due at once, with attempts 0: the retry worker counts its own
// attempts.
//
// Every event is stored, whatever it holds. When Postgres refuses the values
// themselves (a data exception, a program limit such as an index entry too
// large, an integrity or trigger error: see dataFault), Insert stores the
// events one by one, and an event that is refused again becomes a
// last-resort record: a dead row of the same aggregate (so it still blocks
// the events behind it) whose last_resort column holds the whole event as a
// JSON document, with a last_error telling the operator what to do. The
// relay never delivers such a row. All of this is one transaction: seq
// still follows the input.
//
// An error that is not the data's fault (connection lost, permission
// denied, table missing, …) is returned: nothing was stored, and the caller
// retries.
func (s *Store) Insert(ctx context.Context, events []Event) error {
	if len(events) == 0 {
		return nil
	}
	for i, e := range events {
		if e.EventKey == "" || e.Aggregate == "" {
			return fmt.Errorf("insert retry event %d: event key and aggregate are required", i)
		}
	}
	err := s.insertRows(ctx, s.pool, events)
	if err != nil && dataFault(err) {
		err = s.insertEach(ctx, events)
	}
	if err != nil {
		return fmt.Errorf("insert into retry table %s: %w", s.name, s.hint(err))
	}
	return nil
}

type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// insertRows stores events in one statement.
func (s *Store) insertRows(ctx context.Context, db execer, events []Event) error {
	n := len(events)
	var (
		keys, aggs                       = make([]string, n), make([]string, n)
		ids, types, aggIDs, evTypes, tps = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		msgKeys, values                  = make([][]byte, n), make([][]byte, n)
		headers, reasons, lsns           = make([]*string, n), make([]*string, n), make([]*string, n)
		commitTimes, msgTimes            = make([]*time.Time, n), make([]*time.Time, n)
		dead, waiting                    = make([]bool, n), make([]bool, n)
	)
	for i, e := range events {
		keys[i], aggs[i] = e.EventKey, e.Aggregate
		ids[i], types[i], aggIDs[i] = nullable(e.EventID), nullable(e.AggregateType), nullable(e.AggregateID)
		evTypes[i], tps[i], reasons[i] = nullable(e.EventType), nullable(e.Topic), nullable(e.Reason)
		msgKeys[i], values[i] = e.Key, e.Value
		h, err := encodeHeaders(e.Extra)
		if err != nil {
			return fmt.Errorf("encode headers of event %q: %w", e.EventKey, err)
		}
		headers[i] = h
		if e.SourceLSN != 0 {
			lsns[i] = nullable(e.SourceLSN.String())
		}
		if !e.CommitTime.IsZero() {
			ct := e.CommitTime
			commitTimes[i] = &ct
		}
		if !e.MessageTime.IsZero() {
			mt := e.MessageTime
			msgTimes[i] = &mt
		}
		dead[i], waiting[i] = e.Permanent, e.Waiting && !e.Permanent
	}
	// INSERT … SELECT … ORDER BY draws the serial in the order of the sorted
	// rows, so seq follows the slice.
	q := fmt.Sprintf(`INSERT INTO %s (event_key, event_id, aggregate, aggregate_type, aggregate_id, event_type,
    topic, msg_key, value, headers, status, waiting, next_attempt_at, last_error, source_lsn, commit_time, message_time)
SELECT k, id, agg, at, aid, et, tp, mk, v, h::jsonb, CASE WHEN d THEN 'dead' ELSE 'pending' END, w, now(), r, l::pg_lsn, ct, mt
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
    $8::bytea[], $9::bytea[], $10::text[], $11::bool[], $12::bool[], $13::text[], $14::text[], $15::timestamptz[], $16::timestamptz[])
    WITH ORDINALITY AS u(k, id, agg, at, aid, et, tp, mk, v, h, d, w, r, l, ct, mt, ord)
ORDER BY ord
ON CONFLICT (event_key) DO NOTHING`, s.table)
	_, err := db.Exec(ctx, q, keys, ids, aggs, types, aggIDs, evTypes, tps,
		msgKeys, values, headers, dead, waiting, reasons, lsns, commitTimes, msgTimes)
	return err
}

// dataFault reports whether err is Postgres refusing the values it was
// given, so that the same statement would fail again however often it is
// retried: SQLSTATE class 22 (data exception: invalid UTF-8, NUL, a value out
// of range, …), 23 (integrity: a constraint other than the ON CONFLICT
// target, such as a CHECK an operator added), 54 (program limit exceeded:
// an index entry or a row too large, too many …) and P0 (a trigger's RAISE).
// Other errors (connection, permission, missing table or column, lock
// timeouts, shutdown) are not the data's: retrying later is the cure.
func dataFault(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || len(pe.Code) != 5 {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23", "54", "P0":
		return true
	}
	return false
}

// hint adds what to do to an error caused by a table from an earlier
// version (one without the last_resort column).
func (s *Store) hint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42703" && strings.Contains(pe.Message, "last_resort") {
		return fmt.Errorf("%w (the retry table was made by an earlier version: upgrade it with `outbox-relay setup` or sql/004_retry.sql)", err)
	}
	return err
}

// insertEach stores events one statement each, in one transaction, turning
// each that Postgres refuses into a last-resort record. It fails only for
// errors that are not the data's fault, storing nothing.
func (s *Store) insertEach(ctx context.Context, events []Event) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for i := range events {
		err := savepoint(ctx, tx, func(db pgx.Tx) error { return s.insertRows(ctx, db, events[i:i+1]) })
		if err == nil {
			continue
		}
		if !dataFault(err) {
			return err
		}
		if err := s.insertLastResort(ctx, tx, &events[i], err); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// savepoint runs f in a savepoint of tx, rolling back to it if f fails, so
// that tx can go on.
func savepoint(ctx context.Context, tx pgx.Tx, f func(pgx.Tx) error) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if err := f(sp); err != nil {
		if rerr := sp.Rollback(ctx); rerr != nil {
			return rerr // the connection is gone: not the data's fault
		}
		return err
	}
	return sp.Commit(ctx)
}

// maxKey bounds the event_key of a last-resort record: the unique index on
// it must take it whatever the event's key was.
const maxKey = 256

// lastResortKey is the event_key of e's last-resort record: its own key when
// that is short and plain (so `retries show <key>` finds it), else a digest
// of it, which a resend after a crash reproduces.
func lastResortKey(key string, ascii bool) string {
	if len(key) <= maxKey && storable(key) && (!ascii || isPrintableASCII(key)) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// insertLastResort stores e as a last-resort record, after its row was
// refused with cause. It tries, each in a savepoint, ever fewer columns that
// could refuse it: the readable ones that are storable, then only those the
// table needs, then those as printable ASCII (for databases whose encoding
// lacks a character). Only the last can change the aggregate (escaped):
// then later events of the aggregate are not held behind it once the relay
// restarts, and last_error says so.
func (s *Store) insertLastResort(ctx context.Context, tx pgx.Tx, e *Event, cause error) error {
	doc, err := encodeDocument(e, cause)
	if err != nil {
		return fmt.Errorf("encode last-resort record of event %q: %w", e.EventKey, err)
	}
	q := fmt.Sprintf(`INSERT INTO %s (event_key, aggregate, event_id, aggregate_type, aggregate_id, event_type, topic,
    status, waiting, next_attempt_at, last_error, source_lsn, commit_time, last_resort)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'dead', false, now(), $8, $9::pg_lsn, $10, $11)
ON CONFLICT (event_key) DO NOTHING`, s.table)
	text := func(v string) *string {
		if !storable(v) {
			return nil
		}
		return nullable(v)
	}
	var refused error
	for try := range 3 {
		ascii := try == 2
		key, agg := lastResortKey(e.EventKey, ascii), e.Aggregate
		args := make([]any, 11)
		if ascii && !isPrintableASCII(agg) {
			agg = "ascii:" + strconv.QuoteToASCII(agg)
		}
		args[0], args[1] = key, agg
		if try == 0 {
			args[2], args[3], args[4], args[5], args[6] = text(e.EventID), text(e.AggregateType),
				text(e.AggregateID), text(e.EventType), text(e.Topic)
			if e.SourceLSN != 0 {
				args[8] = e.SourceLSN.String()
			}
			if !e.CommitTime.IsZero() {
				args[9] = e.CommitTime
			}
		}
		msg := lastResortError(key, agg != e.Aggregate, cause, e.Reason)
		if ascii {
			msg = asciiOnly(msg)
		}
		args[7], args[10] = msg, doc
		err := savepoint(ctx, tx, func(db pgx.Tx) error {
			_, err := db.Exec(ctx, q, args...)
			return err
		})
		if err == nil {
			return nil
		}
		if !dataFault(err) {
			return err
		}
		refused = err
	}
	return fmt.Errorf("event %q: the retry table refused its row (%v) and its last-resort record (%w): check the table's triggers and constraints", e.EventKey, cause, refused)
}

// lastResortError is the last_error of a last-resort record: what happened,
// in plain words, and what the operator does.
func lastResortError(key string, escaped bool, cause error, reason string) string {
	msg := fmt.Sprintf("last-resort record: the retry table refused this event's row (%v), so the whole event is kept "+
		"as a JSON document in column last_resort and the relay will never deliver it (requeueing does not change that); "+
		"it blocks later events of its aggregate until dropped. Inspect it with `outbox-relay retries show %s`, "+
		"then deliver it by hand, or fix the cause and insert the event into the outbox again, and drop this row",
		cause, key)
	if escaped {
		msg += ". Its aggregate could only be stored escaped: after a restart the relay no longer holds later events of the aggregate behind it"
	}
	if reason != "" {
		msg += ". It had come here because: " + reason
	}
	// It must be storable itself.
	return strings.ReplaceAll(strings.ToValidUTF8(msg, "\uFFFD"), "\x00", `\x00`)
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

// sameAggregate is the condition that row r belongs to aggregate a, written
// so that the (md5(aggregate), seq) index serves it; comparing the text too
// makes an md5 collision cost a little speed only.
func sameAggregate(r, a string) string {
	return fmt.Sprintf("md5(%[1]s.aggregate) = md5(%[2]s) AND %[1]s.aggregate = %[2]s", r, a)
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
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT u.a FROM unnest($1::text[]) AS u(a)
WHERE EXISTS (SELECT 1 FROM %s r WHERE %s)`, s.table, sameAggregate("r", "u.a")), aggregates)
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

// Held reports which of evs the table already holds as the same message:
// a row with the same event id, aggregate, event type and value, whatever
// its status or key. A refill asks, so that an event the stream already
// stored here (a dead letter an operator has yet to handle, or a row still
// being retried) is not stored or sent a second time. The answer is by
// index into evs; an event without an id is never held (nothing tells two
// of them apart). Rows whose event key starts with exceptKeys ("" for none)
// are not looked at: the refill's own, which are other rows of the outbox
// even when identical.
func (s *Store) Held(ctx context.Context, evs []event.Event, exceptKeys string) (map[int]bool, error) {
	var idx []int
	var ids, aggs, types []string
	var values [][]byte
	for i := range evs {
		e := &evs[i]
		if e.ID == "" {
			continue
		}
		idx = append(idx, i)
		ids = append(ids, event.PlainText(e.ID))
		aggs = append(aggs, e.Lane().String())
		types = append(types, event.PlainText(e.Type))
		values = append(values, e.Value)
	}
	out := map[int]bool{}
	if len(idx) == 0 {
		return out, nil
	}
	// One row per candidate (ordinality), matched on the md5(aggregate)
	// index; the value compared whole, NULL equal to NULL.
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT u.n - 1 FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[]) WITH ORDINALITY AS u(id, a, t, v, n)
WHERE EXISTS (SELECT 1 FROM %s r WHERE %s AND r.event_id = u.id
  AND coalesce(r.event_type, '') = u.t AND r.value IS NOT DISTINCT FROM u.v
  AND ($5 = '' OR left(r.event_key, length($5)) <> $5))`, s.table, sameAggregate("r", "u.a")), ids, aggs, types, values, exceptKeys)
	if err != nil {
		return nil, fmt.Errorf("read the retry table: %w", s.hint(err))
	}
	found, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("read the retry table: %w", err)
	}
	for _, n := range found {
		out[idx[n]] = true
	}
	return out, nil
}

// A Filter selects rows for List. Zero values select everything.
type Filter struct {
	Status        Status // "" for both
	AggregateType string
	Limit         int // 0 for no limit
}

// columns returns the Entry fields in scan order. Without body, the value
// and the last-resort document are left out (NULL): a listing of many large
// events stays small.
func columns(body bool) string {
	value, doc := "NULL::bytea", "NULL::bytea"
	if body {
		value, doc = "value", "last_resort"
	}
	return `seq, event_key, coalesce(event_id, ''), aggregate, coalesce(aggregate_type, ''),
    coalesce(aggregate_id, ''), coalesce(event_type, ''), coalesce(topic, ''), msg_key, ` + value + `, headers,
    status, waiting, attempts, next_attempt_at, coalesce(last_error, ''), first_failed_at,
    coalesce(source_lsn::text, ''), commit_time, message_time, created_at, updated_at, last_resort IS NOT NULL, ` + doc
}

// scanEntry reads a row selected with columns. Stored content that cannot be
// decoded (headers or a document edited by hand) does not fail it: a row
// that cannot be read must not stop the listing or the Worker, which sends
// it dead (Entry.unreadable).
func scanEntry(row pgx.Row) (Entry, error) {
	var (
		e       Entry
		status  string
		headers []byte
		lsn     string
		ct, mt  *time.Time
		doc     []byte
	)
	err := row.Scan(&e.Seq, &e.EventKey, &e.EventID, &e.Aggregate, &e.AggregateType, &e.AggregateID,
		&e.EventType, &e.Topic, &e.Key, &e.Value, &headers, &status, &e.Waiting, &e.Attempts,
		&e.NextAttemptAt, &e.LastError, &e.FirstFailedAt, &lsn, &ct, &mt, &e.CreatedAt, &e.UpdatedAt,
		&e.LastResort, &doc)
	if err != nil {
		return Entry{}, err
	}
	e.Status = Status(status)
	if ct != nil {
		e.CommitTime = *ct
	}
	if mt != nil {
		e.MessageTime = *mt
	}
	if lsn != "" {
		if e.SourceLSN, err = pglogrepl.ParseLSN(lsn); err != nil {
			return Entry{}, fmt.Errorf("row %d: source lsn %q: %w", e.Seq, lsn, err)
		}
	}
	if headers != nil {
		if e.Extra, err = decodeHeaders(headers); err != nil {
			e.unreadable = fmt.Sprintf("its stored headers cannot be decoded (%v)", err)
		}
	}
	if doc != nil {
		d, err := decodeDocument(doc)
		if err == nil {
			err = d.fill(&e)
		}
		if err != nil {
			e.unreadable = fmt.Sprintf("its last-resort document cannot be decoded (%v)", err)
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
	q := fmt.Sprintf(`SELECT %s FROM %s
WHERE ($1 = '' OR status = $1) AND ($2 = '' OR aggregate_type = $2)
ORDER BY seq LIMIT $3`, columns(false), s.table)
	rows, err := s.pool.Query(ctx, q, string(f.Status), f.AggregateType, limit)
	if err != nil {
		return nil, fmt.Errorf("list retry table %s: %w", s.name, s.hint(err))
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
	q := fmt.Sprintf(`SELECT %s FROM %s r, (SELECT $1::text AS id) u
WHERE `+matchID+`
ORDER BY (r.seq::text = u.id) DESC, r.seq LIMIT 1`, columns(true), s.table)
	e, err := scanEntry(s.pool.QueryRow(ctx, q, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, &NotFoundError{IDs: []string{id}}
	}
	if err != nil {
		return Entry{}, fmt.Errorf("get retry event %q: %w", id, s.hint(err))
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
