package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pglogrepl"
)

// Tests for messages proto_version 1 does not send (the package doc's rule):
// what is skipped, what stops, and that nothing is confirmed past a message
// whose rows the relay did not read.

// serverWALEnd is what keepalives report as the server's WAL end in these
// tests: far past every message, as on a busy server, so that any
// confirmation past unread data shows. (An XLogData's own WAL end is its
// start: a logical walsender sets both to the message's LSN.)
const serverWALEnd = pglogrepl.LSN(0x7_0000_0000)

// keepalive marks a primary keepalive in a script (Data nil).
var keepalive = walMessage{}

func streamAbortMessage(xid, subxid uint32) []byte {
	b := []byte{'A'}
	b = binary.BigEndian.AppendUint32(b, xid)
	return binary.BigEndian.AppendUint32(b, subxid)
}

// logLines is a slog handler that keeps the messages of Warn records.
type logLines struct {
	mu    sync.Mutex
	warns []string
}

func (l *logLines) Enabled(context.Context, slog.Level) bool { return true }
func (l *logLines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logLines) WithGroup(string) slog.Handler            { return l }
func (l *logLines) Handle(_ context.Context, r slog.Record) error {
	if r.Level == slog.LevelWarn {
		l.mu.Lock()
		l.warns = append(l.warns, r.Message)
		l.mu.Unlock()
	}
	return nil
}

// run is the outcome of driving a script through Stream.xlogData as the
// receive loop does, with a sink that acknowledges every Batch at once (the
// caller confirms each Last batch's EndLSN as soon as it is emitted).
type run struct {
	batches   []Batch
	err       error
	confirmed pglogrepl.LSN // the position status updates would report
	stats     Stats
	warns     []string
}

func drive(t *testing.T, script []walMessage) run {
	t.Helper()
	logs := &logLines{}
	s := New(Config{Logger: slog.New(logs)})
	asm := newAssembler(s.cfg, 0, &s.stats)
	var r run
	emit := func(b Batch) error {
		r.batches = append(r.batches, b)
		asm.emitted() // handed on, as Stream.emit records it
		if b.Last {
			s.Confirm(b.EndLSN)
		}
		return nil
	}
	for _, m := range script {
		if m.Data == nil {
			s.advanceIdle(asm, serverWALEnd)
			continue
		}
		xld := pglogrepl.XLogData{WALStart: m.LSN, ServerWALEnd: m.LSN, WALData: m.Data}
		if r.err = s.xlogData(asm, xld, emit); r.err != nil {
			break
		}
	}
	r.stats = s.Stats()
	r.confirmed = r.stats.ConfirmedLSN
	r.warns = logs.warns
	return r
}

func concat(parts ...[]walMessage) []walMessage {
	var all []walMessage
	for _, p := range parts {
		all = append(all, p...)
	}
	return all
}

func msg(lsn pglogrepl.LSN, data []byte) []walMessage { return []walMessage{{lsn, data}} }

// TestPostgres18StreamAbort: the fixture holds two Stream Aborts between two
// transactions. Both transactions arrive whole, the aborts are counted and
// warned about once, and the stream is idle after them.
func TestPostgres18StreamAbort(t *testing.T) {
	fixture := readFixture(t, "pg18_stream_abort.hex")
	r := drive(t, append(fixture, keepalive))
	if r.err != nil {
		t.Fatalf("driving pg18_stream_abort.hex: %v; want the Stream Aborts skipped", r.err)
	}
	if len(r.batches) != 2 || len(r.batches[0].Rows) != 2 || len(r.batches[1].Rows) != 1 {
		var rows []int
		for _, b := range r.batches {
			rows = append(rows, len(b.Rows))
		}
		t.Fatalf("rows per batch = %v; want [2 1] (both transactions, whole)", rows)
	}
	if got := value(r.batches[1].Rows[0].Values[7]); got != `"t-1"` {
		t.Errorf("second transaction's trace_id = %s; want %q (its row decoded after the aborts)", got, "t-1")
	}
	if r.stats.SkippedStreamAborts != 2 || r.stats.SkippedUnknownMessages != 0 || r.stats.ReceivedTransactions != 2 || r.stats.ReceivedRows != 3 {
		t.Errorf("stats = %+v; want 2 skipped Stream Aborts, 0 unknown, 2 transactions, 3 rows", r.stats)
	}
	if len(r.warns) != 1 || !strings.Contains(r.warns[0], "Stream Abort") {
		t.Errorf("warnings = %q; want one about the Stream Abort (logged once per kind)", r.warns)
	}
	// An abort retracts nothing the relay read: the stream is idle after
	// it, and a keepalive moves the slot on (a quiet outbox pins no WAL).
	if r.confirmed != serverWALEnd {
		t.Errorf("confirmed after the last commit and a keepalive = %s; want the server's WAL end %s", r.confirmed, serverWALEnd)
	}
}

