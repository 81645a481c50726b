package sqlconn_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestNewHotPool: directly to Postgres the relay's pool keeps named
// prepared statements (the faster hot path); through PgBouncer, in either
// pool mode, it finds the pooler and uses unnamed statements, and many
// transactions in a row work through a transaction-mode pooler.
func TestNewHotPool(t *testing.T) {
	ctx := context.Background()
	pg := testenv.Postgres(t)
	tests := []struct {
		name       string
		dsn        string
		wantPooled bool
		wantMode   pgx.QueryExecMode
	}{
		{"direct", pg.DSN, false, pgx.QueryExecModeCacheStatement},
		{"pgbouncer transaction mode", testenv.PgBouncer(t, pg.DSN, "transaction"), true, sqlconn.ExecMode},
		{"pgbouncer session mode", testenv.PgBouncer(t, pg.DSN, "session"), true, sqlconn.ExecMode},
		{"mode set in the DSN", pg.DSN + "&default_query_exec_mode=exec", false, pgx.QueryExecModeExec},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, pooled, err := sqlconn.NewHotPool(ctx, tt.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if mode := pool.Config().ConnConfig.DefaultQueryExecMode; pooled != tt.wantPooled || mode != tt.wantMode {
				t.Errorf("NewHotPool(%s) = pooled %t, mode %v; want %t, %v", tt.name, pooled, mode, tt.wantPooled, tt.wantMode)
			}
			// Enough queries from several goroutines' connections that a
			// transaction-mode pooler mixes server connections.
			errs := make(chan error, 4)
			for range 4 {
				go func() {
					var err error
					for i := 0; i < 50 && err == nil; i++ {
						var n int
						err = pool.QueryRow(ctx, `SELECT $1::int + 1`, i).Scan(&n)
					}
					errs <- err
				}()
			}
			for range 4 {
				if err := <-errs; err != nil {
					t.Errorf("query through %s: %v", tt.name, err)
				}
			}
		})
	}
}
