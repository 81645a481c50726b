package replication

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// testPostgresDSN is the one place integration tests learn where Postgres is,
// so that it can move to internal/testenv.
func testPostgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv("RELAY_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Skip("RELAY_TEST_POSTGRES_DSN is not set: integration test needs a Postgres with wal_level=logical")
	}
	return dsn
}

var dbSeq atomic.Int64

// testDB creates a fresh database (slots and publications are per database)
// and returns a DSN for it; everything is dropped when the test ends.
func testDB(t testing.TB) *testDatabase {
	t.Helper()
	base := testPostgresDSN(t)
	name := fmt.Sprintf("relay_repl_%d_%d", os.Getpid(), dbSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin, err := pgconn.Connect(ctx, base)
	if err != nil {
		t.Fatalf("connect %s: %v", "admin", err)
	}
	mustExec(t, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	mustExec(t, admin, "CREATE DATABASE "+name)
	cfg, err := pgconn.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Database = name
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn.Close(ctx)
		// Slots pin WAL even when inactive: drop them with the database.
		_, _ = admin.Exec(ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE database = '"+name+"' AND active_pid IS NOT NULL").ReadAll()
		time.Sleep(100 * time.Millisecond)
		mustExec(t, admin, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = '"+name+"'")
		mustExec(t, admin, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close(ctx)
	})
	dsnOut := base
	if strings.Contains(base, "://") {
		dsnOut = replaceURLDatabase(t, base, name)
	} else {
		dsnOut = base + " dbname=" + name
	}
	return &testDatabase{t: t, dsn: dsnOut, name: name, conn: conn, admin: admin}
}

type testDatabase struct {
	t     testing.TB
	dsn   string
	name  string
	conn  *pgconn.PgConn // to the test database
	admin *pgconn.PgConn // to the server's default database
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

func replaceURLDatabase(t testing.TB, dsn, db string) string {
	t.Helper()
	// postgres://user@host:port/dbname?params
	rest := dsn
	q := ""
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		rest, q = rest[:i], rest[i:]
	}
	scheme := strings.Index(rest, "://")
	slash := strings.IndexByte(rest[scheme+3:], '/')
	if slash >= 0 {
		rest = rest[:scheme+3+slash]
	}
	return rest + "/" + db + q
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
