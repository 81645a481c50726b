package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/field"
)

// logicalMessage encodes pgoutput's Message ('M'): flags (1: transactional),
// its LSN, the prefix and the content.
func logicalMessage(transactional bool, lsn pglogrepl.LSN, prefix string, content []byte) []byte {
	b := []byte{'M', 0}
	if transactional {
		b[1] = 1
	}
	b = binary.BigEndian.AppendUint64(b, uint64(lsn))
	b = append(append(b, prefix...), 0)
	b = binary.BigEndian.AppendUint32(b, uint32(len(content)))
	return append(b, content...)
}

func messageAssembler(maxRows int, nonTxn string, prefixes ...string) (*assembler, *counters) {
	st := &counters{}
	cfg := Config{MaxBatchRows: maxRows, MessagePrefixes: prefixes, NonTransactional: nonTxn,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}.withDefaults()
	return newAssembler(cfg, 0, st), st
}

// rowText is a row as a test reads it: an insert's first value, or
// "msg:<prefix>:<content>".
func rowText(r Row) string {
	if r.Message != nil {
		return fmt.Sprintf("msg:%s:%s", r.Message.Prefix, r.Message.Content)
	}
	return string(r.Values[0])
}

func rowTexts(batches []Batch) []string {
	var out []string
	for _, b := range batches {
		for _, r := range b.Rows {
			out = append(out, rowText(r))
		}
	}
	return out
}

// mixedTxn is a transaction committed at commit with an insert, a message of
// the prefix "outbox", one of "audit", and another insert.
func mixedTxn(commit pglogrepl.LSN) []walMessage {
	return []walMessage{
		{commit - 100, beginMessage(commit, uint32(commit))},
		{0, relationMessage(testRelID, "v")},
		{commit - 90, insertMessage(testRelID, fmt.Appendf(nil, "%d-a", commit))},
		{commit - 80, logicalMessage(true, commit-80, "outbox", fmt.Appendf(nil, `{"n":%d}`, commit))},
		{commit - 70, logicalMessage(true, commit-70, "audit", []byte("not ours"))},
		{commit - 60, insertMessage(testRelID, fmt.Appendf(nil, "%d-b", commit))},
		{commit + 8, commitMessage(commit, commit+8)},
	}
}

func TestMessagesInTransaction(t *testing.T) {
	a, st := messageAssembler(0, "", "outbox")
	got := feed(t, a, mixedTxn(0x1000))
	want := []string{"4096-a", `msg:outbox:{"n":4096}`, "4096-b"}
	if fmt.Sprint(rowTexts(got)) != fmt.Sprint(want) {
		t.Fatalf("rows = %q; want %q (the message in its place, the audit prefix skipped)", rowTexts(got), want)
	}
	m := got[0].Rows[1].Message
	if m.LSN != 0x1000-80 {
		t.Errorf("message LSN = %s; want %s", m.LSN, pglogrepl.LSN(0x1000-80))
	}
	if got[0].Bytes != len("4096-a")+len(`{"n":4096}`)+len("4096-b") {
		t.Errorf("batch bytes = %d; want the inserts' values and the message's content", got[0].Bytes)
	}
	if st.messages.Load() != 1 || st.otherMessages.Load() != 1 || st.rows.Load() != 3 {
		t.Errorf("stats messages %d, other prefixes %d, rows %d; want 1, 1, 3", st.messages.Load(), st.otherMessages.Load(), st.rows.Load())
	}
}

// TestMessagesNotRequested: a stream without prefixes hands on no message
// (and a server sends none to it).
func TestMessagesNotRequested(t *testing.T) {
	a, st := messageAssembler(0, "")
	if got := rowTexts(feed(t, a, mixedTxn(0x1000))); fmt.Sprint(got) != "[4096-a 4096-b]" {
		t.Fatalf("rows = %q; want the inserts only", got)
	}
	if st.messages.Load()+st.otherMessages.Load() != 0 {
		t.Errorf("stats count messages (%d, %d) although none were asked for", st.messages.Load(), st.otherMessages.Load())
	}
}

func TestMessageContentCopied(t *testing.T) {
	a, _ := messageAssembler(0, "", "outbox")
	msgs := mixedTxn(0x1000)
	got := feed(t, a, msgs)
	msgs[3].Data[len(msgs[3].Data)-2] = 'X' // the connection reuses its buffer
	if c := string(got[0].Rows[1].Message.Content); c != `{"n":4096}` {
		t.Fatalf("content after the input buffer changed = %q; want a copy", c)
	}
}

