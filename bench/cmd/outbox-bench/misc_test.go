package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

func TestPayloadInt(t *testing.T) {
	tests := []struct {
		payload string
		want    int64
		ok      bool
	}{
		{`{"pad": "xx", "seq": 5, "txn": 42, "ts_ns": 1}`, 42, true},
		{`{"txn": 7}`, 7, true},
		{`{"seq": 5}`, 0, false},
		{`{"txn": "x"}`, 0, false},
	}
	for _, tt := range tests {
		got, ok := payloadInt([]byte(tt.payload), "txn")
		if got != tt.want || ok != tt.ok {
			t.Errorf("payloadInt(%q, \"txn\") = %d, %v; want %d, %v", tt.payload, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCheckLoopbackDSN(t *testing.T) {
	tests := []struct {
		dsn string
		ok  bool
	}{
		{"postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable", true},
		{"postgres://postgres@localhost/postgres", true},
		{"postgresql://u@[::1]:5432/db", true},
		{"host=127.0.0.1 port=5432 user=postgres", true},
		{"postgres://postgres@db.example.com:5432/postgres", false},
		{"postgres://postgres@127.0.0.1,10.0.0.5/postgres", false},
		{"host=10.1.2.3 user=postgres", false},
		{"user=postgres", false}, // no host: refuse rather than guess
	}
	for _, tt := range tests {
		err := checkLoopbackDSN(tt.dsn)
		if (err == nil) != tt.ok {
			t.Errorf("checkLoopbackDSN(%q) = %v; want ok=%v", tt.dsn, err, tt.ok)
		}
	}
}

func TestWithDatabase(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://postgres@127.0.0.1:55432/postgres?sslmode=disable", "postgres://postgres@127.0.0.1:55432/bench?sslmode=disable"},
		{"postgres://postgres@127.0.0.1:55432", "postgres://postgres@127.0.0.1:55432/bench"},
		{"host=127.0.0.1 dbname=postgres", "host=127.0.0.1 dbname=postgres dbname=bench"}, // the last dbname wins in libpq
	}
	for _, tt := range tests {
		if got, err := withDatabase(tt.dsn, "bench"); err != nil || got != tt.want {
			t.Errorf("withDatabase(%q) = %q, %v; want %q", tt.dsn, got, err, tt.want)
		}
	}
}

func TestParseVmHWM(t *testing.T) {
	status := "Name:\toutbox-relay\nVmPeak:\t  812345 kB\nVmHWM:\t   41236 kB\nVmRSS:\t   30000 kB\n"
	got, err := parseVmHWM(strings.NewReader(status))
	if want := int64(41236 * 1024); err != nil || got != want {
		t.Errorf("parseVmHWM(%q) = %d, %v; want %d", status, got, err, want)
	}
	if _, err := parseVmHWM(strings.NewReader("Name:\tx\n")); err == nil {
		t.Errorf("parseVmHWM(without VmHWM) = nil error; want an error")
	}
}

func TestFmt(t *testing.T) {
	counts := []struct {
		n    int
		want string
	}{{0, "0"}, {999, "999"}, {1000, "1,000"}, {1234567, "1,234,567"}, {-20000, "-20,000"}}
	for _, tt := range counts {
		if got := fmtCount(tt.n); got != tt.want {
			t.Errorf("fmtCount(%d) = %q; want %q", tt.n, got, tt.want)
		}
	}
	durs := []struct {
		d    string
		want string
	}{{"0s", "0"}, {"250us", "250µs"}, {"1.5ms", "1.5ms"}, {"12.34ms", "12.3ms"}, {"20ms", "20ms"}, {"2.5s", "2.5s"}}
	for _, tt := range durs {
		if got := fmtDur(mustDur(t, tt.d)); got != tt.want {
			t.Errorf("fmtDur(%s) = %q; want %q", tt.d, got, tt.want)
		}
	}
	sizes := []struct {
		b    int64
		want string
	}{{0, "0.0 MiB"}, {42 << 20, "42.0 MiB"}, {1219624960, "1,163.1 MiB"}, {(1 << 20) - 1, "1.0 MiB"}}
	for _, tt := range sizes {
		if got := fmtMB(tt.b); got != tt.want {
			t.Errorf("fmtMB(%d) = %q; want %q", tt.b, got, tt.want)
		}
	}
}

func TestLatencySamples(t *testing.T) {
	base := time.Unix(1700000000, 0)
	commits := &commitTimes{t: map[int64]time.Time{1: base}}
	msg := func(txn, seq int, appendedAfter time.Duration) kafka.Message {
		return kafka.Message{Value: fmt.Appendf(nil, `{"pad": "x", "seq": %d, "txn": %d, "ts_ns": 1}`, seq, txn), Time: base.Add(appendedAfter)}
	}
	s := newLatencySamples()
	s.add(msg(1, 10, 3*time.Millisecond), base.Add(5*time.Millisecond), commits)
	s.add(msg(1, 10, 3*time.Millisecond), base.Add(9*time.Millisecond), commits) // duplicate
	s.add(kafka.Message{Value: []byte(`{"other": 1}`)}, base, commits)           // not ours
	// txn 2 reaches the consumer before the producer recorded its commit.
	s.add(msg(2, 11, 7*time.Millisecond), base.Add(8*time.Millisecond), commits)
	if got, want := s.count(), int64(2); got != want {
		t.Errorf("count() = %d; want %d", got, want)
	}
	commits.set(2, base.Add(10*time.Millisecond))
	s.resolve(commits)
	wantAck := []time.Duration{3 * time.Millisecond, 0}
	wantReceipt := []time.Duration{5 * time.Millisecond, 0}
	if !slices.Equal(s.ack, wantAck) || !slices.Equal(s.receipt, wantReceipt) {
		t.Errorf("ack, receipt = %v, %v; want %v, %v", s.ack, s.receipt, wantAck, wantReceipt)
	}
	if s.duplicates != 1 || s.early != 1 || s.unknown != 1 {
		t.Errorf("duplicates, early, unknown = %d, %d, %d; want 1, 1, 1", s.duplicates, s.early, s.unknown)
	}
	s.reset()
	s.add(msg(1, 10, time.Millisecond), base, commits) // seq 10 is new again after reset
	if got := s.count(); got != 1 || s.duplicates != 0 || len(s.ack) != 1 {
		t.Errorf("after reset and one add: count() = %d, duplicates %d, %d samples; want 1, 0, 1", got, s.duplicates, len(s.ack))
	}
}

func TestCommandLine(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-runs", "3", "-peers", "debezium"}, "outbox-bench -runs 3 -peers debezium"},
		{[]string{"-cleanup-dsn", "postgres://postgres:secret@127.0.0.1/postgres", "-runs", "1"}, "outbox-bench -cleanup-dsn=… -runs 1"},
		{[]string{"--cleanup-dsn=postgres://postgres:secret@127.0.0.1/postgres"}, "outbox-bench -cleanup-dsn=…"},
	}
	for _, tt := range tests {
		if got := commandLine(tt.args); got != tt.want {
			t.Errorf("commandLine(%q) = %q; want %q", tt.args, got, tt.want)
		}
	}
}
