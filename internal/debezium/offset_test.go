package debezium

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// The .dat fixtures are written by testdata/GenOffsets.java with the JDK's
// ObjectOutputStream, as Kafka Connect's FileOffsetBackingStore writes them;
// offsets-real.dat was written by a real Debezium 3.1.3 in Kafka Connect 3.9.1.

func TestReadOffsetFileOne(t *testing.T) {
	got, err := ReadOffsetFile(filepath.Join("testdata", "offsets-one.dat"))
	if err != nil {
		t.Fatalf("ReadOffsetFile: %v", err)
	}
	want := []Offset{{
		Connector: "outbox-connector", Server: "dbserver1",
		LSN: 24023128, LSNProc: 24023128, LSNCommit: 24022784,
		TxID: 771, TsUsec: 1718000000123456, MessageType: "INSERT",
	}}
	if !offsetsEqual(got, want) {
		t.Errorf("ReadOffsetFile = %+v; want %+v", got, want)
	}
	if !strings.Contains(string(got[0].Value), `"lsn_commit":24022784`) {
		t.Errorf("Value = %s; want the stored JSON", got[0].Value)
	}
}

func TestReadOffsetFileMany(t *testing.T) {
	got, err := ReadOffsetFile(filepath.Join("testdata", "offsets-many.dat"))
	if err != nil {
		t.Fatalf("ReadOffsetFile: %v", err)
	}
	// The MySQL connector's offset and the reset one are left out; the
	// rest sorted by connector.
	want := []Offset{
		{Connector: "outbox-a", Server: "app", LSN: 33554600, LSNProc: 33554600, LSNCommit: 33554600,
			TxID: 900, TsUsec: 1718000001000000, MessageType: "COMMIT"},
		{Connector: "outbox-b", Server: "billing", LSN: 4294967400, LSNProc: 4294967400, LSNCommit: 4294967296,
			LSNEventsProcessed: 2, TxID: 1204, TsUsec: 1718000002000000, Xmin: 1200, MessageType: "INSERT",
			TransactionID: "1204:4294967296"},
		{Connector: "outbox-snap", Server: "snap", LSN: 22000000, TxID: 500, TsUsec: 1718000003000000,
			Snapshot: "INITIAL"},
	}
	if !offsetsEqual(got, want) {
		t.Errorf("ReadOffsetFile =\n%+v\nwant\n%+v", got, want)
	}
}

func TestReadOffsetFileLarge(t *testing.T) {
	got, err := ReadOffsetFile(filepath.Join("testdata", "offsets-large.dat"))
	if err != nil {
		t.Fatalf("ReadOffsetFile: %v", err)
	}
	if len(got) != 100 {
		t.Fatalf("ReadOffsetFile: %d offsets; want 100", len(got))
	}
	for i, o := range got {
		// conn-000 and conn-001 share one value array: the second is a
		// back reference in the stream.
		want := uint64(1000 + i)
		if i < 2 {
			want = 1000
		}
		if name := fmt.Sprintf("conn-%03d", i); o.LSNCommit != want || o.Connector != name {
			t.Errorf("offset %d = %s lsn_commit %d; want %s lsn_commit %d", i, o.Connector, o.LSNCommit, name, want)
		}
	}
}

