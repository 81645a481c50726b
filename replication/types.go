package replication

import (
	"time"

	"github.com/jackc/pglogrepl"
)

// A Relation is a table as announced by pgoutput's Relation message. A Relation
// is immutable once published: a new Relation message (after ALTER TABLE)
// replaces the cache entry with a new value, so a Row keeps describing the
// columns it was decoded with.
type Relation struct {
	ID        uint32
	Namespace string
	Name      string
	Columns   []Column
}

// A Column of a Relation.
type Column struct {
	Name    string
	TypeOID uint32
	// TypeMod is the type modifier (atttypmod): a timestamp's or time's
	// precision, a numeric's precision and scale; -1 when none.
	TypeMod int32
}

// A Row is one inserted tuple. Values are in pgoutput's text format, one per
// column of Relation, and nil for SQL NULL. The bytes are owned by the Row (copied
// out of the connection's read buffer).
//
// A Row that carries a logical decoding message (Message set) has no
// Relation and no Values: it stands in the transaction where the message was
// emitted, so that it keeps its place among the inserts.
type Row struct {
	Relation *Relation
	Values   [][]byte
	Message  *Message
}

// A Message is a transactional logical decoding message
// (pg_logical_emit_message(true, prefix, content)) with one of the prefixes
// the stream asked for (Config.MessagePrefixes). Its bytes are owned by the
// Message.
type Message struct {
	Prefix  string
	Content []byte
	LSN     pglogrepl.LSN // where it was written in the WAL
}

// Size is what the row counts against batch and in-flight byte budgets: its
// values, or its message's content.
func (r *Row) Size() int {
	if r.Message != nil {
		return len(r.Message.Content)
	}
	n := 0
	for _, v := range r.Values {
		n += len(v)
	}
	return n
}

// A Batch holds the inserts of one committed transaction, in WAL order.
//
// With pgoutput proto_version 1 the server sends a transaction only after it has
// committed, so rows may be handed on before its Commit message arrives: a large
// transaction arrives as several Batches that share CommitLSN, and only the last
// one has Last set and carries EndLSN. Only a Last batch's EndLSN may ever be
// confirmed. A transaction whose only changes are ignored (UPDATE/DELETE/TRUNCATE
// on the outbox, or messages of other prefixes) still yields one Last batch with
// no rows, so that it is confirmed.
type Batch struct {
	Xid        uint32
	CommitLSN  pglogrepl.LSN // LSN of the commit record (the Begin message's FinalLSN)
	CommitTime time.Time
	EndLSN     pglogrepl.LSN // end of the commit record; set only when Last
	Last       bool
	Rows       []Row
	Bytes      int // sum of len(Values) over Rows: for in-flight byte budgets
}
