package sql

import (
	"fmt"
	"strings"
)

// The relay's role needs LOGIN and REPLICATION, never superuser, plus the
// table privileges listed here. They are written once, in RelayPrivileges:
// 006_grants.sql, `outbox-relay setup --print-sql` and `outbox-relay check`
// all take them from it, so the script, the printed statements and the
// check cannot drift apart.

// DefaultRole is the role 006_grants.sql creates (if missing) and grants to.
const DefaultRole = "outbox_relay"

// Objects names what the relay's role works on, as configured.
type Objects struct {
	Outbox Table
	// More are the other outbox tables (outbox.tables): the same
	// privileges as Outbox.
	More       []Table
	Checkpoint Table // its history and the replay table are beside it
	Retry      Table
	// Retention is true when outbox.retention is on: the relay (and prune)
	// then delete delivered rows from the outbox table.
	Retention bool
}

// DefaultObjects returns the objects with the default names, retention off.
func DefaultObjects() Objects {
	o, _ := ParseTable(DefaultOutboxTable)
	c, _ := ParseTable(DefaultCheckpointTable)
	r, _ := ParseTable(DefaultRetryTable)
	return Objects{Outbox: o, Checkpoint: c, Retry: r}
}

// An ObjectKind is the kind of object a privilege is on, as GRANT spells it.
type ObjectKind string

// The kinds of object the relay's role needs privileges on.
const (
	Schema   ObjectKind = "SCHEMA"
	Relation ObjectKind = "TABLE"
	Sequence ObjectKind = "SEQUENCE"
)

// A Privilege is what the relay's role needs on one object.
type Privilege struct {
	Kind ObjectKind
	// Object is the table or sequence; for a schema, Name is the schema's
	// name and Schema is empty.
	Object Table
	// What names the object for people: "checkpoint table".
	What string
	// Privileges in the order GRANT lists them: SELECT, INSERT, UPDATE,
	// DELETE; USAGE for schemas and sequences.
	Privileges []string
	// Why says which commands need it.
	Why string
}

// Target returns the object as GRANT names it: TABLE "public"."outbox".
func (p Privilege) Target() string {
	if p.Kind == Schema {
		return string(p.Kind) + " " + Ident(p.Object.Name)
	}
	return string(p.Kind) + " " + p.Object.Quoted()
}

// Grant returns the statement granting role privs on p's object (all of p's
// privileges when none are given).
func (p Privilege) Grant(role string, privs ...string) string {
	if len(privs) == 0 {
		privs = p.Privileges
	}
	return fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(privs, ", "), p.Target(), Ident(role))
}

// Revoke returns the statement revoking privs (all of p's when none are
// given) from role: for tests, and for a DBA undoing a grant.
func (p Privilege) Revoke(role string, privs ...string) string {
	if len(privs) == 0 {
		privs = p.Privileges
	}
	return fmt.Sprintf("REVOKE %s ON %s FROM %s", strings.Join(privs, ", "), p.Target(), Ident(role))
}

// RelayPrivileges returns every privilege the relay's role needs on the
// objects, for `run` and the operator commands (lag, status, retries,
// checkpoint, prune, replay): USAGE on each schema first, then the tables
// and the retry table's sequence. The schema of an unqualified name is
// taken to be public (the default search_path); `outbox-relay check` looks
// up the real one.
func RelayPrivileges(o Objects) []Privilege {
	var ps []Privilege
	seen := map[string]bool{}
	for _, t := range append([]Table{o.Outbox, o.Checkpoint, o.Retry}, o.More...) {
		s := t.Schema
		if s == "" {
			s = "public"
		}
		if !seen[s] {
			seen[s] = true
			ps = append(ps, SchemaPrivilege(s))
		}
	}
	return append(ps, TablePrivileges(o)...)
}

// SchemaPrivilege is USAGE on a schema holding one of the relay's tables:
// without it the role cannot name them.
func SchemaPrivilege(schema string) Privilege {
	return Privilege{Kind: Schema, Object: Table{Name: schema}, What: "schema", Privileges: []string{"USAGE"},
		Why: "every command: the relay's tables are in it"}
}

