package admin

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/isolation"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/sql"
)

// outboxNames are the relay's outbox tables as the retry table's
// outbox_table column names them: schema.table, in public when unqualified.
func (c *Config) outboxNames() []string {
	var out []string
	for _, t := range c.outboxTables() {
		if t.Schema == "" {
			t.Schema = "public"
		}
		out = append(out, t.String())
	}
	return out
}

func (c *Config) outboxTables() []sql.Table {
	out := []sql.Table{c.OutboxTable}
	for _, t := range c.Tables {
		out = append(out, t.Name)
	}
	return out
}

func (c *Config) owner() retry.Owner {
	return retry.Owner{Retry: c.RetryTable, Checkpoint: c.CheckpointTable, Slot: c.Slot, Outboxes: c.outboxNames()}
}

func (c *Config) isolation() isolation.Config {
	ic := isolation.Config{Slot: c.Slot, Publication: c.Publication, Retry: c.RetryTable, Checkpoint: c.CheckpointTable}
	if !c.MessagesOnly {
		ic.Outboxes = c.outboxTables()
	}
	return ic
}

// setupOwners gives the slot the retry rows of an earlier version that are
// provably its own, and says what else shares the relay's tables and outbox.
// Rows that may be another relay's are a problem: run would refuse to start.
func setupOwners(ctx context.Context, conn *pgx.Conn, cfg *Config, say, problem func(string, ...any)) error {
	n, err := retry.Adopt(ctx, conn, cfg.owner())
	var oe *retry.OrphansError
	switch {
	case errors.As(err, &oe):
		problem("retry table %s: %s", cfg.RetryTable, cfg.text(oe))
	case err != nil:
		return err
	case n > 0:
		say("retry table %s: %d rows of an earlier version, which belonged to no slot, are now slot %s's (no other slot ever saved a checkpoint here, and they come from its outbox tables)",
			cfg.RetryTable, n, cfg.Slot)
	}
	ic := cfg.isolation()
	rep, err := isolation.Survey(ctx, conn, ic)
	if err != nil {
		say("neighbours: cannot look for other relays and slots: %v", cfg.scrub(err))
		return nil
	}
	for _, f := range rep.Findings(ic) {
		say("neighbour: %s: %s", f.What, f.Meaning)
	}
	return nil
}

// checkOwners reports the retry rows of an earlier version (a FAIL when run
// would refuse to start) and, as WARN lines, the relay's neighbours.
func checkOwners(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	o, err := retry.FindOrphans(ctx, conn, cfg.owner())
	switch {
	case err != nil:
		// A role that may not read the table gets its FAIL from
		// checkPrivileges.
		c.warn("retry table", "cannot look for rows of an earlier version: %v", cfg.scrub(err))
	case o.Rows > 0 && o.Adoptable():
		c.warn("retry table", "%d rows of an earlier version belong to no slot; they are slot %s's (no other slot ever saved a checkpoint here, and they come from its outbox tables): setup or run gives them to it",
			o.Rows, cfg.Slot)
	case o.Rows > 0:
		c.fail("retry table", "%s", cfg.text(&retry.OrphansError{Owner: cfg.owner(), Orphans: o}))
	}
	ic := cfg.isolation()
	rep, err := isolation.Survey(ctx, conn, ic)
	if err != nil {
		c.warn("neighbours", "cannot look for other relays and slots: %v", cfg.scrub(err))
		return
	}
	for _, f := range rep.Findings(ic) {
		c.warn("neighbours", "%s", fmt.Sprintf("%s: %s", f.What, f.Meaning))
	}
}
