package main

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/event"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

func TestParseLSN(t *testing.T) {
	good := map[string]pglogrepl.LSN{"0/0": 0, "16/B374D848": 0x16_B374D848, "ffffffff/FFFFFFFF": math.MaxUint64, "1/0": 1 << 32}
	for in, want := range good {
		if got, err := parseLSN(in); err != nil || got != want {
			t.Errorf("parseLSN(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1", "1/2/3", "1//2", "/1", "1/", "123456789/0", "0/123456789", "g/0", " 1/2", "1/2 ", "+1/2", "0x1/2", "1/2x"} {
		if got, err := parseLSN(in); err == nil || !strings.Contains(err.Error(), "like 16/B374D848") {
			t.Errorf("parseLSN(%q) = %s, %v; want an error showing the accepted form", in, got, err)
		}
	}
}

// TestUsageErrorsExit2: whatever is wrong with the command line exits 2, as
// docs/commands.md promises; nothing connects anywhere before that.
func TestUsageErrorsExit2(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@127.0.0.1:9/app?connect_timeout=1")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9")
	for _, args := range [][]string{
		{"bogus"},
		{"--bogus"},
		{"run", "--bogus"},
		{"run", "extra"},
		{"check", "extra"},
		{"status", "--json=maybe"},
		{"version", "--bogus"},
		{"retries", "lsit"},
		{"retries", "show"},
		{"retries", "show", "1", "2"},
		{"retries", "list", "--limit", "x"},
		{"retries", "list", "--limit"},
		{"lag", "--max-bytes", "lots"},
		{"lag", "one", "two"},
		{"lag", "--watch=0.001"},
		{"lag", "--watch", "0.001"},
		{"lag", "--watch=10ms"},
		{"lag", "--watch=0s"},
		{"run", "--start-lsn", "1/2/3"},
		{"run", "--start-lsn", "123456789/0"},
		{"run", "--force"},
		{"setup", "--create-outbox-table=perhaps"},
	} {
		code, out, errOut := run(t, args...)
		if code != exitcode.Usage {
			t.Errorf("outbox-relay %s = exit %d; want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, exitcode.Usage, out, errOut)
		}
	}
	_, _, errOut := run(t, "lag", "--watch", "0.001")
	if !strings.Contains(errOut, "at least 1s") {
		t.Errorf("lag --watch 0.001: stderr %q; want it to name the minimum", errOut)
	}
	_, _, errOut = run(t, "run", "--start-lsn", "1/2/3")
	if !strings.Contains(errOut, `"1/2/3" is not a WAL position`) || !strings.Contains(errOut, "like 16/B374D848") {
		t.Errorf("run --start-lsn 1/2/3: stderr %q; want the accepted form", errOut)
	}
	// Help is not an error.
	if code, _, _ := run(t, "retries"); code != exitcode.OK {
		t.Errorf("outbox-relay retries = exit %d; want help and 0", code)
	}
}

// TestStartLSNBeyondWAL: a --start-lsn the server's WAL has not reached yet
// would skip every event until it does: refused without --force, exit 2,
// naming the current position.
func TestStartLSNBeyondWAL(t *testing.T) {
	dsn, _ := dbEnv(t)
	t.Setenv("RELAY_METRICS_LISTEN", "")
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	current := testenv.QueryString(t, dsn, "SELECT pg_current_wal_lsn()::text")
	code, _, errOut := run(t, "run", "--start-lsn", "FFFFFFFF/0")
	if code != exitcode.Usage || !strings.Contains(errOut, "beyond the server's current WAL position") || !strings.Contains(errOut, "--force") {
		t.Errorf("run --start-lsn FFFFFFFF/0 = exit %d, %q; want %d refusing it and naming --force", code, errOut, exitcode.Usage)
	}
	if !strings.Contains(errOut, strings.SplitN(current, "/", 2)[0]+"/") {
		t.Errorf("run --start-lsn FFFFFFFF/0: %q; want the current WAL position (about %s)", errOut, current)
	}
	if got := testenv.QueryString(t, dsn, "SELECT coalesce((SELECT lsn::text FROM outbox_relay_checkpoint), 'none')"); got != "none" {
		t.Errorf("checkpoint after a refused --start-lsn = %s; want none saved", got)
	}
}

func TestInFlightBounds(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@127.0.0.1:9/app")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9")
	for _, tt := range []struct{ key, value, want string }{
		{"RELAY_PIPELINE_MAX_IN_FLIGHT_BYTES", "9223372036854775807", "pipeline.max_in_flight_bytes: 9223372036854775807 is out of range; allowed 65536 (64 KiB) to 17179869184 (16 GiB)"},
		{"RELAY_PIPELINE_MAX_IN_FLIGHT_BYTES", "9223372036854775808", "pipeline.max_in_flight_bytes: 9223372036854775808 is out of range"},
		{"RELAY_PIPELINE_MAX_IN_FLIGHT_BYTES", "100", "pipeline.max_in_flight_bytes: 100 is out of range"},
		{"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS", "4611686018427387904", "pipeline.max_in_flight_events: 4611686018427387904 is out of range; allowed 1 to 10000000"},
	} {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.key, tt.value)
			code, _, errOut := run(t, "run")
			if code != exitcode.Usage || !strings.Contains(errOut, tt.want) {
				t.Errorf("run with %s=%s = exit %d, %q; want %d and %q", tt.key, tt.value, code, errOut, exitcode.Usage, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		window int
		want   int64
	}{
		{8 << 20, 32<<20 + 16<<20},
		{relay.MaxInFlightBytesLimit, 32<<20 + 2*relay.MaxInFlightBytesLimit},
		{math.MaxInt, math.MaxInt64},
		{math.MaxInt64/2 - 1, math.MaxInt64},
		{0, 32 << 20},
	} {
		if got := memoryLimit(tt.window); got != tt.want || got <= 0 {
			t.Errorf("memoryLimit(%d) = %d; want %d", tt.window, got, tt.want)
		}
	}
}

// TestRetriesEscapeControls: an aggregate type written by an application
// reaches the operator's terminal escaped, JSON stays JSON.
func TestRetriesEscapeControls(t *testing.T) {
	dsn, slot := dbEnv(t)
	unsetenv(t, "RELAY_KAFKA_BROKERS")
	table, _ := sql.ParseTable(sql.DefaultRetryTable)
	testenv.ExecAs(t, dsn, sql.RetryTable(table)...)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	s, err := retry.NewStore(pool, "", slot)
	if err != nil {
		t.Fatal(err)
	}
	ev := retry.Event{EventKey: "ev-\x1b1", EventID: "ev-\x1b1", Aggregate: (event.Lane{Topic: "t\x1b", Key: "k\r"}).String(),
		AggregateType: "Order\x1b[2J\rX\a", AggregateID: "k\r", EventType: "Created\a", Topic: "t\x1b",
		Key: []byte("k\r"), Value: []byte("v\x1b[31m"), Extra: []retry.Header{{Key: "h\x1b", Value: []byte("\a")}},
		Permanent: true, Reason: "invalid topic \x1b]0;pwned\a"}
	if err := s.Insert(context.Background(), []retry.Event{ev}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"list"}, {"show", "1"}} {
		code, out, errOut := run(t, append([]string{"retries"}, args...)...)
		if code != exitcode.OK {
			t.Fatalf("retries %v = exit %d, %s", args, code, errOut)
		}
		if strings.ContainsAny(out, "\x1b\r\a") {
			t.Errorf("retries %v printed control characters:\n%q", args, out)
		}
		if !strings.Contains(out, `\x1b`) {
			t.Errorf("retries %v output lacks the escaped ESC:\n%s", args, out)
		}
	}
	_, out, _ := run(t, "retries", "show", "1")
	testenv.WantLines(t, "retries show", squeeze(out), `aggregate type: Order\x1b[2J\rX\a`, `value: v\x1b[31m`, `h\x1b: \a`, `last error: invalid topic \x1b]0;pwned\a`)
	_, out, _ = run(t, "retries", "show", "1", "--json")
	if !strings.Contains(out, `"aggregate_type": "Order\u001b[2J\rX\u0007"`) {
		t.Errorf("retries show --json = %s; want the aggregate type JSON-escaped", out)
	}
}

func mustParseLSN(t *testing.T, s string) pglogrepl.LSN {
	t.Helper()
	lsn, err := pglogrepl.ParseLSN(s)
	if err != nil {
		t.Fatalf("parse LSN %q: %v", s, err)
	}
	return lsn
}
