package sql_test

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// newDatabase returns the DSN of a fresh, empty database, dropped (with its
// replication slots) when the test ends.
func newDatabase(t *testing.T) string {
	t.Helper()
	return testenv.Postgres(t).DSN
}
