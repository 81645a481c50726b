package testenv

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// ExecAs runs stmts in the database of dsn as dsn's user (not as the
// superuser: what the user may do is often what a test checks), each within
// the minute the connection has.
func ExecAs(t testing.TB, dsn string, stmts ...string) {
	t.Helper()
	withConn(t, dsn, func(ctx context.Context, conn *pgx.Conn) {
		for _, s := range stmts {
			if _, err := conn.Exec(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	})
}

// QueryString runs q in the database of dsn as dsn's user and returns its
// one value.
func QueryString(t testing.TB, dsn, q string, args ...any) string {
	t.Helper()
	var s string
	withConn(t, dsn, func(ctx context.Context, conn *pgx.Conn) {
		if err := conn.QueryRow(ctx, q, args...).Scan(&s); err != nil {
			t.Fatalf("query %q: %v", q, err)
		}
	})
	return s
}

// withConn runs use on a connection to dsn, closed when use returns; a
// minute bounds the whole, so that a stuck server fails the test instead of
// hanging it.
func withConn(t testing.TB, dsn string, use func(context.Context, *pgx.Conn)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	use(ctx, conn)
}

// WantLines fails the test for each of want that out (what's output) lacks.
func WantLines(t testing.TB, what, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s output lacks %q; got:\n%s", what, w, out)
		}
	}
}
