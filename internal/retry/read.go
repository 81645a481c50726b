package retry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/event"
)

// Aggregates returns up to limit of the aggregates that have rows of the
// slot in the table, pending or dead (a dead row blocks its aggregate too),
// sorted; limit 0 means all of them. The pipeline diverts new events of these
// aggregates here, behind them; it asks for one more than it holds, to learn
// whether there are more.
func (s *Store) Aggregates(ctx context.Context, limit int) ([]string, error) {
	var max *int
	if limit > 0 {
		max = &limit
	}
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT aggregate FROM %s WHERE slot_name = $1 ORDER BY 1 LIMIT $2`, s.table), s.slot, max)
	if err != nil {
		return nil, fmt.Errorf("read retry aggregates: %w", s.hint(err))
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

// Undelivered reports, for each of aggregates, whether it still has rows of
// the slot in the table. Every aggregate asked for is a key of the result.
func (s *Store) Undelivered(ctx context.Context, aggregates []string) (map[string]bool, error) {
	out := make(map[string]bool, len(aggregates))
	for _, a := range aggregates {
		out[a] = false
	}
	if len(aggregates) == 0 {
		return out, nil
	}
	rows, err := s.pool.Query(ctx, fmt.Sprintf(`SELECT u.a FROM unnest($1::text[]) AS u(a)
WHERE EXISTS (SELECT 1 FROM %s r WHERE r.slot_name = $2 AND %s)`, s.table, sameAggregate("r", "u.a")), aggregates, s.slot)
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

// CountKeys counts the slot's rows whose event key starts with prefix: a
// refill's rows ("refill:<id>:"), parked or refused.
func (s *Store) CountKeys(ctx context.Context, prefix string) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM `+s.table+` WHERE slot_name = $1 AND starts_with(event_key, $2)`, s.slot, prefix).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the rows of retry table %s with keys %s…: %w", s.name, prefix, err)
	}
	return n, nil
}

// Held reports which of evs the slot's rows already hold as the same message:
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
WHERE EXISTS (SELECT 1 FROM %s r WHERE r.slot_name = $6 AND %s AND r.event_id = u.id
  AND coalesce(r.event_type, '') = u.t AND r.value IS NOT DISTINCT FROM u.v
  AND ($5 = '' OR left(r.event_key, length($5)) <> $5))`, s.table, sameAggregate("r", "u.a")), ids, aggs, types, values, exceptKeys, s.slot)
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

// A Filter selects rows of the Store's slot for List. Zero values select
// every row of the slot.
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
    coalesce(source_lsn::text, ''), commit_time, message_time, created_at, updated_at, last_resort IS NOT NULL, ` + doc + `,
    coalesce(outbox_table, ''), coalesce(reason_code, '')`
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
		&e.LastResort, &doc, &e.Table, &e.ReasonCode)
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

// List returns the slot's rows f selects in seq order, without their Value (Get has
// it): a listing of many large events stays small.
func (s *Store) List(ctx context.Context, f Filter) ([]Entry, error) {
	var limit *int
	if f.Limit > 0 {
		limit = &f.Limit
	}
	q := fmt.Sprintf(`SELECT %s FROM %s
WHERE slot_name = $4 AND ($1 = '' OR status = $1) AND ($2 = '' OR aggregate_type = $2)
ORDER BY seq LIMIT $3`, columns(false), s.table)
	rows, err := s.pool.Query(ctx, q, string(f.Status), f.AggregateType, limit, s.slot)
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
// seq number, an event id, or an event key, among the rows of the slot
// given as $2 (an id of another slot's row names nothing). A seq match wins
// over an event id that happens to be the same number.
const matchID = `r.slot_name = $2 AND (r.seq = CASE WHEN u.id ~ '^[0-9]{1,18}$' THEN u.id::bigint END OR r.event_key = u.id OR r.event_id = u.id)`

// Get returns the slot's row with id (its seq number or its event id), or an
// error wrapping ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Entry, error) {
	q := fmt.Sprintf(`SELECT %s FROM %s r, (SELECT $1::text AS id) u
WHERE `+matchID+`
ORDER BY (r.seq::text = u.id) DESC, r.seq LIMIT 1`, columns(true), s.table)
	e, err := scanEntry(s.pool.QueryRow(ctx, q, id, s.slot))
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, &NotFoundError{IDs: []string{id}}
	}
	if err != nil {
		return Entry{}, fmt.Errorf("get retry event %q: %w", id, s.hint(err))
	}
	return e, nil
}
