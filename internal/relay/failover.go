package relay

import (
	"context"
	"errors"

	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

// checkFailover refuses postgres.failover on a server without failover slots
// (before Postgres 17), where the operator would count on a slot that does
// not survive a promotion, and makes a slot that is not a failover slot yet
// one (logged; a failure to is logged too, and check says it).
func (r *Relay) checkFailover(ctx context.Context, q pgslot.Querier) error {
	if !r.cfg.Failover {
		return nil
	}
	v, err := pgslot.ServerVersion(ctx, q)
	if err != nil {
		return err
	}
	if v < pgslot.FailoverMinVersion {
		return pgslot.FailoverUnsupported(v)
	}
	exists, failover, _, err := pgslot.SlotFailover(ctx, q, r.cfg.Replication.Slot)
	if err != nil {
		return err
	}
	if exists && !failover {
		// A slot made before postgres.failover was set, or re-created by
		// a refill: make it one now, before anything holds it.
		if err := r.alterFailover(ctx); err != nil {
			r.log.Warn("failover slots are on, but the slot is not a failover slot and altering it failed: a promoted standby will not have it; with the relay stopped, alter it (ALTER_REPLICATION_SLOT ... (FAILOVER true)) and verify the standbys' settings",
				"slot", r.cfg.Replication.Slot, "err", err)
			return nil
		}
		r.log.Info("made the slot a failover slot: standbys with sync_replication_slots keep a copy",
			"slot", r.cfg.Replication.Slot)
	}
	return nil
}

// alterFailover makes the slot a failover slot (ALTER_REPLICATION_SLOT, a
// replication command of Postgres 17+; it fails while a walsender holds it).
func (r *Relay) alterFailover(ctx context.Context) error {
	conn, err := r.replicationConn(ctx, "outbox-relay failover")
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return pgslot.AlterFailover(ctx, conn, r.cfg.Replication.Slot)
}

// fenceSuperseded refuses srv when another host of a multi-host postgres.dsn
// is the same system on a later timeline (pgslot.Superseded): srv is an old
// primary that came back after its standby was promoted, and both accept
// writes. With target_session_attrs=read-write the DSN's first writable host
// wins, which may be the old one. Hosts that cannot be reached are skipped:
// a dead host cannot be the newer primary's only witness, the live ones are.
func (r *Relay) fenceSuperseded(ctx context.Context, srv pgslot.Server, cp pglogrepl.LSN) error {
	hosts, err := pgslot.Hosts(r.cfg.Replication.ReplicationConnDSN())
	if err != nil || len(hosts) < 2 {
		return nil
	}
	for _, h := range hosts {
		other, err := identifyHost(ctx, h)
		if err != nil {
			r.log.Debug("cannot identify a host of postgres.dsn (skipped in the split-brain check)", "host", h.Addr, "err", err)
			continue
		}
		if err := pgslot.Superseded(r.cfg.Replication.Slot, cp, srv, other, h.Addr+" (another host of postgres.dsn)"); err != nil {
			return err
		}
	}
	return nil
}

// identifyHost identifies the server of one host, whatever its role.
func identifyHost(ctx context.Context, h pgslot.Host) (pgslot.Server, error) {
	pcfg := h.Config()
	pcfg.RuntimeParams["replication"] = "database"
	pcfg.RuntimeParams["application_name"] = "outbox-relay identify"
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, pcfg)
	if err != nil {
		return pgslot.Server{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	srv, err := pgslot.Identify(cctx, conn)
	if err != nil {
		return pgslot.Server{}, err
	}
	if srv.SystemID == "" {
		return pgslot.Server{}, errors.New("no system identifier")
	}
	return srv, nil
}
