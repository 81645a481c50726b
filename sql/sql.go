// Package sql holds the DDL outbox-relay needs: the outbox table, the
// checkpoint table and its history, the retry and replay tables, the
// publication, the replication slot, and the grants of the relay's role.
//
// The DDL is written once, in the functions here, which build the statements
// for configured names. The embedded .sql files are generated from them with
// the default names (go generate ./sql; a test fails when they differ), as
// documented defaults readable and runnable by psql (for example as
// docker-entrypoint-initdb.d scripts); another test runs both and compares
// the resulting catalogs.
//
// Invariants:
//   - Every statement is idempotent (IF NOT EXISTS, or guarded by a catalog
//     lookup), so setup can be run again at any time.
//   - Every name that reaches SQL text is quoted as an identifier or a string
//     literal: configured names are taken as the exact, case-sensitive names.
//   - The publication publishes inserts only.
package sql

import (
	"embed"
	"errors"
	"fmt"
	"strings"
)

// Files holds the default DDL, in the order to run it: 001_outbox.sql,
// 002_relay.sql, 003_slot.sql, 004_retry.sql, 005_replay.sql and
// 006_grants.sql (the relay's role, outbox_relay, and its least privileges).
//
//go:generate go test -run ^TestFilesGenerated$ -update .
//go:embed *.sql
var Files embed.FS

// Default names, as used by the files in Files.
const (
	DefaultOutboxTable     = "public.outbox"
	DefaultCheckpointTable = "outbox_relay_checkpoint"
	DefaultPublication     = "outbox_relay"
	DefaultSlot            = "outbox_relay"
)

// A Table is a possibly schema-qualified table name. Parts are exact names,
// not SQL: "public.Outbox" means the table named Outbox (with a capital O) in
// schema public. An empty Schema means the first match on the search_path.
type Table struct {
	Schema string
	Name   string
}

// ParseTable parses "table" or "schema.table".
func ParseTable(s string) (Table, error) {
	parts := strings.Split(s, ".")
	for _, p := range parts {
		if p == "" || strings.ContainsRune(p, 0) {
			return Table{}, fmt.Errorf("table name %q: want table or schema.table", s)
		}
	}
	switch len(parts) {
	case 1:
		return Table{Name: parts[0]}, nil
	case 2:
		return Table{Schema: parts[0], Name: parts[1]}, nil
	}
	return Table{}, fmt.Errorf("table name %q: want table or schema.table", s)
}

// String returns the name as configured: schema.table or table.
func (t Table) String() string {
	if t.Schema == "" {
		return t.Name
	}
	return t.Schema + "." + t.Name
}

// Quoted returns the name quoted for use in SQL text.
func (t Table) Quoted() string {
	if t.Schema == "" {
		return Ident(t.Name)
	}
	return Ident(t.Schema) + "." + Ident(t.Name)
}

// Literal returns the quoted name as a string literal, for regclass casts such
// as to_regclass(<Literal>).
func (t Table) Literal() string { return Literal(t.Quoted()) }

// Ident quotes s as an SQL identifier.
func Ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// Literal quotes s as an SQL string literal. Standard-conforming strings (the
// default since PostgreSQL 9.1) make doubling the quotes sufficient.
func Literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// indexName mirrors how PostgreSQL names indexes: it would truncate an
// over-long name silently (with a NOTICE); truncating here keeps the name the
// same across runs, so IF NOT EXISTS keeps working.
func indexName(table, suffix string) string {
	const maxIdent = 63 // NAMEDATALEN - 1
	name := table + "_" + suffix
	if len(name) > maxIdent {
		name = table[:maxIdent-len(suffix)-1] + "_" + suffix
	}
	return name
}