func TestUnsolicitedMessages(t *testing.T) {
	t1 := txn(0x1000, 2, 0) // ends at 0x1008
	t2 := txn(0x2000, 1, 0) // ends at 0x2008
	rel := msg(0x1900, relationMessage(testRelID, "v"))
	tests := []struct {
		name          string
		script        []walMessage
		wantErr       error // nil: no error; else errors.Is
		wantRows      []string
		wantConfirmed pglogrepl.LSN
		wantAborts    uint64
		wantUnknown   uint64
	}{
		{
			name:          "stream abort between transactions",
			script:        concat(t1, msg(0x1800, streamAbortMessage(7, 8)), t2, []walMessage{keepalive}),
			wantRows:      []string{"4096-0", "4096-1", "8192-0"},
			wantConfirmed: serverWALEnd, wantAborts: 1,
		},
		{
			name:          "stream abort before any transaction",
			script:        concat(msg(0x800, streamAbortMessage(7, 7)), []walMessage{keepalive}, t1),
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: serverWALEnd, wantAborts: 1,
		},
		{
			name:          "stream abort with v4 parallel abort info",
			script:        concat(t1, msg(0x1800, binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(streamAbortMessage(7, 8), 0x1700), 1)), []walMessage{keepalive}),
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: serverWALEnd, wantAborts: 1,
		},
		{
			// A keepalive after an unknown message does not move the slot
			// past it; the next transaction's commit does.
			name:          "unknown type between transactions, then a keepalive",
			script:        concat(t1, msg(0x1800, []byte{'Z', 1, 2, 3}), []walMessage{keepalive}),
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008, wantUnknown: 1,
		},
		{
			name:          "unknown type between transactions, then a transaction",
			script:        concat(t1, msg(0x1800, []byte{'Z'}), t2, []walMessage{keepalive}),
			wantRows:      []string{"4096-0", "4096-1", "8192-0"},
			wantConfirmed: serverWALEnd, wantUnknown: 1,
		},
		{
			name:          "unknown type, then an insert outside a transaction",
			script:        concat(t1, msg(0x1800, []byte{'Z'}), rel, msg(0x1a00, insertMessage(testRelID, []byte("lost?")))),
			wantErr:       errOutsideTxn,
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008, wantUnknown: 1,
		},
		{
			name:          "unknown type inside a transaction",
			script:        concat(t1, t2[:3], msg(0x1f80, []byte{'Z', 1}), t2[3:]),
			wantErr:       ErrUnrequested,
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008,
		},
		{
			name:          "stream abort inside a transaction",
			script:        concat(t1, t2[:3], msg(0x1f80, streamAbortMessage(uint32(0x2000), 9)), t2[3:]),
			wantErr:       ErrUnrequested,
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008,
		},
		{
			name:          "truncated stream abort",
			script:        concat(t1, msg(0x1800, streamAbortMessage(7, 8)[:6])),
			wantErr:       errShort,
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008,
		},
	}
	// Stream Start followed by (v2-format) inserts, and every other message
	// that frames rows in a way proto_version 1 did not ask for: stop at it,
	// confirming nothing past the last transaction read.
	for _, t := range []byte{'S', 'E', 'c', 'b', 'P', 'K', 'r', 'p'} {
		tests = append(tests, struct {
			name          string
			script        []walMessage
			wantErr       error
			wantRows      []string
			wantConfirmed pglogrepl.LSN
			wantAborts    uint64
			wantUnknown   uint64
		}{
			name: fmt.Sprintf("%q between transactions, then rows", t),
			script: concat(t1, msg(0x1800, []byte{t, 0, 0, 0x20, 0, 1}), rel,
				msg(0x1a00, insertMessage(testRelID, []byte("in-progress"))), []walMessage{keepalive}, t2),
			wantErr:       ErrUnrequested,
			wantRows:      []string{"4096-0", "4096-1"},
			wantConfirmed: 0x1008,
		})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := drive(t, tt.script)
			switch {
			case tt.wantErr == nil && r.err != nil:
				t.Fatalf("drive error = %v; want nil", r.err)
			case tt.wantErr != nil:
				var de *DecodeError
				if !errors.As(r.err, &de) || !errors.Is(r.err, tt.wantErr) {
					t.Fatalf("drive error = %v; want a *DecodeError wrapping %v", r.err, tt.wantErr)
				}
			}
			if got := rowIDs(r.batches); fmt.Sprint(got) != fmt.Sprint(tt.wantRows) {
				t.Errorf("rows = %v; want %v", got, tt.wantRows)
			}
			if r.confirmed != tt.wantConfirmed {
				t.Errorf("confirmed = %s; want %s", r.confirmed, tt.wantConfirmed)
			}
			if r.stats.SkippedStreamAborts != tt.wantAborts || r.stats.SkippedUnknownMessages != tt.wantUnknown {
				t.Errorf("skipped stream aborts, unknown = %d, %d; want %d, %d",
					r.stats.SkippedStreamAborts, r.stats.SkippedUnknownMessages, tt.wantAborts, tt.wantUnknown)
			}
		})
	}
}