// TestNonTransactionalMessage: stopped at by default, nothing confirmed past
// it; skipped (counted, logged once, the stream idle) with ignore; ignored
// when of another prefix; skipped when before the start (already passed).
func TestNonTransactionalMessage(t *testing.T) {
	nonTxn := walMessage{0x1500, logicalMessage(false, 0x1500, "outbox", []byte(`{"id":"x"}`))}
	script := concat(mixedTxn(0x1000), []walMessage{nonTxn, keepalive}, mixedTxn(0x2000))

	t.Run("stop", func(t *testing.T) {
		r := driveCfg(t, Config{MessagePrefixes: []string{"outbox"}}, script)
		var nt *NonTransactionalError
		if !errors.As(r.err, &nt) || !errors.Is(r.err, ErrNonTransactional) || nt.LSN != 0x1500 || nt.Prefix != "outbox" {
			t.Fatalf("err = %v; want a *NonTransactionalError at 0/1500 wrapping ErrNonTransactional", r.err)
		}
		if !isFatal(r.err) {
			t.Errorf("isFatal(%v) = false; want true (the same message comes again after a reconnect)", r.err)
		}
		if r.confirmed >= 0x1500 {
			t.Errorf("confirmed %s; want before the message at 0/1500", r.confirmed)
		}
	})
	t.Run("ignore", func(t *testing.T) {
		r := driveCfg(t, Config{MessagePrefixes: []string{"outbox"}, NonTransactional: NonTransactionalIgnore}, script)
		if r.err != nil {
			t.Fatal(r.err)
		}
		if got := rowTexts(r.batches); len(got) != 6 {
			t.Errorf("rows = %q; want both transactions' 3 rows, nothing of the non-transactional message", got)
		}
		if r.stats.SkippedNonTransactional != 1 || len(r.warns) != 1 {
			t.Errorf("SkippedNonTransactional = %d, warnings %q; want 1 and one warning", r.stats.SkippedNonTransactional, r.warns)
		}
		if r.confirmed != serverWALEnd {
			t.Errorf("confirmed %s; want the keepalive's WAL end %s: the stream stays idle past a skipped message", r.confirmed, serverWALEnd)
		}
	})
	t.Run("other prefix", func(t *testing.T) {
		r := driveCfg(t, Config{MessagePrefixes: []string{"events"}}, script)
		if r.err != nil || r.stats.SkippedMessages != 5 {
			t.Fatalf("err %v, SkippedMessages %d; want nil and 5 (every message: none has the prefix events)", r.err, r.stats.SkippedMessages)
		}
	})
	t.Run("before the start", func(t *testing.T) {
		a, _ := messageAssembler(0, NonTransactionalStop, "outbox")
		a.start = 0x2000
		if _, _, err := a.handle(nonTxn.LSN, nonTxn.Data); err != nil {
			t.Fatalf("non-transactional message before the start: %v; want it skipped (already passed)", err)
		}
	})
}

// driveCfg is drive with a stream of cfg.
func driveCfg(t *testing.T, cfg Config, script []walMessage) run {
	t.Helper()
	logs := &logLines{}
	cfg.Logger = slog.New(logs)
	s := New(cfg)
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

// TestMessagesReconnect cuts the stream after every message and resends from
// the start: every row, messages included, comes out once, in order.
func TestMessagesReconnect(t *testing.T) {
	all := concat(mixedTxn(0x1000), mixedTxn(0x2000), mixedTxn(0x3000))
	a, _ := messageAssembler(2, "", "outbox")
	want := rowTexts(feed(t, a, all))
	for cut := 1; cut < len(all); cut++ {
		a, _ := messageAssembler(2, "", "outbox")
		got := feed(t, a, all[:cut])
		a.reset()
		got = append(got, feed(t, a, all)...)
		if fmt.Sprint(rowTexts(got)) != fmt.Sprint(want) {
			t.Errorf("cut after %d: rows = %q; want %q", cut, rowTexts(got), want)
		}
	}
}

func TestMessageDecodeErrors(t *testing.T) {
	good := logicalMessage(true, 0x1000, "outbox", []byte("{}"))
	tests := []struct {
		name string
		msgs []walMessage
	}{
		{"transactional outside a transaction", []walMessage{{0x1000, good}}},
		{"truncated content", []walMessage{{0x900, beginMessage(0x1000, 1)}, {0x1000, good[:len(good)-1]}}},
		{"no prefix terminator", []walMessage{{0x900, beginMessage(0x1000, 1)}, {0x1000, []byte("M\x01\x00\x00\x00\x00\x00\x00\x10\x00outbox")}}},
		{"bytes after the content", []walMessage{{0x900, beginMessage(0x1000, 1)}, {0x1000, append(good, 'x')}}},
		{"forged length", []walMessage{{0x900, beginMessage(0x1000, 1)}, {0x1000, append(good[:len(good)-6], 0xff, 0xff, 0xff, 0xff, '{', '}')}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, _ := messageAssembler(0, "", "outbox")
			var err error
			for _, m := range tt.msgs {
				if _, _, err = a.handle(m.LSN, m.Data); err != nil {
					break
				}
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("error = %v; want a *DecodeError", err)
			}
		})
	}
}

func TestMessagesConfig(t *testing.T) {
	tests := []struct {
		cfg   Config
		field string
	}{
		{Config{MessagePrefixes: []string{""}}, "MessagePrefixes"},
		{Config{MessagePrefixes: []string{"a", "a"}}, "MessagePrefixes"},
		{Config{NonTransactional: "drop"}, "NonTransactional"},
	}
	for _, tt := range tests {
		tt.cfg.DSN, tt.cfg.Slot, tt.cfg.Publication = "postgres://x", "s", "p"
		err := tt.cfg.Validate()
		if err == nil || !containsField(err, tt.field) {
			t.Errorf("Validate(%+v) = %v; want an error naming %s", tt.cfg, err, tt.field)
		}
	}
	ok := Config{DSN: "postgres://x", Slot: "s", Publication: "p", MessagePrefixes: []string{"outbox", "events"}}
	if err := ok.Validate(); err != nil || ok.NonTransactional != NonTransactionalStop {
		t.Errorf("Validate = %v, NonTransactional %q; want nil and %q", err, ok.NonTransactional, NonTransactionalStop)
	}
	if args := New(ok).pluginArgs(); fmt.Sprint(args) != "[proto_version '1' publication_names 'p' messages 'true']" {
		t.Errorf("pluginArgs = %q; want messages 'true' added", args)
	}
	if args := New(Config{Publication: "p"}).pluginArgs(); len(args) != 2 {
		t.Errorf("pluginArgs without prefixes = %q; want no messages option", args)
	}
}

func containsField(err error, name string) bool {
	fes, _ := field.All(err)
	for _, fe := range fes {
		if fe.Field == name {
			return true
		}
	}
	return false
}
