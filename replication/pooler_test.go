package replication

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestClassifyPooler: PgBouncer's refusal of a replication connection is
// ErrPooler, fatal, naming postgres.replication_dsn and not pg_hba.conf as a
// fix; Postgres's own refusals keep their meaning.
func TestClassifyPooler(t *testing.T) {
	s := &Stream{}
	bouncer := fmt.Errorf("failed to connect: %w", &pgconn.PgError{Severity: "FATAL", Code: "08P01", Message: "unsupported startup parameter: replication"})
	err := s.classify("connect", bouncer)
	if !errors.Is(err, ErrPooler) || !errors.Is(err, bouncer) {
		t.Fatalf("classify(PgBouncer's refusal) = %v; want ErrPooler wrapping the cause", err)
	}
	var fe *fatalError
	if !errors.As(err, &fe) {
		t.Errorf("classify(PgBouncer's refusal) = %T; want a fatal error (reconnecting cannot help)", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "set postgres.replication_dsn") || strings.Contains(msg, "has a line for this database") {
		t.Errorf("classify(PgBouncer's refusal) = %q; want the pooler advice, not pg_hba.conf's", msg)
	}
	auth := &pgconn.PgError{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "relay"`}
	if err := s.classify("connect", auth); !errors.Is(err, ErrAuth) || PoolerRefused(auth) {
		t.Errorf("classify(Postgres's auth failure) = %v, PoolerRefused %t; want ErrAuth, false", err, PoolerRefused(auth))
	}
}
