package debezium

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
)

// An Offset is the position a Debezium PostgreSQL connector stored in Kafka
// Connect for its one source partition, as PostgresOffsetContext.getOffset
// writes it (debezium-connector-postgres, PostgresOffsetContext and
// SourceInfo). LSNs are Debezium's Lsn.asLong values, stored as JSON numbers;
// zero means absent (no valid LSN is zero). Kafka Connect stores the offset
// of a record only once Kafka acknowledged it and every record the task
// produced before it (SubmittedRecords), so everything up to that record was
// delivered.
type Offset struct {
	// The Kafka Connect key: connector name and source partition
	// {"server": topic.prefix} (database.server.name before Debezium 2.0).
	Connector string
	Server    string

	// LSN ("lsn") is the LSN of the message the last record came from: a
	// change, a BEGIN or COMMIT, a logical decoding message, or for a
	// snapshot record the snapshot's start.
	LSN uint64
	// LSNProc ("lsn_proc") is the last LSN whose every event was processed:
	// for pgoutput the last change, COMMIT or message (not a BEGIN).
	LSNProc uint64
	// LSNCommit ("lsn_commit") is the end LSN of the last transaction whose
	// COMMIT Debezium processed (the commit record's end, the position the
	// walsender reports for a COMMIT message), or of the last
	// non-transactional logical decoding message. Debezium flushes this
	// value to the replication slot (commitOffset).
	LSNCommit uint64
	// LSNEventsProcessed ("lsn_events_processed", recent Debezium) counts
	// the events delivered at LSN when several share it; 0 when absent.
	LSNEventsProcessed int64
	TxID               int64 // "txId": the transaction of LSN's message; 0 when absent
	TsUsec             int64 // "ts_usec": its commit time, µs since the Unix epoch
	Xmin               int64 // "xmin": only with xmin.fetch.interval.ms; 0 when absent
	// MessageType ("messageType") is the kind of LSN's message: INSERT,
	// UPDATE, DELETE, TRUNCATE, MESSAGE, BEGIN, COMMIT; "" in offsets of old
	// Debezium versions and of snapshots.
	MessageType string
	// TransactionID ("transaction_id") is set with
	// provide.transaction.metadata while a transaction is open.
	TransactionID string
	// Snapshot ("snapshot") is the kind of snapshot running: INITIAL,
	// BLOCKING or INCREMENTAL, "" when none; old offsets stored true, read as
	// INITIAL.
	Snapshot           string
	LastSnapshotRecord bool // "last_snapshot_record"
	SnapshotCompleted  bool // "snapshot_completed"

	// Reset is set for a tombstone of the offsets topic (a null value): the
	// offset was deleted, as the REST API's DELETE /connectors/{name}/offsets
	// does. Only Connector and Server are set then.
	Reset bool
	// Value is the stored value as it was, for display.
	Value json.RawMessage
}

// ErrNotPostgres is returned by ParseOffsetRecord for a record that is not a
// Debezium PostgreSQL connector's offset: another connector's (one Kafka
// Connect cluster's offsets are all in one topic or file) or one whose key is
// not a Kafka Connect partition key. ReadOffsetFile and LatestOffsets skip
// such records.
var ErrNotPostgres = errors.New("not a Debezium PostgreSQL connector offset")

// ErrNoOffsets is returned by ReadOffsetFile and LatestOffsets when they find
// no Debezium PostgreSQL connector offset: Debezium never stored a position,
// or it was reset.
var ErrNoOffsets = errors.New("no Debezium PostgreSQL connector offset")

// ErrSnapshotIncomplete is returned by ResumeLSN when Debezium's initial
// snapshot had not finished: the rows that were in the table when the slot
// was created were only partly sent, and the relay does not snapshot.
var ErrSnapshotIncomplete = errors.New("Debezium's initial snapshot did not finish")

// A Record is one record of Kafka Connect's offsets topic. A nil Value is a
// tombstone.
type Record struct {
	Key, Value []byte
}