// TestUnrequestedErrorIsActionable: the error for a Stream Start says what
// happened and what to do.
func TestUnrequestedErrorIsActionable(t *testing.T) {
	r := drive(t, msg(0x1800, []byte{'S', 0, 0, 0x20, 0, 1}))
	for _, want := range []string{"decode at 0/1800", `'S'`, "streaming of in-progress transactions", "stopped before confirming", "upgrade Postgres", "logical_decoding_work_mem"} {
		if r.err == nil || !strings.Contains(r.err.Error(), want) {
			t.Errorf("error = %v; want it to contain %q", r.err, want)
		}
	}
}

// TestUnsolicitedWarnOncePerKind: many skipped messages make one warning per
// kind per Run, and the counters count every one.
func TestUnsolicitedWarnOncePerKind(t *testing.T) {
	var script []walMessage
	for i := range 3 {
		script = append(script, walMessage{pglogrepl.LSN(0x100 + i), streamAbortMessage(uint32(i), uint32(i))})
		script = append(script, walMessage{pglogrepl.LSN(0x200 + i), []byte{'Z'}})
	}
	r := drive(t, append(script, txn(0x1000, 1, 0)...))
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.stats.SkippedStreamAborts != 3 || r.stats.SkippedUnknownMessages != 3 {
		t.Errorf("skipped stream aborts, unknown = %d, %d; want 3, 3", r.stats.SkippedStreamAborts, r.stats.SkippedUnknownMessages)
	}
	if len(r.warns) != 2 {
		t.Errorf("warnings = %q; want 2 (one per kind)", r.warns)
	}
	if !bytes.Equal(r.batches[0].Rows[0].Values[0], []byte("4096-0")) {
		t.Errorf("row after the skipped messages = %q; want %q", r.batches[0].Rows[0].Values[0], "4096-0")
	}
}