// TablePrivileges returns the privileges on tables and the sequence,
// without the schemas' USAGE (RelayPrivileges adds it). The sequence is
// named as PostgreSQL names a bigserial's; RetrySequence is that name.
func TablePrivileges(o Objects) []Privilege {
	outbox := Privilege{Kind: Relation, Object: o.Outbox, What: "outbox table", Privileges: []string{"SELECT"},
		Why: "lag reads the oldest undelivered row, replay the rows it re-delivers"}
	if o.Retention {
		outbox.Privileges = append(outbox.Privileges, "DELETE")
		outbox.Why += "; outbox.retention (run, prune) deletes delivered rows"
	}
	ps := []Privilege{outbox}
	for _, t := range o.More {
		more := outbox
		more.Object = t
		ps = append(ps, more)
	}
	return append(ps, []Privilege{
		{Kind: Relation, Object: o.Checkpoint, What: "checkpoint table", Privileges: []string{"SELECT", "INSERT", "UPDATE"},
			Why: "run saves the checkpoint (INSERT ... ON CONFLICT DO UPDATE), checkpoint set moves it; lag, status and checkpoint show read it"},
		{Kind: Relation, Object: CheckpointHistoryName(o.Checkpoint), What: "checkpoint history table", Privileges: []string{"SELECT", "INSERT", "DELETE"},
			Why: "run records checkpoints and deletes those older than checkpoint.history_keep; replay, retention and checkpoint show read it"},
		{Kind: Relation, Object: o.Retry, What: "retry table", Privileges: []string{"SELECT", "INSERT", "UPDATE", "DELETE"},
			Why: "run stores failed events, its retry worker updates and deletes them; retries list/show/requeue/drop"},
		{Kind: Sequence, Object: RetrySequence(o.Retry), What: "retry table's sequence", Privileges: []string{"USAGE"},
			Why: "inserting into the retry table draws its seq (bigserial)"},
		{Kind: Relation, Object: WALBufferTable(o.Retry), What: "WAL buffer table", Privileges: []string{"SELECT", "INSERT", "DELETE"},
			Why: "run stores what it reads there while it cannot deliver (postgres.max_retained_wal), delivers it and deletes it; lag and status read it"},
		{Kind: Relation, Object: ReplayTableName(o.Checkpoint), What: "replay table", Privileges: []string{"SELECT", "INSERT", "UPDATE"},
			Why: "replay saves each run's progress, to resume it by --id"},
	}...)
}

// RetrySequence returns the name PostgreSQL gives the sequence of the retry
// table's seq column (bigserial): <table>_seq_seq, the table's name cut so
// that the whole fits in 63 bytes. (PostgreSQL would add a number if that
// name were taken; `outbox-relay check` reads the real one from the catalog.)
func RetrySequence(retry Table) Table {
	return Table{Schema: retry.Schema, Name: indexName(retry.Name, "seq_seq")}
}

// EnsureRole returns a statement giving role what it needs as a role: it is
// created with LOGIN REPLICATION if missing (without a password: set one),
// and given REPLICATION if it has neither that nor superuser. It alters
// nothing else. Creating a role and giving REPLICATION need a superuser on
// PostgreSQL 15 (on a managed service: its own replication role, such as
// rds_replication).
func EnsureRole(role string) string {
	body := fmt.Sprintf(`
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s) THEN
        CREATE ROLE %s LOGIN REPLICATION;
    ELSIF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s AND (rolreplication OR rolsuper)) THEN
        ALTER ROLE %s REPLICATION;
    END IF;
END
`, Literal(role), Ident(role), Literal(role), Ident(role))
	return Do(body)
}

// GrantConnect returns the statement granting CONNECT on the database to
// role; with database "" it grants on the database it runs in.
func GrantConnect(database, role string) string {
	if database != "" {
		return fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s", Ident(database), Ident(role))
	}
	return Do(fmt.Sprintf(`
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %%I TO %%I', current_database(), %s);
END
`, Literal(role)))
}

// GrantLogSnapshots grants role EXECUTE on pg_log_standby_snapshot() where
// the server has it (Postgres 16+; a no-op before): with it, a relay near
// postgres.max_retained_wal logs running-xacts records itself, so that its
// slot's restart_lsn follows what it confirms within seconds rather than
// the server's 15 s or more, without the temporary slot it uses otherwise
// (internal/walbuffer's snapshots.go).
func GrantLogSnapshots(role string) string {
	return Do(fmt.Sprintf(`
BEGIN
    IF to_regprocedure('pg_log_standby_snapshot()') IS NOT NULL THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %%I', %s);
    END IF;
END
`, Literal(role)))
}

// Do wraps a PL/pgSQL body in a DO statement, dollar-quoted with a tag the
// body does not contain (names from the configuration may hold "$$").
func Do(body string) string {
	tag := "$$"
	for i := 0; strings.Contains(body, tag); i++ {
		tag = fmt.Sprintf("$q%d$", i)
	}
	return "DO " + tag + body + tag
}

// CreatePublicationIfMissing returns CreatePublication guarded by a lookup
// of pg_publication, for scripts (Go code looks it up first, as setup does).
func CreatePublicationIfMissing(name string, outbox Table, more ...Table) string {
	return ifNoPublication(name, CreatePublication(name, outbox, more...))
}

// CreateMessagesPublicationIfMissing returns CreateMessagesPublication
// guarded by a lookup of pg_publication, for scripts.
func CreateMessagesPublicationIfMissing(name string) string {
	return ifNoPublication(name, CreateMessagesPublication(name))
}

func ifNoPublication(name, create string) string {
	return Do(fmt.Sprintf(`
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = %s) THEN
        %s;
    END IF;
END
`, Literal(name), create))
}

// CreateSlotIfMissing returns CreateSlot, or with failover
// CreateFailoverSlot, guarded by a lookup of pg_replication_slots, for
// scripts.
func CreateSlotIfMissing(name string, failover bool) string {
	create := CreateSlot(name)
	if failover {
		create = CreateFailoverSlot(name)
	}
	return create + "\nWHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = " + Literal(name) + ")"
}
