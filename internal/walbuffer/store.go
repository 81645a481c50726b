package walbuffer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sql"
)

// DefaultTable is the buffer table's name.
const DefaultTable = sql.DefaultWALBufferTable

// TableFor is the buffer table beside the retry table retry: in its schema,
// named DefaultTable, so that one setting (retry.table) places both.
func TableFor(retry string) (sql.Table, error) {
	if retry == "" {
		retry = sql.DefaultRetryTable
	}
	t, err := sql.ParseTable(retry)
	if err != nil {
		return sql.Table{}, err
	}
	return sql.WALBufferTable(t), nil
}

// CreateTable returns the statements that create the buffer table t, each
// a no-op when it exists (sql.WALBufferTableDDL).
func CreateTable(t sql.Table) []string { return sql.WALBufferTableDDL(t) }

// A Key is a buffered event's place in the WAL: its transaction's commit
// LSN and its position in the transaction. Keys order events as the WAL
// committed them.
type Key struct {
	LSN pglogrepl.LSN
	Pos int
}

// Less reports whether k comes before o.
func (k Key) Less(o Key) bool { return k.LSN < o.LSN || k.LSN == o.LSN && k.Pos < o.Pos }

func (k Key) String() string { return event.PositionKey(k.LSN, k.Pos) }

// An Entry is a buffered event: the envelope as the router made it, and,
// when the router refused it, why (Failure; Event.Topic is then "") and the
// router's code for it (FailureCode, "" when it gave none), which the retry
// row keeps as it does for an event routed without the buffer.
type Entry struct {
	Event       event.Event
	Failure     string
	FailureCode string
}

// Size is what e counts against a page's byte bound: the bytes of its
// event's key and value, as Page and the relay's window count them.
func (e *Entry) Size() int { return len(e.Event.Value) + len(e.Event.Key) }

// Key is where e's event is in the WAL.
func (e *Entry) Key() Key { return Key{LSN: e.Event.CommitLSN, Pos: e.Event.Pos} }

// A DB is what a Store runs its statements on: *pgxpool.Pool.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// A Store reads and writes one slot's rows of the buffer table: every row
// it appends carries the slot's name and every statement touches only that
// slot's rows (relays of other slots may share the table). Safe for
// concurrent use.
type Store struct {
	db   DB
	t    sql.Table
	slot string
}

// NewStore returns a Store of slot's rows in table t. It does not check
// that the table exists (Migrate creates it).
func NewStore(db DB, t sql.Table, slot string) (*Store, error) {
	if slot == "" {
		return nil, errors.New("wal buffer: a store needs the slot whose rows it handles")
	}
	return &Store{db: db, t: t, slot: slot}, nil
}

// Table is the buffer table.
func (s *Store) Table() sql.Table { return s.t }

// Migrate creates the table when it is missing; a no-op without locks when
// it exists.
func (s *Store) Migrate(ctx context.Context) error {
	var exists bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.t.Quoted()).Scan(&exists); err != nil {
		return fmt.Errorf("wal buffer table %s: %w", s.t, err)
	}
	if exists {
		return nil
	}
	for _, stmt := range CreateTable(s.t) {
		if _, err := s.db.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create wal buffer table %s: %w", s.t, err)
		}
	}
	return nil
}