// ParseOffsetRecord parses one offset: key and value as Kafka Connect's
// JsonConverter (schemas disabled) writes them to the offsets topic
// (offset.storage.topic) and the standalone worker's offset file, the key
// ["connector-name",{"server":"prefix"}] and the value a JSON object such as
// {"lsn_proc":..,"lsn_commit":..,"lsn":..,"txId":..,"ts_usec":..}. A nil
// value is a tombstone: the Offset has Reset set. A record of another
// connector gives an error wrapping ErrNotPostgres.
func ParseOffsetRecord(key, value []byte) (Offset, error) {
	var o Offset
	var parts []json.RawMessage
	if err := json.Unmarshal(key, &parts); err != nil || len(parts) != 2 {
		return o, fmt.Errorf("%w: key %.200q is not a Kafka Connect offset key [\"connector\", {partition}]", ErrNotPostgres, key)
	}
	if err := json.Unmarshal(parts[0], &o.Connector); err != nil {
		return o, fmt.Errorf("%w: key %.200q does not start with a connector name", ErrNotPostgres, key)
	}
	var partition map[string]json.RawMessage
	if err := json.Unmarshal(parts[1], &partition); err != nil || partition == nil {
		return o, fmt.Errorf("%w: key %.200q has no partition object", ErrNotPostgres, key)
	}
	server, ok := partition["server"]
	if !ok || len(partition) != 1 || json.Unmarshal(server, &o.Server) != nil {
		// SQL Server's and Db2's partitions add "database"; ours is
		// {"server": topic.prefix} alone (PostgresPartition).
		return o, fmt.Errorf("%w: partition %s of connector %q is not {\"server\": \"<topic.prefix>\"}", ErrNotPostgres, parts[1], o.Connector)
	}
	if value == nil {
		o.Reset = true
		return o, nil
	}
	o.Value = append(json.RawMessage(nil), value...)
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var fields map[string]any
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return o, fmt.Errorf("%w: value of connector %q is not a JSON object: %.200q", ErrNotPostgres, o.Connector, value)
	}
	_, hasLSN := fields["lsn"]
	_, hasProc := fields["lsn_proc"]
	_, hasCommit := fields["lsn_commit"]
	if !hasLSN && !hasProc && !hasCommit {
		return o, fmt.Errorf("%w: offset of connector %q has no lsn, lsn_proc or lsn_commit: %.200s", ErrNotPostgres, o.Connector, value)
	}
	p := offsetParser{fields: fields, connector: o.Connector}
	o.LSN = p.lsn("lsn")
	o.LSNProc = p.lsn("lsn_proc")
	o.LSNCommit = p.lsn("lsn_commit")
	o.LSNEventsProcessed = p.int("lsn_events_processed")
	o.TxID = p.int("txId")
	o.TsUsec = p.int("ts_usec")
	o.Xmin = p.int("xmin")
	o.MessageType = p.str("messageType")
	o.TransactionID = p.str("transaction_id")
	o.LastSnapshotRecord = p.bool("last_snapshot_record")
	o.SnapshotCompleted = p.bool("snapshot_completed")
	switch v := fields["snapshot"].(type) {
	case nil:
	case bool:
		// Before SnapshotType, "snapshot" was a boolean; OffsetContext.Loader
		// reads true as INITIAL.
		if v {
			o.Snapshot = "INITIAL"
		}
	case string:
		o.Snapshot = v
		if v == "true" {
			o.Snapshot = "INITIAL"
		}
	default:
		p.fail("snapshot", v, "a string or boolean")
	}
	if p.err != nil {
		return o, p.err
	}
	return o, nil
}

// offsetParser reads typed fields of a decoded value, keeping the first error.
type offsetParser struct {
	fields    map[string]any
	connector string
	err       error
}

func (p *offsetParser) fail(key string, v any, want string) {
	if p.err == nil {
		p.err = fmt.Errorf("offset of connector %q: %s is %v, not %s: this is not what Debezium writes; check the offset's source", p.connector, key, v, want)
	}
}

// lsn reads an LSN: Debezium stores Lsn.asLong, a signed long that is the
// unsigned LSN's bits.
func (p *offsetParser) lsn(key string) uint64 {
	v, ok := p.fields[key]
	if !ok || v == nil {
		return 0
	}
	n, ok := v.(json.Number)
	if ok {
		if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
			return uint64(i)
		}
		if u, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
			return u
		}
	}
	p.fail(key, v, "an LSN (an integer)")
	return 0
}