// CheckpointTable returns the statement creating the checkpoint table if missing.
//
// stopped_before and stop_reason record why the relay last stopped before a
// transaction it must not confirm past (an insert it cannot place, the
// outbox table changed): lag and status show it while the relay is down,
// and the relay clears it once its checkpoint passes that transaction.
// last_refill describes the last refill of a lost slot from the outbox
// table (outbox-relay recover, postgres.on_slot_loss: refill), for status.
// pruned records, per outbox table (its name as configured, a JSON object
// key), the xid below which the slot's retention may have deleted rows
// (text, an xid8): a refill or replay of another slot that needed older rows
// says they may be gone. refill_progress is how far a refill got (the
// last event acknowledged, in its order): one that is killed is followed by
// one that skips what it sent.
// reading is the transaction the relay has been reading for a while and not
// yet confirmed (commit LSN, events and bytes so far), for lag: the slot's
// byte lag does not count a transaction the server decoded before sending
// it; the relay clears it once its checkpoint passes that transaction.
func CheckpointTable(t Table) string {
	return fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (
    "slot_name" text PRIMARY KEY,
    "lsn" pg_lsn NOT NULL,
    "last_commit_time" timestamptz,
    "saved_at" timestamptz NOT NULL DEFAULT now(),
    "epoch" bigint NOT NULL DEFAULT 0,
    "leader" text,
    "leader_since" timestamptz,
    "system_identifier" text,
    "timeline_id" integer,
    "stopped_before" pg_lsn,
    "stop_reason" text,
    "last_refill" text,
    "pruned" jsonb,
    "refill_progress" jsonb,
    "reading" jsonb
)`, t.Quoted())
}

// CheckpointUpgradeColumns are the columns CheckpointUpgrade adds.
var CheckpointUpgradeColumns = []string{"epoch", "leader", "leader_since", "system_identifier", "timeline_id", "stopped_before", "stop_reason", "last_refill", "pruned", "refill_progress", "reading"}

// CheckpointUpgrade returns the statement that adds the columns added since
// the first version to an older checkpoint table: the leadership columns
// (epoch, leader, leader_since), the server identity (system_identifier,
// timeline_id: the server the slot's checkpoint came from) and the stop
// record (stopped_before, stop_reason), the last refill (last_refill), what
// retention may have deleted (pruned), a refill's progress
// (refill_progress), the transaction being read (reading); a no-op on a
// current table.
func CheckpointUpgrade(t Table) string {
	return fmt.Sprintf(`ALTER TABLE %s ADD COLUMN IF NOT EXISTS "epoch" bigint NOT NULL DEFAULT 0, `+
		`ADD COLUMN IF NOT EXISTS "leader" text, ADD COLUMN IF NOT EXISTS "leader_since" timestamptz, `+
		`ADD COLUMN IF NOT EXISTS "system_identifier" text, ADD COLUMN IF NOT EXISTS "timeline_id" integer, `+
		`ADD COLUMN IF NOT EXISTS "stopped_before" pg_lsn, ADD COLUMN IF NOT EXISTS "stop_reason" text, `+
		`ADD COLUMN IF NOT EXISTS "last_refill" text, ADD COLUMN IF NOT EXISTS "pruned" jsonb, `+
		`ADD COLUMN IF NOT EXISTS "refill_progress" jsonb, ADD COLUMN IF NOT EXISTS "reading" jsonb`, t.Quoted())
}

// CreatePublication returns the statement creating the publication of the
// outbox table. It is not idempotent (PostgreSQL has no CREATE PUBLICATION IF
// NOT EXISTS): callers check pg_publication first, as setup does, because an
// existing publication may need the operator's attention rather than a retry.
//
// Only inserts are published: events are inserts, and UPDATE or DELETE on the
// outbox (applications that purge relayed rows) are then filtered out by the
// walsender, costing no decoding bandwidth and no network traffic.
//
// publish_via_partition_root (PostgreSQL 13 and later): an insert into a
// partition of a partitioned outbox is published under the outbox's name,
// not the partition's, so a partition attached, detached or dropped later
// never makes an insert look like another table's. On a table that is not
// partitioned it changes nothing.
//
// More tables (several outbox tables on one slot) are published alike.
func CreatePublication(name string, outbox Table, more ...Table) string {
	list := outbox.Quoted()
	for _, t := range more {
		list += ", " + t.Quoted()
	}
	return fmt.Sprintf(`CREATE PUBLICATION %s FOR TABLE %s WITH (publish = 'insert', publish_via_partition_root = true)`,
		Ident(name), list)
}

// CreateMessagesPublication returns the statement creating a publication of
// no table, for a relay that reads logical decoding messages only: pgoutput
// needs a publication by name, and messages are sent whatever it covers.
func CreateMessagesPublication(name string) string {
	return fmt.Sprintf(`CREATE PUBLICATION %s WITH (publish = 'insert')`, Ident(name))
}

// PublishViaRoot returns the statement that makes an existing publication
// publish partitions' inserts under their root's name (see CreatePublication).
// Idempotent.
func PublishViaRoot(name string) string {
	return fmt.Sprintf(`ALTER PUBLICATION %s SET (publish_via_partition_root = true)`, Ident(name))
}

// CreateSlot returns the statement creating the logical replication slot with
// pgoutput. It must run outside a transaction that has written anything, and
// it waits for transactions running at that moment to finish.
func CreateSlot(name string) string {
	return fmt.Sprintf(`SELECT pg_catalog.pg_create_logical_replication_slot(%s, 'pgoutput')`, Literal(name))
}

// CreateFailoverSlot creates the relay's slot as a failover slot (Postgres
// 17+): standbys with sync_replication_slots keep a copy that a promoted
// standby continues from. The arguments after the plugin are temporary,
// two_phase and failover.
func CreateFailoverSlot(name string) string {
	return fmt.Sprintf(`SELECT pg_catalog.pg_create_logical_replication_slot(%s, 'pgoutput', false, false, true)`, Literal(name))
}

// CreateTemporarySlot returns the statement creating a temporary logical
// replication slot with pgoutput: it belongs to the session and is dropped
// when the session ends. The argument after the plugin is temporary.
func CreateTemporarySlot(name string) string {
	return fmt.Sprintf(`SELECT pg_catalog.pg_create_logical_replication_slot(%s, 'pgoutput', true)`, Literal(name))
}

// ValidSlotName reports whether s can name a replication slot: lower-case
// letters, digits and underscores, at most 63 bytes.
func ValidSlotName(s string) error {
	if s == "" {
		return errors.New("empty slot name")
	}
	if len(s) > 63 {
		return fmt.Errorf("slot name %q is longer than 63 bytes", s)
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
			return fmt.Errorf("slot name %q may contain only lower-case letters, digits and underscores", s)
		}
	}
	return nil
}
