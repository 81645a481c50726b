package replication

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
)

// counters are the Stream's statistics, written by Run's goroutine and read by
// Stats from any goroutine.
type counters struct {
	transactions     atomic.Uint64
	rows             atomic.Uint64
	ignoredUpdates   atomic.Uint64
	ignoredDeletes   atomic.Uint64
	ignoredTruncates atomic.Uint64
	messages         atomic.Uint64    // transactional messages with a configured prefix, emitted
	otherMessages    atomic.Uint64    // messages with other prefixes, skipped
	nonTransactional atomic.Uint64    // non-transactional messages with a configured prefix, skipped
	unsolicited      [2]atomic.Uint64 // by unsolicited kind
	skipped          atomic.Uint64
	reconnects       atomic.Uint64
	pauses           atomic.Uint64
	pausedSince      atomic.Int64 // unix nanoseconds; 0 while not paused
	serverWALEnd     atomic.Uint64
	lastMessageAt    atomic.Int64 // unix nanoseconds
	streaming        atomic.Bool
	// The last transaction a row came of (Stats.Reading): its commit LSN,
	// 0 before any, and its rows and their bytes emitted so far.
	readingCommit atomic.Uint64
	readingRows   atomic.Int64
	readingBytes  atomic.Int64
}

// ignored kinds, for logging each once per Run.
const (
	kindUpdate = iota
	kindDelete
	kindTruncate
)

var kindNames = [...]string{"UPDATE", "DELETE", "TRUNCATE"}

// Unsolicited kinds: messages proto_version 1 does not send, skipped where
// that is safe (see the package doc), for logging each once per Run.
const (
	unsolicitedStreamAbort = iota
	unsolicitedUnknown
)

// assembler turns pgoutput messages into Batches. It is the deterministic core
// of the stream: no I/O, no clock, no goroutines, so it is tested on byte
// fixtures without a server. It is owned by Run's goroutine.
//
// A Batch it returns counts as emitted: the caller must deliver it (or stop
// Run). What was emitted survives reset, which is how a reconnect drops what
// the server sends again.
type assembler struct {
	maxRows  int
	maxBytes int
	start    pglogrepl.LSN // transactions with CommitLSN < start are skipped
	log      *slog.Logger
	stats    *counters

	relations map[uint32]*Relation
	hdrs      slab

	readingNamed bool // the open transaction is Stats.Reading's (its first row came)

	prefixes        map[string]bool // Config.MessagePrefixes
	ignoreNonTxn    bool            // Config.NonTransactional is ignore
	nonTxnLogged    bool
	otherPrefixSeen bool

	// The open transaction.
	open     bool
	skip     bool // drop the whole transaction: already delivered
	dropRows int  // rows of a partly emitted transaction still to drop
	txnRows  int  // rows of this transaction emitted so far, across connections
	cur      Batch

	// What has been emitted; kept across reset.
	lastEnd       pglogrepl.LSN // EndLSN of the last emitted Last batch
	partialCommit pglogrepl.LSN // CommitLSN of a transaction emitted only partly, or 0
	partialRows   int           // rows of it emitted
	// next is what the batch handle returned last makes of them once the
	// stream has handed it on (emitted): a batch the stream could not hand
	// on (its connection ended first, a Restart) was not emitted, and the
	// server's resend of its transaction must not be taken for a repeat.
	next emission

	skippedStart  int  // transactions skipped because CommitLSN < start
	startLogged   bool // skippedStart is logged once per Run
	skippedResent int  // transactions dropped after a reconnect, not yet logged
	ignoredLogged [3]bool

	unsolicitedLogged [2]bool
	// unknownSeen: a message of an unknown type was skipped and no Begin has
	// come since. Until one does, the stream is not idle, so no keepalive's
	// WAL end is confirmed past a message whose meaning the relay does not
	// know. Kept across reset: the server sends it again if it matters.
	unknownSeen bool
}

// emission is the emitted state a batch moves the assembler to.
type emission struct {
	set                    bool
	lastEnd, partialCommit pglogrepl.LSN
	partialRows            int
}

// emitted records that the batch handle returned last was handed on: only
// then is it what a reconnect's resend repeats (DESIGN invariant 1: a
// batch lost before it reached the pipeline is read again, never skipped).
func (a *assembler) emitted() {
	n := a.next
	if !n.set {
		return
	}
	a.lastEnd, a.partialCommit, a.partialRows = n.lastEnd, n.partialCommit, n.partialRows
	a.next = emission{}
}

