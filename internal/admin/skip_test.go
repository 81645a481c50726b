package admin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestPlanSkipBehindSlot: a position between the checkpoint and the slot's
// confirmed position is refused: the server no longer has that WAL. (The
// command makes a refusal exit 2: cmd/outbox-relay's TestCheckpointSet.)
func TestPlanSkipBehindSlot(t *testing.T) {
	pg, cfg := testDB(t)
	mustSetup(t, cfg, true, "Setup")
	insert := `INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES (gen_random_uuid(), 'Order', 'a-1', 'Created', '{"n": 1}')`
	pg.Exec(t, insert)
	between, err := pglogrepl.ParseLSN(testenv.QueryString(t, pg.DSN, `SELECT pg_current_wal_lsn()::text`))
	if err != nil {
		t.Fatal(err)
	}
	pg.Exec(t, insert)
	pg.Exec(t, `SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())`, cfg.Slot)
	_, err = PlanSkip(context.Background(), pg.Pool(t), cfg, between)
	var refused *SkipRefusedError
	if !errors.As(err, &refused) || !strings.Contains(err.Error(), "is behind the slot's confirmed position") {
		t.Errorf("PlanSkip(%s) behind the slot = %v; want a *SkipRefusedError, behind the slot", between, err)
	}
}
