package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// failoverProblem returns what keeps postgres.failover from working on this
// server (older than Postgres 17), with its fix, or "".
func failoverProblem(ctx context.Context, conn *pgx.Conn, cfg *Config) (string, error) {
	v, err := pgslot.ServerVersion(ctx, conn)
	if err != nil {
		return "", err
	}
	if v < pgslot.FailoverMinVersion {
		p := pgslot.FailoverUnsupported(v)
		if cfg.Fix != nil && cfg.Fix(p) != "" {
			return p.Error() + "; to fix: " + cfg.Fix(p), nil
		}
		return p.Error(), nil
	}
	return "", nil
}

// alterSlotFailover makes an existing slot a failover slot:
// ALTER_REPLICATION_SLOT is a replication command (Postgres 17+), and fails
// while a walsender holds the slot.
func alterSlotFailover(ctx context.Context, cfg *Config, slot string) error {
	pc, err := pgconn.ParseConfig(cfg.ReplicationConnDSN())
	if err != nil {
		return errors.New("postgres.replication_dsn (or postgres.dsn) cannot be parsed: check its syntax")
	}
	pc.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("connect over a replication connection to alter slot %s: %w", slot, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pgslot.AlterFailover(ctx, conn, slot)
}

// The settings failover slots need, as an operator writes them in postgresql.conf.
const (
	settingSyncSlots = "sync_replication_slots = on"
	settingFeedback  = "hot_standby_feedback = on"
)

// checkFailover checks what postgres.failover needs (docs/failover.md): a
// failover slot; on the primary synchronized_standby_slots naming physical
// slots that exist and are active; and on every standby among the hosts of
// a multi-host postgres.dsn, slot synchronisation and the slot, synced.
func checkFailover(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, sl slotInfo) {
	if !cfg.Failover {
		return
	}
	p, err := failoverProblem(ctx, conn, cfg)
	switch {
	case err != nil:
		c.fail("failover", "%v", cfg.scrub(err))
		return
	case p != "":
		c.fail("failover", "%s", p)
		return
	}
	// The slot itself.
	switch _, failover, _, err := pgslot.SlotFailover(ctx, conn, cfg.Slot); {
	case err != nil:
		c.fail("failover slot", "%v", cfg.scrub(err))
	case !sl.Exists:
		c.fail("failover slot", "%s does not exist; run `outbox-relay setup`, which creates it with FAILOVER", cfg.Slot)
	case !failover:
		c.fail("failover slot", "%s is not a failover slot, so no standby syncs it; with the relay stopped run `outbox-relay setup` (ALTER_REPLICATION_SLOT %s (FAILOVER true))", cfg.Slot, sql.Ident(cfg.Slot))
	default:
		c.ok("failover slot", "%s has failover = true: standbys with sync_replication_slots = on keep a copy", cfg.Slot)
	}

	// The primary: the relay must receive nothing the standbys have not.
	var standbySlots string
	if err := conn.QueryRow(ctx, `SELECT current_setting('synchronized_standby_slots')`).Scan(&standbySlots); err != nil {
		c.fail("synchronized_standby_slots", "cannot read it: %v", cfg.scrub(err))
		return
	}
	named := splitSetting(standbySlots)
	if len(named) == 0 {
		c.fail("synchronized_standby_slots", "empty: the relay can receive and publish transactions that no standby has received yet, "+
			"and after a failover those are in Kafka but not in the new primary, whose synced slot is also behind; "+
			"on the primary set synchronized_standby_slots = '<the physical slot of each failover standby (its primary_slot_name)>' and reload (SELECT pg_reload_conf())")
	} else {
		for _, name := range named {
			var exists, physical, active bool
			err := conn.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_and(slot_type = 'physical'), false), coalesce(bool_or(active), false)
FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).Scan(&exists, &physical, &active)
			switch {
			case err != nil:
				c.fail("synchronized_standby_slots", "cannot read slot %s: %v", name, cfg.scrub(err))
			case !exists || !physical:
				c.fail("synchronized_standby_slots", "names %s, which is not a physical slot here: logical decoding waits for it for ever (the relay receives nothing); "+
					"create it (SELECT pg_create_physical_replication_slot(%s)) and set primary_slot_name = %s on the standby, or remove it from the setting", name, sql.Literal(name), sql.Literal(name))
			case !active:
				c.warn("synchronized_standby_slots", "names %s, which no standby streams from now: the relay receives nothing until it does (the standby is down or lagging); start the standby, or remove %s from the setting to let the relay go on without it", name, name)
			default:
				c.ok("synchronized_standby_slots", "names %s, a physical slot a standby streams from: the relay receives only what that standby has", name)
			}
		}
	}
	checkStandbys(ctx, cfg, c, named)
}