func newAssembler(cfg Config, start pglogrepl.LSN, stats *counters) *assembler {
	a := &assembler{
		maxRows:      cfg.MaxBatchRows,
		maxBytes:     cfg.MaxBatchBytes,
		start:        start,
		log:          cfg.Logger,
		stats:        stats,
		relations:    make(map[uint32]*Relation),
		ignoreNonTxn: cfg.NonTransactional == NonTransactionalIgnore,
	}
	if len(cfg.MessagePrefixes) > 0 {
		a.prefixes = make(map[string]bool, len(cfg.MessagePrefixes))
		for _, p := range cfg.MessagePrefixes {
			a.prefixes[p] = true
		}
	}
	return a
}

// reset forgets the connection's state: the open transaction (the server sends
// it again from its Begin) and the relation cache (a new walsender sends every
// Relation again before using it).
func (a *assembler) reset() {
	a.open, a.skip, a.dropRows, a.txnRows = false, false, 0, 0
	a.cur = Batch{}
	a.next = emission{} // not handed on: the server sends it again
	a.relations = make(map[uint32]*Relation)
}

// idle reports whether no transaction is open or partly emitted, so that (once
// lastEnd is confirmed) the server's WAL end may be confirmed.
func (a *assembler) idle() bool { return !a.open && a.partialCommit == 0 && !a.unknownSeen }

// handle decodes one pgoutput message that started at lsn and returns a Batch
// when one is ready. Errors are *DecodeError, except for a gap in what the
// server resent after a reconnect.
func (a *assembler) handle(lsn pglogrepl.LSN, msg []byte) (Batch, bool, error) {
	b, ok, err := a.handleMsg(lsn, msg)
	if err != nil {
		var gap *gapError
		var nt *NonTransactionalError
		if errors.As(err, &gap) || errors.As(err, &nt) {
			return Batch{}, false, err
		}
		return Batch{}, false, &DecodeError{LSN: lsn, Err: err}
	}
	return b, ok, nil
}

// gapError: the server did not resend a transaction that was emitted only
// partly. It cannot happen unless something else moved the slot.
type gapError struct{ commit, next pglogrepl.LSN }

func (e *gapError) Error() string {
	return fmt.Sprintf("transaction committed at %s was emitted only partly and not resent (next commit %s): was the slot advanced by another client?", e.commit, e.next)
}

func (a *assembler) handleMsg(lsn pglogrepl.LSN, msg []byte) (Batch, bool, error) {
	if len(msg) == 0 {
		return Batch{}, false, errors.New("empty message")
	}
	body := msg[1:]
	switch t := msg[0]; t {
	case 'B':
		return Batch{}, false, a.begin(body)
	case 'C':
		return a.commit(body)
	case 'I':
		return a.insert(body)
	case 'R':
		rel, err := parseRelation(body)
		if err != nil {
			return Batch{}, false, err
		}
		a.relations[rel.ID] = rel
		return Batch{}, false, nil
	case 'U', 'D':
		if err := a.inTxn(t); err != nil {
			return Batch{}, false, err
		}
		id, err := parseRelID(body)
		if err != nil {
			return Batch{}, false, fmt.Errorf("%c: %w", t, err)
		}
		if t == 'U' {
			a.ignore(kindUpdate, &a.stats.ignoredUpdates, id)
		} else {
			a.ignore(kindDelete, &a.stats.ignoredDeletes, id)
		}
		return Batch{}, false, nil
	case 'T':
		if err := a.inTxn(t); err != nil {
			return Batch{}, false, err
		}
		ids, err := parseTruncate(body)
		if err != nil {
			return Batch{}, false, err
		}
		for _, id := range ids {
			a.ignore(kindTruncate, &a.stats.ignoredTruncates, id)
		}
		return Batch{}, false, nil
	case 'M':
		return a.message(lsn, body)
	case 'Y', 'O':
		// Type (only for non-built-in types, values are text anyway) and
		// Origin carry nothing the relay forwards.
		return Batch{}, false, nil
	case 'A':
		return Batch{}, false, a.streamAbort(body)
	case 'S', 'E', 'c':
		return Batch{}, false, unrequested(t, "streaming of in-progress transactions")
	case 'b', 'P', 'K', 'r', 'p':
		return Batch{}, false, unrequested(t, "two-phase commit decoding")
	default:
		return Batch{}, false, a.unknown(t)
	}
}

