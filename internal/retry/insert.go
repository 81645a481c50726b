package retry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

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
	var err error
	if slices.ContainsFunc(events, big) {
		err = s.insertSplit(ctx, events)
	} else {
		_, err = s.insertRows(ctx, s.pool, events)
	}
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

// bigBytes is the size (key and value) from which an event's bytes are sent
// to Postgres on their own (insertBig): the default kafka.batch_bytes, the
// largest event Kafka takes by default, so the events it refuses as too
// large are among them.
const bigBytes = 1 << 20

// big reports whether e's bytes are sent on their own (bigBytes).
func big(e Event) bool { return len(e.Key)+len(e.Value) >= bigBytes }

// insertSplit stores events in one transaction: each big one alone
// (insertBig), the others in statements of the runs between them, in order.
func (s *Store) insertSplit(ctx context.Context, events []Event) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	for len(events) > 0 {
		n := 1
		if big(events[0]) {
			err = s.insertBig(ctx, tx, &events[0])
		} else {
			if n = slices.IndexFunc(events, big); n < 0 {
				n = len(events)
			}
			_, err = s.insertRows(ctx, tx, events[:n])
		}
		if err != nil {
			return err
		}
		events = events[n:]
	}
	return tx.Commit(ctx)
}

// insertBig stores a big event in tx: its row without key and value, then,
// if the row was new, its key and value as the raw parameters of an UPDATE.
// Through pgx's arguments an event's bytes were copied twice (the encoded
// array parameter, then the message on the wire), and a 50 MB event
// refused by Kafka as too large cost 150 MB while it was stored; raw, they
// are copied only into the message on the wire (docs/operating.md#memory).
func (s *Store) insertBig(ctx context.Context, tx pgx.Tx, e *Event) error {
	bare := *e
	bare.Key, bare.Value = nil, nil
	n, err := s.insertRows(ctx, tx, []Event{bare})
	if err != nil || n == 0 {
		return err // n == 0: the row was there already (a read again after a crash)
	}
	// The event's bytes are copied once more below, into the message on
	// the wire. A collection first lets that copy reuse memory the event
	// left behind (the replication connection's read buffer of its
	// message, dropped once the next message is read): without it the
	// three were resident at once, 3 × the event (docs/operating.md#memory).
	// A few milliseconds, once per event of a MiB or more.
	runtime.GC()
	// nil is NULL, as pgx sends a nil []byte; bytea in binary format is
	// the bytes themselves.
	const bytea = 17
	res := tx.Conn().PgConn().ExecParams(ctx,
		fmt.Sprintf(`UPDATE %s SET msg_key = $1, value = $2 WHERE slot_name = $3 AND event_key = $4`, s.table),
		[][]byte{e.Key, e.Value, []byte(s.slot), []byte(e.EventKey)},
		[]uint32{bytea, bytea, 0, 0}, []int16{1, 1, 0, 0}, nil).Read()
	return res.Err
}

// insertRows stores events in one statement, and returns how many rows it
// inserted (events already stored are not).
func (s *Store) insertRows(ctx context.Context, db execer, events []Event) (int64, error) {
	n := len(events)
	var (
		keys, aggs                       = make([]string, n), make([]string, n)
		ids, types, aggIDs, evTypes, tps = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		msgKeys, values                  = make([][]byte, n), make([][]byte, n)
		headers, reasons, lsns, tables   = make([]*string, n), make([]*string, n), make([]*string, n), make([]*string, n)
		codes                            = make([]*string, n)
		commitTimes, msgTimes            = make([]*time.Time, n), make([]*time.Time, n)
		dead, waiting                    = make([]bool, n), make([]bool, n)
	)
	for i, e := range events {
		keys[i], aggs[i] = e.EventKey, e.Aggregate
		ids[i], types[i], aggIDs[i] = nullable(e.EventID), nullable(e.AggregateType), nullable(e.AggregateID)
		evTypes[i], tps[i], reasons[i] = nullable(e.EventType), nullable(e.Topic), nullable(e.Reason)
		msgKeys[i], values[i], tables[i], codes[i] = e.Key, e.Value, nullable(e.Table), nullable(e.Code)
		h, err := encodeHeaders(e.Extra)
		if err != nil {
			return 0, fmt.Errorf("encode headers of event %q: %w", e.EventKey, err)
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
    topic, msg_key, value, headers, status, waiting, next_attempt_at, last_error, source_lsn, commit_time, message_time, outbox_table, slot_name, reason_code)
SELECT k, id, agg, at, aid, et, tp, mk, v, h::jsonb, CASE WHEN d THEN 'dead' ELSE 'pending' END, w, now(), r, l::pg_lsn, ct, mt, ot, $18, rc
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
    $8::bytea[], $9::bytea[], $10::text[], $11::bool[], $12::bool[], $13::text[], $14::text[], $15::timestamptz[], $16::timestamptz[], $17::text[], $19::text[])
    WITH ORDINALITY AS u(k, id, agg, at, aid, et, tp, mk, v, h, d, w, r, l, ct, mt, ot, rc, ord)
ORDER BY ord
ON CONFLICT (slot_name, event_key) DO NOTHING`, s.table)
	tag, err := db.Exec(ctx, q, keys, ids, aggs, types, aggIDs, evTypes, tps,
		msgKeys, values, headers, dead, waiting, reasons, lsns, commitTimes, msgTimes, tables, s.slot, codes)
	return tag.RowsAffected(), err
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
// version (one without the last_resort or slot_name column, or without the
// unique index on (slot_name, event_key)).
func (s *Store) hint(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && (pe.Code == "42703" && (strings.Contains(pe.Message, "last_resort") || strings.Contains(pe.Message, "slot_name")) ||
		pe.Code == "42P10" && strings.Contains(pe.Message, "ON CONFLICT")) {
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
		err := savepoint(ctx, tx, func(db pgx.Tx) error {
			if big(events[i]) {
				return s.insertBig(ctx, db, &events[i])
			}
			_, err := s.insertRows(ctx, db, events[i:i+1])
			return err
		})
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
    status, waiting, next_attempt_at, last_error, source_lsn, commit_time, last_resort, slot_name)
VALUES ($1, $2, $3, $4, $5, $6, $7, 'dead', false, now(), $8, $9::pg_lsn, $10, $11, $12)
ON CONFLICT (slot_name, event_key) DO NOTHING`, s.table)
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
		args := make([]any, 12)
		args[11] = s.slot
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
