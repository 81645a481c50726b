package retry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
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
	Table         string    // the outbox table it was read from (event.Event.Table); "" for a message
	Reason        string    // what is wrong and how to fix it, in plain words
	Code          string    // the code of Reason (router's or sink's), for the CLI to say with the config keys; "" for none
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
		Table:         e.Table,
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
	ReasonCode    string // the code of LastError (Event.Code); "" for none and for rows of earlier versions
	FirstFailedAt time.Time
	SourceLSN     pglogrepl.LSN
	CommitTime    time.Time // zero when unknown
	MessageTime   time.Time // zero: the time it is sent
	Table         string    // the outbox table it was read from; "" for a message or a row of an earlier version
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

// A Store reads and writes the rows of one replication slot in the retry
// table: every row it inserts carries the slot's name, and every statement
// it runs (read, claim, delivery, requeue, drop, list, count) touches only
// rows of that slot. Relays of other slots may share the table; relays of
// the same slot (a leader and its standbys) share the rows. It is safe for
// concurrent use.
type Store struct {
	pool  *pgxpool.Pool
	t     sql.Table
	table string // quoted
	name  string // as configured
	slot  string
}

// NewStore returns a Store of slot's rows on table ("table" or
// "schema.table", exact names; default sql.DefaultRetryTable when empty).
// The slot is required: it is the relay's identity in the table. It does not
// check that the table exists: `outbox-relay setup` creates it.
func NewStore(pool *pgxpool.Pool, table, slot string) (*Store, error) {
	if table == "" {
		table = sql.DefaultRetryTable
	}
	t, err := sql.ParseTable(table)
	if err != nil {
		return nil, fmt.Errorf("retry table: %w", err)
	}
	if slot == "" {
		return nil, fmt.Errorf("retry table %s: a store needs the slot whose rows it handles", table)
	}
	return &Store{pool: pool, t: t, table: t.Quoted(), name: table, slot: slot}, nil
}

// Table returns the table's name as configured.
func (s *Store) Table() string { return s.name }

// Slot returns the slot whose rows the Store handles.
func (s *Store) Slot() string { return s.slot }

// Migrate upgrades a retry table made by an earlier version (the
// statements of sql.RetryTable: the last_resort and slot_name columns, the
// indexes led by the slot, the event key unique per slot), creating the
// table if it is missing. Rows of an earlier version have no slot until
// Adopt gives them one. It does nothing, and takes
// no lock, when the table is current, so every relay may call it at start-up;
// concurrent calls wait for each other. It needs the rights to alter the
// table.
func (s *Store) Migrate(ctx context.Context) error {
	idx, oldIdx := sql.RetryIndexes(s.t)
	var current bool
	err := s.pool.QueryRow(ctx, `SELECT c.oid IS NOT NULL
    AND (SELECT count(*) FROM pg_attribute a WHERE a.attrelid = c.oid AND NOT a.attisdropped
        AND a.attname IN ('last_resort', 'message_time', 'outbox_table', 'slot_name')) = 4
    AND (SELECT count(*) FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND ic.relname = ANY($2)) = cardinality($2)
    AND NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_class ic ON ic.oid = i.indexrelid WHERE i.indrelid = c.oid AND ic.relname = ANY($3))
    AND NOT EXISTS (SELECT 1 FROM pg_constraint k JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attname = 'event_key'
        WHERE k.conrelid = c.oid AND k.contype = 'u' AND k.conkey = ARRAY[a.attnum])
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