// offsets-real.dat is a real Debezium 3.1.3's file (Kafka Connect 3.9.1
// standalone, pgoutput, StringConverter): it may be captured again, so the
// test checks what any such file must hold rather than its numbers. The one
// captured first held ["outbox",{"server":"dbz_teststringconverter_…"}] →
// {"lsn_proc":2732370008,"messageType":"INSERT","lsn_commit":2732370008,
// "lsn":2732370008,"txId":30620,"ts_usec":…}: an INSERT at the very LSN where
// the previous commit record ended.
func TestReadOffsetFileReal(t *testing.T) {
	got, err := ReadOffsetFile(filepath.Join("testdata", "offsets-real.dat"))
	if err != nil {
		t.Fatalf("ReadOffsetFile: %v", err)
	}
	if len(got) != 1 {
		t.Fatalf("ReadOffsetFile = %d offsets; want the one connector's", len(got))
	}
	o := got[0]
	if o.Connector == "" || o.Server == "" || o.LSN == 0 || o.LSNProc == 0 || o.LSNCommit == 0 || o.TxID == 0 || o.TsUsec == 0 || o.MessageType == "" || o.Reset {
		t.Errorf("offset = %+v; want connector, server, lsn, lsn_proc, lsn_commit, txId, ts_usec and messageType set", o)
	}
	lsn, why, err := o.ResumeLSN()
	if err != nil || lsn != o.LSNCommit {
		t.Errorf("ResumeLSN() = %d, %q, %v; want lsn_commit %d", lsn, why, err, o.LSNCommit)
	}
	if o.MessageType != "COMMIT" && !strings.Contains(why, fmt.Sprintf("transaction %d is sent again whole", o.TxID)) {
		t.Errorf("ResumeLSN() explains %q; want transaction %d sent again after a %s", why, o.TxID, o.MessageType)
	}
}

func TestReadOffsetFileErrors(t *testing.T) {
	tests := []struct {
		name, file string
		want       string
		is         error
	}{
		{"empty map", "offsets-empty.dat", "among 0 entries", ErrNoOffsets},
		{"map of strings", "not-offsets-strings.dat", "not a Kafka Connect offset file: key of entry 0: is a string (TC_STRING), not a byte array", errNotOffsetFile},
		{"list", "not-offsets-list.dat", "not a Kafka Connect offset file: holds a java.util.ArrayList, not a java.util.HashMap", errNotOffsetFile},
		{"missing", "no-such-file.dat", "read offset file", os.ErrNotExist},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadOffsetFile(filepath.Join("testdata", tt.file))
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, tt.is) {
				t.Errorf("ReadOffsetFile(%s) = %v; want an error containing %q, wrapping %v", tt.file, err, tt.want, tt.is)
			}
		})
	}
}

// Every truncation of a real file, and a few corruptions, is an error, never
// a panic or a wrong offset.
func TestReadByteArrayMapDefensive(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "offsets-many.dat"))
	if err != nil {
		t.Fatal(err)
	}
	for n := range len(data) {
		if _, err := readByteArrayMap(data[:n]); err == nil || !errors.Is(err, errNotOffsetFile) {
			t.Fatalf("readByteArrayMap(first %d of %d bytes) = %v; want a not-an-offset-file error", n, len(data), err)
		}
	}
	corrupt := func(at int, b byte) []byte {
		c := append([]byte(nil), data...)
		c[at] = b
		return c
	}
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"magic", corrupt(0, 0), "not a Java serialization stream"},
		{"class name", corrupt(8+10, 'X'), "not a java.util.HashMap"},
		{"trailing bytes", append(append([]byte(nil), data...), 0x70), "1 bytes follow the map"},
		{"size", corrupt(0x4d, 0x7f), "claims"}, // the entry count's high byte
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readByteArrayMap(tt.data)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("readByteArrayMap = %v; want an error containing %q", err, tt.want)
			}
		})
	}
	for i := range data {
		for _, b := range []byte{0x00, 0x70, 0x71, 0x75, 0xff} {
			_, _ = readByteArrayMap(corrupt(i, b)) // must not panic
		}
	}
}

