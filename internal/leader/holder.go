package leader

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/checkpoint"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// Holder describes the process streaming slot sl, for an operator: its
// walsender, and the leader the checkpoint row of table names (another
// relay's host, pid and start).
func Holder(ctx context.Context, pool *pgxpool.Pool, table string, sl pgslot.Slot) string {
	var s string
	if sl.ActivePID != nil {
		s = fmt.Sprintf("walsender pid %d", *sl.ActivePID)
	}
	if w := sl.Walsender; w != nil {
		if w.ApplicationName != nil {
			s += fmt.Sprintf(", application %q", *w.ApplicationName)
		}
		if w.ClientAddr != nil {
			s += ", from " + *w.ClientAddr
		}
		if w.BackendStart != nil {
			s += ", since " + w.BackendStart.UTC().Format(time.RFC3339)
		}
	}
	if l, err := checkpoint.New(pool, table).Leader(ctx, sl.Name); err == nil && l.Epoch > 0 {
		s += fmt.Sprintf("; last relay to take over: %s (epoch %d, at %s)", l.Leader, l.Epoch, l.Since.UTC().Format(time.RFC3339))
	}
	return s
}