// streamAbort skips a Stream Abort. Proto_version 1 never asked for
// streaming, so no row of the aborted (sub)transaction reached the relay
// (a Stream Start would have stopped it): there is nothing to discard, and
// the message carries no row. Postgres 18 sends such aborts for large
// aborted transactions it never streamed (see the package doc). Inside a
// transaction it cannot come from that path, and the relay would not know
// what it retracts: stop there.
func (a *assembler) streamAbort(body []byte) error {
	r := reader{b: body}
	xid, subxid := r.u32(), r.u32()
	if r.err != nil {
		return fmt.Errorf("stream abort: %w", r.err)
	}
	if a.open {
		return fmt.Errorf("stream abort of transaction %d (subtransaction %d) inside transaction %d: "+
			"proto_version 1 never sends one there, and the relay cannot tell which rows it retracts; nothing of transaction %d was confirmed: %w",
			xid, subxid, a.cur.Xid, a.cur.Xid, ErrUnrequested)
	}
	a.stats.unsolicited[unsolicitedStreamAbort].Add(1)
	if !a.unsolicitedLogged[unsolicitedStreamAbort] {
		a.unsolicitedLogged[unsolicitedStreamAbort] = true
		a.log.Warn("skipping a Stream Abort the server sent although streaming was not requested (a Postgres 18 bug; it carries no rows); logged once, see stats for counts",
			"xid", xid, "subxid", subxid)
	}
	return nil
}

// unknown skips a message of a type proto_version 1 does not define, if it
// comes between transactions: every row proto_version 1 sends is between a
// Begin and a Commit, and an Insert that follows it without a Begin still
// stops the stream. Until the next Begin the stream is not idle (see
// unknownSeen). Inside a transaction it might hold rows of that transaction,
// which would be confirmed with its Commit: stop.
func (a *assembler) unknown(t byte) error {
	if a.open {
		return fmt.Errorf("message of unknown type %q inside transaction %d: it may hold rows the relay cannot read, so the transaction is not confirmed; "+
			"check that the server runs a Postgres release this relay supports and report the type: %w", t, a.cur.Xid, ErrUnrequested)
	}
	a.unknownSeen = true
	a.stats.unsolicited[unsolicitedUnknown].Add(1)
	if !a.unsolicitedLogged[unsolicitedUnknown] {
		a.unsolicitedLogged[unsolicitedUnknown] = true
		a.log.Warn("skipping a pgoutput message of unknown type between transactions (logged once, see stats for counts); "+
			"the slot is not advanced past it until the next transaction begins", "type", string(rune(t)))
	}
	return nil
}

// unrequested is the error for a message that frames rows in a way the relay
// did not ask for (streamed or prepared transactions): the rows after it are
// not in the proto_version 1 format, and skipping them would lose them.
func unrequested(t byte, feature string) error {
	return fmt.Errorf("the server sent message %q of %s, which proto_version 1 did not request: "+
		"the rows that follow are not readable as proto_version 1, so the relay stopped before confirming them (they stay in the slot). "+
		"This is a server bug: upgrade Postgres to its latest minor release, then start the relay again; it resumes from its checkpoint. "+
		"Raising logical_decoding_work_mem makes the server stream (or evict) large transactions less often: %w", t, feature, ErrUnrequested)
}

// errOutsideTxn: a change came without a Begin before it.
var errOutsideTxn = errors.New("outside a transaction")

func (a *assembler) inTxn(t byte) error {
	if !a.open {
		return fmt.Errorf("message %q %w", t, errOutsideTxn)
	}
	return nil
}