func (p *offsetParser) int(key string) int64 {
	v, ok := p.fields[key]
	if !ok || v == nil {
		return 0
	}
	if n, ok := v.(json.Number); ok {
		if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
			return i
		}
	}
	p.fail(key, v, "an integer")
	return 0
}

func (p *offsetParser) str(key string) string {
	v, ok := p.fields[key]
	if !ok || v == nil {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	if n, ok := v.(json.Number); ok {
		return n.String() // transaction_id is a string, but be lenient with a number
	}
	p.fail(key, v, "a string")
	return ""
}

func (p *offsetParser) bool(key string) bool {
	switch v := p.fields[key].(type) {
	case nil:
		return false
	case bool:
		return v
	case string:
		// OffsetContext.Loader also accepts the string "true".
		return v == "true"
	default:
		p.fail(key, v, "a boolean")
		return false
	}
}

// LatestOffsets returns the Debezium PostgreSQL offsets that records, read
// from Kafka Connect's offsets topic in offset order per partition (as
// Kafka Connect's KafkaOffsetBackingStore reads them), leave in force: the
// latest record per connector and partition wins, and a tombstone removes
// the offset. Records of other connectors are skipped. The result is sorted
// by connector, then server. An error reports a record that looks like a
// Postgres offset but cannot be read; with none left it wraps ErrNoOffsets.
//
// One key's records all land in one partition of the topic (they have the
// same key bytes), so reading the topic partition by partition keeps each
// key's records in order.
func LatestOffsets(records []Record) ([]Offset, error) {
	type id struct{ connector, server string }
	latest := make(map[id]Offset)
	skipped, resets := 0, 0
	for i, rec := range records {
		o, err := ParseOffsetRecord(rec.Key, rec.Value)
		if errors.Is(err, ErrNotPostgres) {
			skipped++
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("offsets record %d: %w", i, err)
		}
		k := id{o.Connector, o.Server}
		if o.Reset {
			resets++
			delete(latest, k)
			continue
		}
		latest[k] = o
	}
	if len(latest) == 0 {
		return nil, fmt.Errorf("%w among %d records (%d of other connectors, %d resets): Debezium never stored a position, or it was reset", ErrNoOffsets, len(records), skipped, resets)
	}
	out := make([]Offset, 0, len(latest))
	for _, o := range latest {
		out = append(out, o)
	}
	sortOffsets(out)
	return out, nil
}

// ReadOffsetFile reads a standalone Kafka Connect worker's offset file
// (offset.storage.file.filename), which FileOffsetBackingStore writes as a
// Java-serialized java.util.HashMap<byte[], byte[]> of JSON keys and values,
// and returns the Debezium PostgreSQL offsets in it, sorted by connector,
// then server. Entries of other connectors and reset entries (null values)
// are skipped; with no offset left the error wraps ErrNoOffsets. A file that
// is not such a map gives an error starting "not a Kafka Connect offset file".
func ReadOffsetFile(path string) ([]Offset, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read offset file: %w", err)
	}
	entries, err := readByteArrayMap(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var out []Offset
	skipped, resets := 0, 0
	for _, e := range entries {
		if e.key == nil {
			skipped++ // Kafka Connect ignores a null key too
			continue
		}
		o, err := ParseOffsetRecord(e.key, e.value)
		if errors.Is(err, ErrNotPostgres) {
			skipped++
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if o.Reset {
			resets++
			continue
		}
		out = append(out, o)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: %w among %d entries (%d of other connectors, %d resets): Debezium never stored a position, or it was reset", path, ErrNoOffsets, len(entries), skipped, resets)
	}
	sortOffsets(out)
	return out, nil
}

func sortOffsets(os []Offset) {
	slices.SortFunc(os, func(a, b Offset) int {
		return cmp.Or(strings.Compare(a.Connector, b.Connector), strings.Compare(a.Server, b.Server))
	})
}

// ResumeLSN returns where a relay taking over Debezium's replication slot
// must start (START_REPLICATION's LSN, the relay's start) so that no event
// Debezium did not deliver is skipped, with a one-line explanation saying
// what will be sent twice. It is LSNCommit, or LSNProc when an older offset
// has no LSNCommit, or LSN when only that is stored; 0 (the slot's own
// position) when none is.
//
// Why. Postgres decodes a transaction only if its commit record starts at or
// after the decoding start: DecodeCommit skips it when
// SnapBuildXactNeedsSkip(builder, buf->origptr), that is origptr <
// start_decoding_at (decode.c, snapbuild.c), and start_decoding_at is the
// greater of the requested LSN and the slot's confirmed_flush_lsn
// (CreateDecodingContext in logical.c: "has been already streamed,
// forwarding to"). Transactions are skipped whole, never in part. The relay
// applies the same rule (CommitLSN < start is skipped), CommitLSN being
// pgoutput's commit LSN, where the commit record starts.
//
// Debezium's LSNCommit is the LSN of the last COMMIT message it processed,
// which the walsender sends at txn->end_lsn, the end of the commit record
// (commit_cb_wrapper: ctx->write_location = txn->end_lsn). That is the
// relay's EndLSN of that transaction, and the value Debezium flushes to the
// slot: commitOffset flushes lsn_commit, else lsn_proc
// (PostgresStreamingChangeEventSource), when Kafka Connect has stored its
// offsets. So with start = LSNCommit:
//
//   - every transaction whose COMMIT Debezium processed has its commit record
//     start below its end, at most LSNCommit: skipped, as it should be;
//   - every later transaction's commit record starts at or after that end
//     (commit records are written in commit order and do not overlap; the
//     next record may start exactly at it, so start must not be
//     LSNCommit+1, which could skip a transaction committed right after):
//     decoded. Transactions stream in commit order, so these are exactly
//     the ones Debezium had not finished.
//
// Duplicates: when MessageType is COMMIT (a heartbeat or transaction-END
// record stored the position after a COMMIT; LSNProc = LSNCommit = LSN), or a
// non-transactional MESSAGE at LSNCommit, Debezium stopped between
// transactions and nothing in the offset is sent twice. Otherwise the last
// delivered record was inside transaction TxID (an INSERT, UPDATE, DELETE or
// BEGIN at LSN, which may even equal LSNCommit: the first change of a
// transaction can start right where the previous commit record ends, as the
// real offset in testdata/offsets-real.dat shows). Every transaction committed
// between the previous COMMIT and that one would have moved LSNCommit, so
// only that transaction is sent again, whole: the duplicates are bounded by
// the events of one transaction that Debezium had already delivered. Without
// heartbeat.interval.ms this is the usual case, since the COMMIT after the
// last outbox row stores no record. Debezium itself would resend the same
// events, except that its WalPositionLocator skips those at or before LSN
// within that transaction, which it can because it tracks each change's LSN;
// the relay identifies events by commit LSN and position instead.
//
// Beyond the offset: records Debezium produced after Kafka Connect last
// stored its offsets (offset.flush.interval.ms, 60 s by default) were
// delivered but are not in the offset, so they are sent again too, as
// Debezium itself would send them. Stop Debezium gracefully (Connect stores
// the offsets on stop) to leave none.
//
// The slot may be ahead of the offset: Debezium flushes to the slot the
// offset of the last record Kafka acknowledged (BaseSourceTask.commitRecord,
// then commit), which can be later than the one Connect stored in the same
// commit. Postgres then starts at confirmed_flush_lsn, whatever the relay
// asks for, and the transactions in between are not sent: they were
// acknowledged, so nothing is lost and fewer are sent twice. That holds for
// Debezium's default lsn.flush.mode (connector); with connector_and_driver
// the JDBC driver also flushes on its own while the stream is idle, so check
// that Debezium had delivered everything before it stopped. A slot behind the
// offset (a flush that failed or timed out) changes nothing: the relay asks
// for the LSN returned and Postgres skips what lies before it. Read the
// offset after Debezium stopped, so that it is its last.
//
// The error wraps ErrSnapshotIncomplete when an initial snapshot had not
// finished (Debezium would redo it; the relay does not snapshot).
func (o Offset) ResumeLSN() (lsn uint64, why string, err error) {
	if o.Reset {
		return 0, "", fmt.Errorf("offset of connector %q was reset: Debezium would start afresh; start the relay from the slot's position (LSN 0) or choose one", o.Connector)
	}
	if o.Snapshot == "INITIAL" && !o.SnapshotCompleted && !o.LastSnapshotRecord {
		return 0, "", fmt.Errorf("%w (connector %q, snapshot started at %s): the rows in the outbox table when the slot was created were only partly sent; let Debezium finish its snapshot first, or start the relay at %s and send those rows another way",
			ErrSnapshotIncomplete, o.Connector, lsnText(o.LSN), lsnText(o.LSN))
	}
	suffix := ""
	if o.Snapshot == "INCREMENTAL" {
		suffix = "; an incremental snapshot was running, which the relay does not continue"
	}
	switch {
	case o.LSNCommit != 0 || o.LSNProc != 0:
		start, key := o.LSNCommit, "lsn_commit"
		if start == 0 {
			// Old offsets have no lsn_commit; Debezium's Loader then takes
			// lsn_proc as the last commit, and commitOffset flushes it.
			start, key = o.LSNProc, "lsn_proc"
		}
		switch {
		case o.MessageType == "COMMIT" || (o.MessageType == "MESSAGE" && o.LSN == start):
			return start, fmt.Sprintf("Debezium stopped between transactions, after the one ending at %s (%s): start there; nothing is sent twice%s",
				lsnText(start), key, suffix), nil
		case o.MessageType == "BEGIN":
			return start, fmt.Sprintf("Debezium had begun transaction %d but delivered none of its events: start at %s (%s, the end of the transaction before); nothing is sent twice%s",
				o.TxID, lsnText(start), key, suffix), nil
		case o.MessageType == "" && o.LSN == start && o.LSNProc == start:
			return start, fmt.Sprintf("start at %s (%s); the offset does not say whether Debezium stopped between transactions: if not, the transaction it was in is sent again whole%s",
				lsnText(start), key, suffix), nil
		}
		kind := "an event"
		switch o.MessageType {
		case "":
		case "INSERT", "UPDATE", "MESSAGE":
			kind = "an " + o.MessageType
		default:
			kind = "a " + o.MessageType
		}
		return start, fmt.Sprintf("Debezium's last delivered record was %s of transaction %d at %s: start at %s (%s, the end of the transaction before); transaction %d is sent again whole, repeating its events Debezium had delivered%s",
			kind, o.TxID, lsnText(o.LSN), lsnText(start), key, o.TxID, suffix), nil
	case o.LSN != 0:
		if o.Snapshot != "" || o.SnapshotCompleted || o.LastSnapshotRecord {
			return o.LSN, fmt.Sprintf("Debezium finished its snapshot at %s and streamed nothing after it: start there; nothing is sent twice%s", lsnText(o.LSN), suffix), nil
		}
		return o.LSN, fmt.Sprintf("the offset has only lsn %s (an old Debezium): start there; at most the transaction Debezium was in is sent again%s", lsnText(o.LSN), suffix), nil
	}
	return 0, fmt.Sprintf("the offset holds no LSN: start from the slot's position (confirmed_flush_lsn), where Debezium's last flush left it%s", suffix), nil
}

func lsnText(lsn uint64) string { return pglogrepl.LSN(lsn).String() }

// FindOffset returns the offset of the connector whose properties are
// connector (its name and topic.prefix; a property left out matches any)
// among offsets, read from the place named from (for messages). It is an
// error when none or several match.
func FindOffset(offsets []Offset, connector map[string]string, from string) (*Offset, error) {
	name, server := connector["name"], connector["topic.prefix"]
	var off *Offset
	for i := range offsets {
		o := &offsets[i]
		if (name == "" || o.Connector == name) && (server == "" || o.Server == server) {
			if off != nil {
				return nil, fmt.Errorf("%s holds several offsets for connector %q (server %q): pass the connector's own properties file", from, name, server)
			}
			off = o
		}
	}
	if off == nil {
		have := "none"
		if len(offsets) > 0 {
			names := make([]string, len(offsets))
			for i, o := range offsets {
				names[i] = fmt.Sprintf("%q (server %q)", o.Connector, o.Server)
			}
			have = strings.Join(names, ", ")
		}
		return nil, fmt.Errorf("%s holds no offset of connector %q (topic.prefix %q); it has %s: pass that connector's properties, or check the worker's offset.storage setting",
			from, name, server, have)
	}
	return off, nil
}
