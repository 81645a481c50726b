package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

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
