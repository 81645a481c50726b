package replication

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// testDB returns a fresh database from internal/testenv (slots and
// publications are per database; it drops them at cleanup) with a connection
// for the test's SQL.
func testDB(t testing.TB) *testDatabase {
	t.Helper()
	pg := testenv.Postgres(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgconn.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatalf("connect to the test database: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	d := &testDatabase{t: t, dsn: pg.DSN, conn: conn}
	d.name = d.value("SELECT current_database()")
	return d
}

type testDatabase struct {
	t    testing.TB
	dsn  string
	name string
	conn *pgconn.PgConn
}

func (d *testDatabase) exec(sql string) {
	d.t.Helper()
	mustExec(d.t, d.conn, sql)
}

// value returns the first column of the first row of the last statement's
// result, "NULL" for NULL.
func (d *testDatabase) value(sql string) string {
	d.t.Helper()
	res := mustExec(d.t, d.conn, sql)
	last := res[len(res)-1]
	if len(last.Rows) == 0 {
		d.t.Fatalf("%q returned no rows", sql)
	}
	if v := last.Rows[0][0]; v != nil {
		return string(v)
	}
	return "NULL"
}

func mustExec(t testing.TB, conn *pgconn.PgConn, sql string) []*pgconn.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := conn.Exec(ctx, sql).ReadAll()
	if err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
	return res
}

// A walMessage is one captured XLogData payload: a pgoutput message.
type walMessage struct {
	LSN  pglogrepl.LSN
	Data []byte
}

// readFixture reads testdata/<name>: one message a line, "LSN HEX", with
// blank lines and # comments ignored.
func readFixture(t testing.TB, name string) []walMessage {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var msgs []walMessage
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		lsnText, hexText, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("fixture %s: bad line %q", name, line)
		}
		lsn, err := pglogrepl.ParseLSN(lsnText)
		if err != nil {
			t.Fatalf("fixture %s: %v", name, err)
		}
		data, err := hex.DecodeString(hexText)
		if err != nil {
			t.Fatalf("fixture %s: %v", name, err)
		}
		msgs = append(msgs, walMessage{LSN: lsn, Data: data})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return msgs
}
