package checkpoint_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// newDatabase returns the DSN of a fresh, empty database, dropped (with its
// replication slots) when the test ends.
func newDatabase(t *testing.T) string {
	t.Helper()
	return testenv.Postgres(t).DSN
}

// newPool is a pool on a fresh, empty database, closed when the test ends.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), newDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