func (a *assembler) begin(body []byte) error {
	m, err := parseBegin(body)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if a.open {
		return fmt.Errorf("begin of %d inside transaction %d", m.Xid, a.cur.Xid)
	}
	a.open, a.skip, a.dropRows, a.txnRows = true, false, 0, 0
	a.unknownSeen = false
	a.cur = Batch{Xid: m.Xid, CommitLSN: m.FinalLSN, CommitTime: m.CommitTime}
	switch {
	case m.FinalLSN < a.start:
		a.skip = true
		a.skippedStart++
	case m.FinalLSN < a.lastEnd:
		// Commit LSNs are ordered and a commit record starts after the end of
		// every earlier one, so CommitLSN < lastEnd means EndLSN <= lastEnd:
		// emitted before the connection was lost.
		a.skip = true
		a.skippedResent++
	case a.partialCommit != 0 && m.FinalLSN == a.partialCommit:
		a.dropRows, a.txnRows = a.partialRows, a.partialRows
		a.log.Info("dropping rows already emitted of a transaction cut by the reconnect",
			"rows", a.partialRows, "commit_lsn", m.FinalLSN.String())
	case a.partialCommit != 0:
		return &gapError{commit: a.partialCommit, next: m.FinalLSN}
	}
	if a.skip {
		a.stats.skipped.Add(1)
	} else {
		a.logSkips()
		// Stats.Reading names this transaction from its first row
		// (add), not from its Begin: before Postgres 15 every
		// transaction of the database, with no published change, is
		// sent as an empty Begin and Commit, and those would replace
		// the transaction being read every moment.
		a.readingNamed = false
	}
	return nil
}

// logSkips logs skipped transactions once they stop coming, rather than one
// line per transaction.
func (a *assembler) logSkips() {
	if a.skippedStart > 0 && !a.startLogged {
		a.startLogged = true
		a.log.Info("skipped transactions committed before the start position",
			"transactions", a.skippedStart, "start_lsn", a.start.String())
	}
	if a.skippedResent > 0 {
		a.log.Info("dropped transactions resent after reconnect", "transactions", a.skippedResent)
		a.skippedResent = 0
	}
}

func (a *assembler) commit(body []byte) (Batch, bool, error) {
	m, err := parseCommit(body)
	if err != nil {
		return Batch{}, false, fmt.Errorf("commit: %w", err)
	}
	if !a.open {
		return Batch{}, false, errors.New("commit outside a transaction")
	}
	if m.CommitLSN != a.cur.CommitLSN {
		return Batch{}, false, fmt.Errorf("commit at %s does not match begin's final LSN %s", m.CommitLSN, a.cur.CommitLSN)
	}
	a.open = false
	if a.skip {
		return Batch{}, false, nil
	}
	b := a.cur
	b.Last, b.EndLSN = true, m.EndLSN
	a.cur = Batch{}
	a.next = emission{set: true, lastEnd: m.EndLSN}
	a.stats.transactions.Add(1)
	a.stats.rows.Add(uint64(len(b.Rows)))
	return b, true, nil
}

// wanted reports whether the next row of the open transaction (an insert,
// or a message: t) is to be emitted: not when the transaction was delivered
// already, nor when a reconnect resends a row emitted before.
func (a *assembler) wanted(t byte) (bool, error) {
	if err := a.inTxn(t); err != nil {
		return false, err
	}
	if a.skip {
		return false, nil
	}
	if a.dropRows > 0 {
		a.dropRows--
		return false, nil
	}
	return true, nil
}

func (a *assembler) insert(body []byte) (Batch, bool, error) {
	if ok, err := a.wanted('I'); !ok {
		return Batch{}, false, err
	}
	relID, values, size, err := parseInsert(body, &a.hdrs)
	if err != nil {
		return Batch{}, false, err
	}
	rel, ok := a.relations[relID]
	if !ok {
		return Batch{}, false, fmt.Errorf("insert into relation %d before its Relation message", relID)
	}
	if len(values) != len(rel.Columns) {
		return Batch{}, false, fmt.Errorf("insert into %s.%s: %d values for %d columns", rel.Namespace, rel.Name, len(values), len(rel.Columns))
	}
	out, ready := a.add(Row{Relation: rel, Values: values}, size)
	return out, ready, nil
}