// checkStandbys checks every host of postgres.dsn that is a standby.
func checkStandbys(ctx context.Context, cfg *Config, c *checker, named []string) {
	hosts, err := pgslot.Hosts(cfg.ReplicationConnDSN())
	if err != nil {
		c.fail("failover standbys", "%v", err)
		return
	}
	if len(hosts) < 2 {
		c.warn("failover standbys", "postgres.dsn names one host: the standbys are not checked, and after a promotion the relay reaches the new primary only if that name moves to it; "+
			"list the standbys too (host=primary,standby1 port=5432,5432 target_session_attrs=read-write, or postgres://user@primary:5432,standby1:5432/db?target_session_attrs=read-write)")
		return
	}
	pcfg, err := sqlconn.ConnConfig(cfg.ReplicationConnDSN())
	if err != nil {
		c.fail("failover standbys", "postgres.dsn cannot be parsed: check its syntax")
		return
	}
	standbys := 0
	var primaries []string
	for _, h := range hosts {
		cc := pcfg.Copy()
		cc.Config = *h.Config()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		conn, err := pgx.ConnectConfig(cctx, cc)
		if err != nil {
			cancel()
			c.warn("failover standby "+h.Addr, "cannot connect, not checked: %v", cfg.scrub(err))
			continue
		}
		var recovery bool
		switch err := conn.QueryRow(cctx, `SELECT pg_is_in_recovery()`).Scan(&recovery); {
		case err != nil:
			c.warn("failover standby "+h.Addr, "cannot tell its role, not checked: %v", cfg.scrub(err))
		case recovery:
			standbys++
			checkStandby(cctx, conn, cfg, c, "failover standby "+h.Addr, named)
		default:
			primaries = append(primaries, h.Addr)
		}
		conn.Close(context.WithoutCancel(ctx))
		cancel()
	}
	if len(primaries) > 1 {
		c.fail("failover standbys", "%d hosts of postgres.dsn accept writes (%s): an old primary was started again after a promotion (split brain); "+
			"stop the one that is not the current primary and rebuild it as a standby (pg_rewind or a new base backup). The relay refuses an old primary (server_superseded)",
			len(primaries), strings.Join(primaries, ", "))
	}
	if standbys == 0 {
		c.warn("failover standbys", "no host of postgres.dsn is a standby now: nothing to fail over to")
	}
}

// checkStandby checks one standby and prints the settings it lacks.
func checkStandby(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, name string, named []string) {
	var syncSlots, feedback, slotName string
	err := conn.QueryRow(ctx, `SELECT current_setting('sync_replication_slots'), current_setting('hot_standby_feedback'), current_setting('primary_slot_name')`).
		Scan(&syncSlots, &feedback, &slotName)
	if err != nil {
		c.fail(name, "cannot read its settings (Postgres 17+ has sync_replication_slots): %v", cfg.scrub(err))
		return
	}
	var missing []string
	if syncSlots != "on" {
		missing = append(missing, settingSyncSlots)
	}
	if feedback != "on" {
		missing = append(missing, settingFeedback)
	}
	if slotName == "" {
		missing = append(missing, "primary_slot_name = '<a physical slot on the primary>'")
	}
	// sync_replication_slots also needs a dbname in primary_conninfo, which
	// only a superuser may read: the synced slot below shows it works.
	if len(missing) > 0 {
		c.fail(name, "does not sync the slot; add to its postgresql.conf: %s; and a dbname in primary_conninfo (e.g. dbname=postgres); then reload it", strings.Join(missing, ", "))
	}
	if slotName != "" && !slices.Contains(named, slotName) {
		c.fail(name, "streams from physical slot %s, which the primary's synchronized_standby_slots does not name: the relay may get ahead of this standby, whose synced slot then cannot be used after a promotion; "+
			"on the primary add it: synchronized_standby_slots = %s", slotName, sql.Literal(strings.Join(append(append([]string(nil), named...), slotName), ",")))
	}
	switch exists, _, synced, err := pgslot.SlotFailover(ctx, conn, cfg.Slot); {
	case err != nil:
		c.fail(name, "%v", cfg.scrub(err))
	case !exists:
		c.fail(name, "has no copy of slot %s yet: a promotion now loses the slot (the slot sync worker creates it within seconds once the settings above are in place and the slot is a failover slot)", cfg.Slot)
	case !synced:
		c.fail(name, "has slot %s, but not synced and persistent: either it is still temporary (a new synced slot stays so until the primary's slot passes the standby's position and xmin, once the relay has confirmed further: run check again in a minute), "+
			"or it was created on the standby itself (drop it there); a promotion now loses the slot", cfg.Slot)
	case len(missing) == 0:
		c.ok(name, "syncs slot %s (synced = true), %s, %s, primary_slot_name = %s", cfg.Slot, settingSyncSlots, settingFeedback, slotName)
	}
}

// splitSetting splits a list setting such as synchronized_standby_slots.
func splitSetting(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.Trim(strings.TrimSpace(s), `"`); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// setupFailover makes an existing slot a failover slot when it is not one.
func setupFailover(ctx context.Context, cfg *Config, conn *pgx.Conn, slot string, say, problem func(string, ...any)) error {
	_, failover, _, err := pgslot.SlotFailover(ctx, conn, slot)
	if err != nil {
		return err
	}
	if failover {
		say("slot %s: is a failover slot (standbys with sync_replication_slots = on keep a copy; `outbox-relay check` verifies them)", slot)
		return nil
	}
	if err := alterSlotFailover(ctx, cfg, slot); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use: a relay holds it
			problem("slot %s: is not a failover slot and cannot be altered while a relay streams from it (%s); stop the relay, run setup again, start the relay", slot, pgErr.Message)
			return nil
		}
		return fmt.Errorf("make slot %s a failover slot (ALTER_REPLICATION_SLOT %s (FAILOVER true)): %w", slot, sql.Ident(slot), cfg.scrub(err))
	}
	say("slot %s: altered to a failover slot (ALTER_REPLICATION_SLOT %s (FAILOVER true)); `outbox-relay check` verifies the standbys", slot, sql.Ident(slot))
	return nil
}
