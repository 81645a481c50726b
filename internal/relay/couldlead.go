package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outbox-relay/outbox-relay/sql"
)

// couldLeadEvery is how often a standby checks again that it could lead: a
// replication connection of its own each time, so not at every poll.
const couldLeadEvery = 30 * time.Second

// couldLead says why this relay, standing by, could not take over if the
// leader went away, or nil: a standby whose role lacks REPLICATION (or whom
// pg_hba.conf refuses a replication connection) or a privilege leading needs
// would report ready until it is needed and then fail, and nobody would take
// over (issue 37). It opens a replication connection and runs
// IDENTIFY_SYSTEM, as leading does first, and asks Postgres for the table
// privileges leading uses (sql.TablePrivileges; the retry table's sequence
// is left to `outbox-relay check`, which reads its real name).
func (r *Relay) couldLead(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := r.identify(ctx); err != nil {
		return fmt.Errorf("a replication connection fails, so it could not lead: %w", err)
	}
	o := sql.Objects{Retention: r.cfg.Retention.Retention > 0}
	var err error
	if o.Checkpoint, err = sql.ParseTable(r.cfg.CheckpointTable); err != nil {
		return err
	}
	if o.Retry, err = sql.ParseTable(r.cfg.RetryTable); err != nil {
		return err
	}
	for i, ob := range r.cfg.outboxes() {
		t, err := sql.ParseTable(ob.name)
		if err != nil {
			return err
		}
		if i == 0 {
			o.Outbox = t
		} else {
			o.More = append(o.More, t)
		}
	}
	var role string
	if err := pool.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
		return err
	}
	var lacks []string
	for _, p := range sql.TablePrivileges(o) {
		if p.Kind != sql.Relation {
			continue
		}
		var missing []string
		// A table that does not exist is lead's to report (it names setup).
		err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(p ORDER BY o), '{}') FROM unnest($2::text[]) WITH ORDINALITY AS u(p, o)
WHERE to_regclass($1) IS NOT NULL AND NOT has_table_privilege(to_regclass($1), p)`, p.Object.Quoted(), p.Privileges).Scan(&missing)
		if err != nil {
			return fmt.Errorf("privileges on the %s %s: %w", p.What, p.Object, err)
		}
		if len(missing) > 0 {
			lacks = append(lacks, fmt.Sprintf("%s on the %s %s (fix: %s)", strings.Join(missing, ", "), p.What, p.Object, p.Grant(role, missing...)))
		}
	}
	if len(lacks) > 0 {
		return fmt.Errorf("role %s lacks privileges leading needs, so it could not lead: %s", role, strings.Join(lacks, "; "))
	}
	return nil
}

// checkCouldLead runs couldLead and records its answer for Ready and the
// ready metric, logging when it changes.
func (r *Relay) checkCouldLead(ctx context.Context, pool *pgxpool.Pool) {
	err := r.couldLead(ctx, pool)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		if r.leadProblem.Swap(nil) != nil {
			r.log.Info("standby: could take over again", "slot", r.cfg.Replication.Slot)
		}
		return
	}
	msg := err.Error()
	if prev := r.leadProblem.Swap(&msg); prev == nil || *prev != msg {
		r.log.Warn("standby not ready: this relay could not take over if the leader went away", "slot", r.cfg.Replication.Slot, "err", err)
	}
}
