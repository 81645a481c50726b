package pgslot

import (
	"context"
	"errors"
	"fmt"
	"github.com/outbox-relay/outbox-relay/sql"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// FailoverMinVersion is the first server_version_num with failover slots:
// Postgres 17 (the FAILOVER option, synchronized_standby_slots,
// sync_replication_slots).
const FailoverMinVersion = 170000

// ErrFailoverUnsupported is wrapped by the error of a failover slot asked
// for on a server older than Postgres 17.
var ErrFailoverUnsupported = errors.New("failover slots need Postgres 17 or later")

// FailoverUnsupported is the error for a failover slot asked for on a server of
// server_version_num version (below FailoverMinVersion): what is wrong and
// what to do instead.
func FailoverUnsupported(version int) error {
	return fmt.Errorf("%w: a failover slot is asked for, but this server is Postgres %d.%d, which cannot sync a slot to a standby: "+
		"after a promotion the new primary has no slot for the relay. Do without a failover slot and refill a lost slot instead "+
		"(the relay then re-delivers from the outbox table what the lost slot had not sent), or upgrade to Postgres 17 or later",
		ErrFailoverUnsupported, version/10000, version%10000)
}

// ServerVersion returns the server's server_version_num.
func ServerVersion(ctx context.Context, q Querier) (int, error) {
	var v int
	if err := q.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read server_version_num: %w", err)
	}
	return v, nil
}

// SlotFailover reads the failover and synced flags of slot name (Postgres
// 17+). exists is false when there is no such slot. synced is true only for
// a synced slot that is persistent: a standby keeps a new synced slot
// temporary (and drops it at promotion) until the primary's slot has passed
// the standby's own WAL position and catalog xmin.
func SlotFailover(ctx context.Context, q Querier, name string) (exists, failover, synced bool, err error) {
	err = q.QueryRow(ctx, `SELECT count(*) > 0, coalesce(bool_or(failover), false), coalesce(bool_or(synced AND NOT temporary), false)
FROM pg_catalog.pg_replication_slots WHERE slot_name = $1`, name).Scan(&exists, &failover, &synced)
	if err != nil {
		return false, false, false, fmt.Errorf("read the failover flag of slot %q: %w", name, err)
	}
	return exists, failover, synced, nil
}

// A Host is one host of a (multi-host) DSN, with the settings to reach it alone.
type Host struct {
	Addr   string // host:port, or the socket directory
	config *pgconn.Config
}

// Hosts returns each host of dsn once, in order, each with a config that
// connects to it alone, whatever its role (target_session_attrs any): the
// hosts of a multi-host DSN are its primary and its standbys.
func Hosts(dsn string) ([]Host, error) {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, errors.New("the connection string cannot be parsed: check its syntax")
	}
	all := append([]*pgconn.FallbackConfig{{Host: pc.Host, Port: pc.Port, TLSConfig: pc.TLSConfig}}, pc.Fallbacks...)
	var hosts []Host
	index := map[string]int{}
	for _, fb := range all {
		addr := fb.Host
		if !strings.HasPrefix(addr, "/") {
			addr = fmt.Sprintf("%s:%d", fb.Host, fb.Port)
		}
		if i, ok := index[addr]; ok {
			// sslmode=prefer and allow give a host two entries: with TLS and without.
			c := hosts[i].config
			c.Fallbacks = append(c.Fallbacks, fb)
			continue
		}
		c := pc.Copy()
		c.Host, c.Port, c.TLSConfig, c.Fallbacks = fb.Host, fb.Port, fb.TLSConfig, nil
		c.ValidateConnect = nil
		index[addr] = len(hosts)
		hosts = append(hosts, Host{Addr: addr, config: c})
	}
	return hosts, nil
}

// Config returns a copy of the host's connection settings.
func (h Host) Config() *pgconn.Config { return h.config.Copy() }

// AlterFailover makes slot a failover slot with ALTER_REPLICATION_SLOT, a
// replication command of Postgres 17+ (conn must be a replication
// connection); it fails while a walsender holds the slot.
func AlterFailover(ctx context.Context, conn *pgconn.PgConn, slot string) error {
	_, err := conn.Exec(ctx, "ALTER_REPLICATION_SLOT "+sql.Ident(slot)+" (FAILOVER true)").ReadAll()
	return err
}