// add appends row (of size bytes) to the open transaction's batch. A full
// batch is handed on only when the next row arrives, so that a transaction
// of exactly MaxBatchRows rows is one Last batch.
func (a *assembler) add(row Row, size int) (Batch, bool) {
	var out Batch
	var ready bool
	if len(a.cur.Rows) > 0 && (len(a.cur.Rows)+1 > a.maxRows || a.cur.Bytes+size > a.maxBytes) {
		out, ready = a.cur, true
		a.next = emission{set: true, lastEnd: a.lastEnd, partialCommit: a.cur.CommitLSN, partialRows: a.txnRows}
		a.stats.rows.Add(uint64(len(out.Rows)))
		a.cur = Batch{Xid: out.Xid, CommitLSN: out.CommitLSN, CommitTime: out.CommitTime}
	}
	if a.cur.Rows == nil {
		a.cur.Rows = make([]Row, 0, min(a.maxRows, 64))
	}
	a.cur.Rows = append(a.cur.Rows, row)
	a.cur.Bytes += size
	a.txnRows++
	if !a.readingNamed {
		// A resend after a reconnect goes on counting: its rows
		// emitted before are dropped, not counted again.
		a.readingNamed = true
		if a.stats.readingCommit.Swap(uint64(a.cur.CommitLSN)) != uint64(a.cur.CommitLSN) {
			a.stats.readingRows.Store(0)
			a.stats.readingBytes.Store(0)
		}
	}
	a.stats.readingRows.Add(1)
	a.stats.readingBytes.Add(int64(size))
	return out, ready
}

func (a *assembler) ignore(kind int, n *atomic.Uint64, relID uint32) {
	if a.skip {
		return
	}
	n.Add(1)
	if a.ignoredLogged[kind] {
		return
	}
	a.ignoredLogged[kind] = true
	table := fmt.Sprintf("relation %d", relID)
	if rel, ok := a.relations[relID]; ok {
		table = rel.Namespace + "." + rel.Name
	}
	a.log.Warn("ignoring change: only inserts are relayed (logged once per kind, see stats for counts)",
		"kind", kindNames[kind], "table", table)
}

// message handles a logical decoding message (pgoutput sends them when
// MessagePrefixes asks for them). A transactional one with a configured
// prefix becomes a Row of its transaction, in its place among the inserts,
// and follows every rule an insert does (skipped in a transaction already
// delivered, dropped when a reconnect resends it). Messages of other
// prefixes are skipped. A non-transactional one with a configured prefix is
// never an event: it was written whether its transaction committed or not.
func (a *assembler) message(lsn pglogrepl.LSN, body []byte) (Batch, bool, error) {
	r := reader{b: body}
	flags := r.u8()
	at := r.lsn()
	prefix := r.str()
	content := r.take(int(r.u32()))
	if r.err != nil {
		return Batch{}, false, fmt.Errorf("message: %w", r.err)
	}
	if len(r.b) != 0 {
		return Batch{}, false, fmt.Errorf("message with prefix %q: %d bytes after its content", prefix, len(r.b))
	}
	if at == 0 {
		at = lsn
	}
	if !a.prefixes[prefix] {
		if a.prefixes != nil {
			a.stats.otherMessages.Add(1)
			if !a.otherPrefixSeen {
				a.otherPrefixSeen = true
				a.log.Info("skipping logical decoding messages of a prefix the relay does not read (logged once, see stats for counts)", "prefix", prefix)
			}
		}
		return Batch{}, false, nil
	}
	if flags&1 == 0 {
		return Batch{}, false, a.nonTransactional(at, prefix, len(content))
	}
	if ok, err := a.wanted('M'); !ok {
		return Batch{}, false, err
	}
	m := &Message{Prefix: prefix, Content: append(make([]byte, 0, len(content)), content...), LSN: at}
	a.stats.messages.Add(1)
	out, ready := a.add(Row{Message: m}, len(content))
	return out, ready, nil
}

// nonTransactional handles a non-transactional message with a configured
// prefix: skipped (counted, logged once) or, by default, the end of Run
// before anything past it is confirmed. One the relay has passed already
// (the slot went back after a crash) is skipped either way.
func (a *assembler) nonTransactional(at pglogrepl.LSN, prefix string, size int) error {
	if at < a.start || at < a.lastEnd {
		return nil
	}
	if !a.ignoreNonTxn {
		return &NonTransactionalError{LSN: at, Prefix: prefix, Size: size}
	}
	a.stats.nonTransactional.Add(1)
	if !a.nonTxnLogged {
		a.nonTxnLogged = true
		a.log.Warn("skipping a non-transactional logical decoding message: it is written whether its transaction commits or not, so it is no event (logged once, see stats for counts)",
			"prefix", prefix, "lsn", at.String(), "bytes", size)
	}
	return nil
}
