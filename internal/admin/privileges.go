package admin

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/sql"
)

// objects names what the relay's role works on, for sql.RelayPrivileges.
func (c *Config) objects() sql.Objects {
	o := sql.Objects{Outbox: c.OutboxTable, Checkpoint: c.CheckpointTable, Retry: c.RetryTable, Retention: c.Retention > 0}
	for _, t := range c.Tables {
		o.More = append(o.More, t.Name)
	}
	return o
}

// checkPrivileges fails once per object on which the connecting role lacks
// a privilege the relay needs (sql.TablePrivileges, and USAGE on the schemas
// holding those tables), naming the missing privileges and the GRANT that
// gives exactly them. Objects that do not exist are reported on their own
// lines. A superuser has every privilege: the role line warns about that.
func checkPrivileges(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, role string) {
	if role == "" {
		if err := conn.QueryRow(ctx, `SELECT current_user`).Scan(&role); err != nil {
			c.fail("privileges", "%v", cfg.scrub(err))
			return
		}
	}
	type object struct {
		p   sql.Privilege
		oid uint32
	}
	var (
		objects []object
		schemas []string
		seen    = map[string]bool{}
		failed  = c.failed
	)
	for _, p := range sql.TablePrivileges(cfg.objects()) {
		if p.Kind == sql.Sequence {
			// The real one, from the catalog: PostgreSQL may have chosen
			// another name than the usual.
			rOID, err := tableOID(ctx, conn, cfg.RetryTable)
			if err != nil {
				c.fail("privileges", "%v", cfg.scrub(err))
				continue
			}
			name, oid, err := serialSequence(ctx, conn, rOID, "seq")
			switch {
			case err != nil:
				c.fail("privileges", "%v", cfg.scrub(err))
			case oid != 0:
				p.Object = sql.Table{Schema: cfg.RetryTable.Schema, Name: name}
				objects = append(objects, object{p, oid})
			}
			continue
		}
		oid, schema, err := locateTable(ctx, conn, p.Object)
		if err != nil {
			c.fail("privileges", "%v", cfg.scrub(err))
			continue
		}
		if oid == 0 {
			continue
		}
		if !seen[schema] {
			seen[schema] = true
			schemas = append(schemas, schema)
		}
		objects = append(objects, object{p, oid})
	}

	var have []string
	for _, s := range schemas {
		p := sql.SchemaPrivilege(s)
		var ok bool
		if err := conn.QueryRow(ctx, `SELECT has_schema_privilege($1, 'USAGE')`, s).Scan(&ok); err != nil {
			c.fail("privileges", "USAGE on schema %s: %v", s, cfg.scrub(err))
			continue
		}
		if !ok {
			c.fail("privileges", "%s lacks USAGE on schema %s (%s); fix: %s", role, s, p.Why, p.Grant(role))
			continue
		}
		have = append(have, "schema "+s)
	}
	for _, o := range objects {
		fn := "has_table_privilege"
		if o.p.Kind == sql.Sequence {
			fn = "has_sequence_privilege"
		}
		var missing []string
		err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(p ORDER BY o), '{}') FROM unnest($2::text[]) WITH ORDINALITY AS u(p, o)
WHERE NOT `+fn+`($1::oid, p)`, o.oid, o.p.Privileges).Scan(&missing)
		if err != nil {
			c.fail("privileges", "%s %s: %v", o.p.What, o.p.Object, cfg.scrub(err))
			continue
		}
		if len(missing) > 0 {
			c.fail("privileges", "%s lacks %s on the %s %s (%s); fix: %s",
				role, strings.Join(missing, ", "), o.p.What, o.p.Object, o.p.Why, o.p.Grant(role, missing...))
			continue
		}
		have = append(have, o.p.Object.String())
	}
	if c.failed == failed {
		c.ok("privileges", "%s has what the relay needs on %s", role, strings.Join(have, ", "))
	}
}

// checkTLS says whether the connection is encrypted, and whether the server
// was verified. For information: many setups run on a trusted network.
func checkTLS(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	var ssl bool
	var version, cipher *string
	var bits *int32
	err := conn.QueryRow(ctx, `SELECT ssl, version, cipher, bits FROM pg_catalog.pg_stat_ssl WHERE pid = pg_backend_pid()`).
		Scan(&ssl, &version, &cipher, &bits)
	switch {
	case err != nil:
		c.info("TLS", "unknown: %v", cfg.scrub(err))
	case !ssl:
		c.info("TLS", "no - the connection is not encrypted; set sslmode=verify-full (and sslrootcert=<the server's CA file>) in postgres.dsn, with ssl = on in the server's postgresql.conf")
	default:
		desc := fmt.Sprintf("yes (%s, cipher %s, %d bits)", deref(version), deref(cipher), deref(bits))
		if !verifiesServer(cfg.DSN) {
			desc += "; the server's certificate is not verified: set sslmode=verify-full (and sslrootcert) in postgres.dsn"
		}
		c.info("TLS", "%s", desc)
	}
}

// verifiesServer reports whether the DSN's sslmode checks the server's
// certificate and name (verify-full): pgx leaves InsecureSkipVerify set
// for require and prefer, and for verify-ca adds its own check of the chain
// only.
func verifiesServer(dsn string) bool {
	pc, err := pgconn.ParseConfig(dsn)
	if err != nil || pc.TLSConfig == nil {
		return false
	}
	return !pc.TLSConfig.InsecureSkipVerify
}