// Append stores entries. It is durable when it returns nil; an entry whose
// key is stored already is left as it is (a transaction read again).
//
// It writes AppendPage entries per statement, each encoded just before its
// statement: a chunk of 10,000 events in one statement held its encoded
// copies twice over (ours and pgx's parameters), ~11 MB at once beside the
// pipeline's window (issue 34, the relay over its memory bound while it
// buffered). The statements commit one by one, in key order: one that
// fails leaves the earlier ones stored, and the caller's retry (or the next
// term's reading the transaction again) stores them again as no-ops; a
// Drainer reading meanwhile sees a prefix in key order, as it would of a
// later Append.
func (s *Store) Append(ctx context.Context, entries []Entry) error {
	for i := range entries {
		if entries[i].Event.CommitLSN == 0 {
			return fmt.Errorf("wal buffer: event %q has no commit LSN", entries[i].Event.ID)
		}
	}
	n := min(len(entries), AppendPage)
	lsns, pos, docs := make([]string, n), make([]int32, n), make([][]byte, n)
	for done := 0; done < len(entries); done += n {
		page := entries[done:min(done+n, len(entries))]
		lsns, pos, docs = lsns[:len(page)], pos[:len(page)], docs[:len(page)]
		for i := range page {
			e := &page[i]
			lsns[i], pos[i], docs[i] = e.Event.CommitLSN.String(), int32(e.Event.Pos), encode(e)
		}
		_, err := s.db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (slot_name, commit_lsn, pos, event)
SELECT $1, l::pg_lsn, p, e FROM unnest($2::text[], $3::int[], $4::bytea[]) AS u(l, p, e)
ON CONFLICT DO NOTHING`, s.t.Quoted()), s.slot, lsns, pos, docs)
		clear(docs) // the encoded copies go with their statement
		if err != nil {
			return fmt.Errorf("append %d events to the wal buffer %s: %w", len(entries), s.t, err)
		}
	}
	return nil
}

// AppendPage is the most entries Append writes with one statement.
const AppendPage = 1000

// Page returns up to limit entries after key after, in key order, and
// stops early once they hold maxBytes of stored copies (0: no limit; the
// first entry is always returned), so that a page of large events does not
// outgrow the relay's memory bound.
func (s *Store) Page(ctx context.Context, after Key, limit, maxBytes int) ([]Entry, error) {
	rows, err := s.db.Query(ctx, fmt.Sprintf(`SELECT event FROM %s
WHERE slot_name = $1 AND (slot_name, commit_lsn, pos) > ($1, $2::pg_lsn, $3)
ORDER BY slot_name, commit_lsn, pos LIMIT $4`, s.t.Quoted()), s.slot, after.LSN.String(), after.Pos, limit)
	if err != nil {
		return nil, fmt.Errorf("read the wal buffer %s: %w", s.t, err)
	}
	defer rows.Close()
	out := make([]Entry, 0, min(limit, DefaultPageSize))
	size := 0
	for rows.Next() {
		if maxBytes > 0 && size >= maxBytes {
			break
		}
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return nil, fmt.Errorf("read the wal buffer %s: %w", s.t, err)
		}
		size += len(doc)
		e, err := decode(doc)
		if err != nil {
			return nil, fmt.Errorf("wal buffer %s: a row cannot be decoded (edited by hand?): %w", s.t, err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the wal buffer %s: %w", s.t, err)
	}
	return out, nil
}

// Delete removes the rows up to and including key upTo, and returns how
// many.
func (s *Store) Delete(ctx context.Context, upTo Key) (int64, error) {
	tag, err := s.db.Exec(ctx, fmt.Sprintf(`DELETE FROM %s
WHERE slot_name = $1 AND (slot_name, commit_lsn, pos) <= ($1, $2::pg_lsn, $3)`, s.t.Quoted()), s.slot, upTo.LSN.String(), upTo.Pos)
	if err != nil {
		return 0, fmt.Errorf("delete delivered rows of the wal buffer %s: %w", s.t, err)
	}
	return tag.RowsAffected(), nil
}

// Any reports whether the slot has rows in the buffer.
func (s *Store) Any(ctx context.Context) (bool, error) {
	var any bool
	err := s.db.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %s WHERE slot_name = $1)`, s.t.Quoted()), s.slot).Scan(&any)
	if err != nil {
		return false, fmt.Errorf("read the wal buffer %s: %w", s.t, err)
	}
	return any, nil
}

// Stats is what the buffer holds of a slot.
type Stats struct {
	Events int64
	Bytes  int64     // of the stored copies
	Oldest time.Time // when the oldest row was buffered; zero when empty
	// OldestLSN is the commit LSN of the oldest buffered event: the
	// transactions retention must keep (their rows are what replay and a
	// refill read); 0 when empty.
	OldestLSN pglogrepl.LSN
}

// Stats reads what the buffer holds of the slot. A missing table holds
// nothing.
func (s *Store) Stats(ctx context.Context) (Stats, error) {
	return stats(ctx, s.db, s.t, s.slot)
}

func stats(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, t sql.Table, slot string) (Stats, error) {
	var st Stats
	var oldest *time.Time
	var lsn *string
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, t.Quoted()).Scan(&exists); err != nil || !exists {
		return Stats{}, err
	}
	err := db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(sum(octet_length(event)), 0)::bigint, min(buffered_at), min(commit_lsn)::text
FROM %s WHERE slot_name = $1`, t.Quoted()), slot).Scan(&st.Events, &st.Bytes, &oldest, &lsn)
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42P01" { // undefined_table
			return Stats{}, nil
		}
		return Stats{}, fmt.Errorf("read the wal buffer %s: %w", t, err)
	}
	if oldest != nil {
		st.Oldest = *oldest
	}
	if lsn != nil {
		if st.OldestLSN, err = pglogrepl.ParseLSN(*lsn); err != nil {
			return Stats{}, err
		}
	}
	return st, nil
}

// ReadStats is Store.Stats for a caller without a Store (lag, status):
// what table t holds of slot; nothing when the table is missing.
func ReadStats(ctx context.Context, db interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}, t sql.Table, slot string) (Stats, error) {
	return stats(ctx, db, t, slot)
}

// RetainedWAL is how many bytes of WAL the slot makes the server keep:
// pg_current_wal_lsn() - restart_lsn. ok is false when the slot has no
// restart_lsn (or is not there), or the server is a standby.
func RetainedWAL(ctx context.Context, db DB, slot string) (bytes int64, ok bool, err error) {
	bytes, _, ok, err = SlotWAL(ctx, db, slot)
	return bytes, ok, err
}

// EnterFraction is the share of the bound at which a blocked relay starts
// buffering. Half: after the switch the slot still holds what the server
// needs to restart decoding (restart_lsn follows the confirmed position
// from one xl_running_xacts record to the next, up to 15 s apart), so the
// other half is the margin for that and for the switch itself.
const EnterFraction = 0.5

// ShouldBuffer reports whether a relay whose delivery is blocked should
// start buffering: its slot retains at least EnterFraction of bound.
func ShouldBuffer(retained, bound int64, blocked bool) bool {
	return bound > 0 && blocked && float64(retained) >= EnterFraction*float64(bound)
}
