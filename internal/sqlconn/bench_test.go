package sqlconn_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// BenchmarkSaveExecMode measures the relay's hot path on its SQL pool, a
// fenced checkpoint save (one UPDATE), in pgx's default exec mode (named
// prepared statements, which a transaction-mode pooler breaks) and in the
// mode sqlconn uses (unnamed statements, descriptions cached), against the
// dev Postgres:
//
//	go test -run '^$' -bench BenchmarkSaveExecMode -count 5 ./internal/sqlconn
func BenchmarkSaveExecMode(b *testing.B) {
	for _, m := range []struct {
		name string
		mode pgx.QueryExecMode
	}{{"cache_statement", pgx.QueryExecModeCacheStatement}, {"cache_describe", sqlconn.ExecMode}} {
		b.Run(m.name, func(b *testing.B) {
			ctx := context.Background()
			pg := testenv.Postgres(b)
			pc, err := sqlconn.PoolConfig(pg.DSN)
			if err != nil {
				b.Fatal(err)
			}
			pc.ConnConfig.DefaultQueryExecMode = m.mode
			pool, err := pgxpool.NewWithConfig(ctx, pc)
			if err != nil {
				b.Fatal(err)
			}
			defer pool.Close()
			tbl, _ := sql.ParseTable("outbox_relay_checkpoint")
			if _, err := pool.Exec(ctx, sql.CheckpointTable(tbl)); err != nil {
				b.Fatal(err)
			}
			s := checkpoint.New(pool, tbl.String())
			epoch, err := s.TakeOver(ctx, "bench", "bench", checkpoint.Server{})
			if err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				if err := s.SaveFenced(ctx, "bench", epoch, pglogrepl.LSN(i+1), time.Time{}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