func TestParseOffsetRecord(t *testing.T) {
	key := []byte(`["outbox",{"server":"app"}]`)
	tests := []struct {
		name       string
		key, value string
		nullValue  bool
		want       Offset
		err        string
		notPG      bool
	}{
		{name: "streaming", key: string(key),
			value: `{"transaction_id":null,"lsn_proc":24023128,"messageType":"INSERT","lsn_commit":24022784,"lsn":24023128,"txId":771,"ts_usec":1718000000123456}`,
			want:  Offset{Connector: "outbox", Server: "app", LSN: 24023128, LSNProc: 24023128, LSNCommit: 24022784, TxID: 771, TsUsec: 1718000000123456, MessageType: "INSERT"}},
		{name: "tombstone", key: string(key), nullValue: true,
			want: Offset{Connector: "outbox", Server: "app", Reset: true}},
		{name: "LSN above 2^63 stored as a negative long", key: string(key), value: `{"lsn":-1,"lsn_commit":-9223372036854775808}`,
			want: Offset{Connector: "outbox", Server: "app", LSN: 1<<64 - 1, LSNCommit: 1 << 63}},
		{name: "old boolean snapshot", key: string(key), value: `{"lsn":100,"snapshot":true,"last_snapshot_record":true}`,
			want: Offset{Connector: "outbox", Server: "app", LSN: 100, Snapshot: "INITIAL", LastSnapshotRecord: true}},
		{name: "string booleans", key: string(key), value: `{"lsn":100,"snapshot":"INITIAL","snapshot_completed":"true"}`,
			want: Offset{Connector: "outbox", Server: "app", LSN: 100, Snapshot: "INITIAL", SnapshotCompleted: true}},
		{name: "mysql", key: `["mysql",{"server":"m"}]`, value: `{"file":"binlog.000003","pos":1234}`, notPG: true},
		{name: "sql server partition", key: `["ss",{"server":"s","database":"d"}]`, value: `{"commit_lsn":"x"}`, notPG: true},
		{name: "not a connect key", key: `"just a string"`, value: `{"lsn":1}`, notPG: true},
		{name: "not json", key: string(key), value: `lsn=1`, notPG: true},
		{name: "lsn not a number", key: string(key), value: `{"lsn":"0/16B3748"}`, err: `lsn is 0/16B3748, not an LSN`},
		{name: "fractional lsn", key: string(key), value: `{"lsn":1.5}`, err: `lsn is 1.5, not an LSN`},
		{name: "txId not a number", key: string(key), value: `{"lsn":1,"txId":"x"}`, err: `txId is x, not an integer`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var value []byte
			if !tt.nullValue {
				value = []byte(tt.value)
			}
			got, err := ParseOffsetRecord([]byte(tt.key), value)
			switch {
			case tt.notPG:
				if !errors.Is(err, ErrNotPostgres) {
					t.Errorf("ParseOffsetRecord(%s, %s) = %v; want ErrNotPostgres", tt.key, tt.value, err)
				}
			case tt.err != "":
				if err == nil || errors.Is(err, ErrNotPostgres) || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("ParseOffsetRecord(%s, %s) = %v; want an error containing %q", tt.key, tt.value, err, tt.err)
				}
			case err != nil:
				t.Errorf("ParseOffsetRecord(%s, %s): %v", tt.key, tt.value, err)
			default:
				got.Value = nil
				if !reflect.DeepEqual(got, tt.want) {
					t.Errorf("ParseOffsetRecord(%s, %s) = %+v; want %+v", tt.key, tt.value, got, tt.want)
				}
			}
		})
	}
}

func TestLatestOffsets(t *testing.T) {
	rec := func(connector, server, value string) Record {
		r := Record{Key: []byte(`["` + connector + `",{"server":"` + server + `"}]`)}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}
	records := []Record{
		rec("b", "s", `{"lsn":1,"lsn_commit":1,"messageType":"COMMIT"}`),
		rec("a", "s", `{"lsn":5,"lsn_commit":5,"messageType":"COMMIT"}`),
		rec("b", "s", `{"lsn":9,"lsn_commit":8,"messageType":"INSERT"}`), // later wins
		rec("gone", "s", `{"lsn":3,"lsn_commit":3}`),
		rec("gone", "s", ""), // tombstone removes
		rec("back", "s", ""),
		rec("back", "s", `{"lsn":7,"lsn_commit":7}`), // re-set after a reset
		rec("mysql", "m", `{"file":"binlog.000001","pos":4}`),
		{Key: []byte(`garbage`), Value: []byte(`{}`)},
		rec("a", "other", `{"lsn":2,"lsn_commit":2}`), // another partition of a
	}
	got, err := LatestOffsets(records)
	if err != nil {
		t.Fatalf("LatestOffsets: %v", err)
	}
	var ids []string
	for _, o := range got {
		ids = append(ids, o.Connector+"/"+o.Server+"@"+lsnText(o.LSNCommit))
	}
	if want := "a/other@0/2 a/s@0/5 b/s@0/8 back/s@0/7"; strings.Join(ids, " ") != want {
		t.Errorf("LatestOffsets = %s; want %s", strings.Join(ids, " "), want)
	}

	_, err = LatestOffsets([]Record{rec("gone", "s", `{"lsn":3}`), rec("gone", "s", "")})
	if !errors.Is(err, ErrNoOffsets) || !strings.Contains(err.Error(), "1 resets") {
		t.Errorf("LatestOffsets(set, reset) = %v; want ErrNoOffsets naming 1 reset", err)
	}
	_, err = LatestOffsets([]Record{rec("bad", "s", `{"lsn":"x"}`)})
	if err == nil || errors.Is(err, ErrNoOffsets) || !strings.Contains(err.Error(), "record 0") {
		t.Errorf("LatestOffsets(bad lsn) = %v; want an error naming record 0", err)
	}
}

