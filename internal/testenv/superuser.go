package testenv

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// SuperuserConn returns a superuser connection to the server of dsn, for tests
// that change server-wide settings (ALTER SYSTEM): RELAY_TEST_POSTGRES_SUPERUSER_DSN,
// dsn itself when its role is a superuser (containers), or the dev server's local
// socket (scripts/dev.sh: user postgres, trust). It fails the test when none is a
// superuser; the connection is closed at cleanup.
func SuperuserConn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	return superuserConn(t, dsn, false)
}

// SuperuserConnIn is SuperuserConn connected to dsn's database, for what
// is per database: grants on functions, extensions.
func SuperuserConnIn(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	return superuserConn(t, dsn, true)
}

func superuserConn(t testing.TB, dsn string, sameDB bool) *pgx.Conn {
	t.Helper()
	ctx := context.Background()
	candidates := []string{os.Getenv("RELAY_TEST_POSTGRES_SUPERUSER_DSN"), dsn}
	cfg, cfgErr := pgx.ParseConfig(dsn)
	if cfgErr == nil && repoRoot() != "" {
		sock := filepath.Join(repoRoot(), ".dev", "pg", "run")
		candidates = append(candidates, "host="+sock+" port="+strconv.Itoa(int(cfg.Port))+" user=postgres dbname="+cfg.Database)
	}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		cc, err := pgx.ParseConfig(c)
		if err != nil {
			continue
		}
		if sameDB && cfgErr == nil {
			cc.Database = cfg.Database
		}
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			continue
		}
		var super bool
		if err := conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err == nil && super {
			t.Cleanup(func() { conn.Close(context.Background()) })
			return conn
		}
		conn.Close(ctx)
	}
	t.Fatalf("testenv: no superuser connection to the test server (ALTER SYSTEM needs one): set RELAY_TEST_POSTGRES_SUPERUSER_DSN")
	return nil
}

// SuperuserDSN returns a superuser's DSN for the database of dsn, for tests that
// create roles (REPLICATION needs a superuser on PostgreSQL 15) or grant what the
// test role may not: dsn with RELAY_TEST_POSTGRES_SUPERUSER_DSN's user (`make -s
// dev-env` exports it; the dev servers' test role is no superuser), or dsn itself
// when its role is a superuser (containers). It fails the test when neither is.
func SuperuserDSN(t testing.TB, dsn string) string {
	t.Helper()
	su := os.Getenv("RELAY_TEST_POSTGRES_SUPERUSER_DSN")
	if su != "" {
		return WithUser(t, dsn, su)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var super bool
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		defer conn.Close(context.Background())
		err = conn.QueryRow(ctx, `SELECT rolsuper FROM pg_roles WHERE rolname = current_user`).Scan(&super)
	}
	if err != nil || !super {
		t.Fatalf("RELAY_TEST_POSTGRES_SUPERUSER_DSN is not set and the test role is no superuser (%v): "+
			"run `make dev-up` and `eval \"$(make -s dev-env)\"` (or `make test`)", err)
	}
	return dsn
}

// WithUser returns dsn (a URL) with the user and password of the URL from.
func WithUser(t testing.TB, dsn, from string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("testenv: test DSN is not a URL: %v", err)
	}
	f, err := url.Parse(from)
	if err != nil {
		t.Fatalf("testenv: DSN is not a URL: %v", err)
	}
	u.User = f.User
	return u.String()
}

// LeastPrivilegedRole creates a role with only LOGIN REPLICATION and a password,
// as adminDSN's user (a superuser: see SuperuserDSN), and returns its name and
// password; the role is dropped when the test ends. Call it before the database
// the role is granted on is made, so that the role is dropped after it (a role
// with grants in a database cannot be).
func LeastPrivilegedRole(t testing.TB, adminDSN string) (role, password string) {
	t.Helper()
	role = UniqueName(t, "lp")
	password = "pw-" + role
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, adminDSN)
	if err != nil {
		t.Fatalf("testenv: create role %s: %v", role, err)
	}
	defer conn.Close(context.Background())
	// Role and password are UniqueName's letters, digits and underscores.
	if _, err := conn.Exec(ctx, `CREATE ROLE `+pgx.Identifier{role}.Sanitize()+` LOGIN REPLICATION PASSWORD '`+password+`'`); err != nil {
		t.Fatalf("testenv: create role %s: %v", role, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, adminDSN)
		if err != nil {
			t.Errorf("drop role %s: %v", role, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP ROLE IF EXISTS `+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	return role, password
}