func TestResumeLSN(t *testing.T) {
	tests := []struct {
		name string
		o    Offset
		lsn  uint64
		why  string // a part of the explanation
		err  error
	}{
		{"after commit", Offset{LSN: 500, LSNProc: 500, LSNCommit: 500, TxID: 9, MessageType: "COMMIT"},
			500, "nothing is sent twice", nil},
		{"mid transaction", Offset{LSN: 620, LSNProc: 620, LSNCommit: 500, TxID: 10, MessageType: "INSERT"},
			500, "transaction 10 is sent again whole", nil},
		{"first change at the previous commit's end", Offset{LSN: 500, LSNProc: 500, LSNCommit: 500, TxID: 10, MessageType: "INSERT"},
			500, "transaction 10 is sent again whole", nil},
		{"change before the previous commit in the WAL", Offset{LSN: 400, LSNProc: 400, LSNCommit: 500, TxID: 10, MessageType: "UPDATE"},
			500, "transaction 10 is sent again whole", nil},
		{"begin", Offset{LSN: 510, LSNProc: 500, LSNCommit: 500, TxID: 10, MessageType: "BEGIN"},
			500, "delivered none of its events", nil},
		{"non-transactional message", Offset{LSN: 700, LSNProc: 700, LSNCommit: 700, MessageType: "MESSAGE"},
			700, "nothing is sent twice", nil},
		{"transactional message", Offset{LSN: 710, LSNProc: 710, LSNCommit: 700, TxID: 11, MessageType: "MESSAGE"},
			700, "transaction 11 is sent again whole", nil},
		{"no message type", Offset{LSN: 800, LSNProc: 800, LSNCommit: 800},
			800, "does not say whether", nil},
		{"no lsn_commit", Offset{LSN: 900, LSNProc: 900, TxID: 12, MessageType: "INSERT"},
			900, "(lsn_proc", nil},
		{"lsn only", Offset{LSN: 1000},
			1000, "only lsn", nil},
		{"snapshot finished", Offset{LSN: 1100, Snapshot: "INITIAL", LastSnapshotRecord: true},
			1100, "finished its snapshot", nil},
		{"incremental snapshot running", Offset{LSN: 1300, LSNProc: 1300, LSNCommit: 1300, MessageType: "COMMIT", Snapshot: "INCREMENTAL", SnapshotCompleted: true},
			1300, "incremental snapshot", nil},
		{"no lsn", Offset{}, 0, "slot's position", nil},
		{"snapshot running", Offset{Connector: "c", LSN: 1200, Snapshot: "INITIAL"}, 0, "", ErrSnapshotIncomplete},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lsn, why, err := tt.o.ResumeLSN()
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Errorf("ResumeLSN() = %d, %q, %v; want error %v", lsn, why, err, tt.err)
				}
				return
			}
			if err != nil || lsn != tt.lsn || !strings.Contains(why, tt.why) || strings.Contains(why, "\n") {
				t.Errorf("ResumeLSN() = %d, %q, %v; want %d and one line containing %q", lsn, why, err, tt.lsn, tt.why)
			}
		})
	}
}

func offsetsEqual(got, want []Offset) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		g := got[i]
		g.Value = nil
		if !reflect.DeepEqual(g, want[i]) {
			return false
		}
	}
	return true
}
