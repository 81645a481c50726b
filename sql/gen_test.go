package sql_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/sql"
)

var update = flag.Bool("update", false, "rewrite the .sql files from the Go builders")

// A block is some statements under a comment, written one after the other.
type block struct {
	comment string // without "-- "; "" for none
	stmts   []string
}

// render writes a file: its header comment, then the blocks, each ended by
// a semicolon and separated by a blank line.
func render(header string, blocks ...block) string {
	var b strings.Builder
	b.WriteString(comment(header))
	for _, bl := range blocks {
		b.WriteString("\n")
		if bl.comment != "" {
			b.WriteString(comment(bl.comment))
		}
		for _, s := range bl.stmts {
			b.WriteString(s + ";\n")
		}
	}
	return b.String()
}

func comment(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		b.WriteString(strings.TrimRight("-- "+line, " ") + "\n")
	}
	return b.String()
}

// files renders the .sql files from the builders with the default names: the
// DDL is written once, in Go, and the files (readable, runnable by psql,
// used as docker-entrypoint-initdb.d scripts) are its output. Only what psql
// needs and Go does by catalog lookups is added here: the guard around
// CREATE PUBLICATION and CREATE_REPLICATION_SLOT.
func files(t *testing.T) map[string]string {
	outbox := must(sql.ParseTable(sql.DefaultOutboxTable))
	checkpoint := must(sql.ParseTable(sql.DefaultCheckpointTable))
	retry := must(sql.ParseTable(sql.DefaultRetryTable))
	outboxStmts := sql.OutboxTable(outbox, sql.Columns{}, sql.LayoutRelay)
	retryStmts := sql.RetryTable(retry)
	historyStmts := sql.CheckpointHistoryTable(checkpoint)
	if len(outboxStmts) != 2 || len(retryStmts) != 13 || len(historyStmts) != 2 {
		t.Fatalf("OutboxTable, RetryTable or CheckpointHistoryTable changed its statements: update the comments of files()")
	}
	return map[string]string{
		"001_outbox.sql": render(header001,
			block{"", outboxStmts[:1]},
			block{"`outbox-relay lag` finds the oldest row with it, and applications that purge\nrelayed rows (DELETE ... WHERE created_at < ...) use it too.", outboxStmts[1:]}),
		"002_relay.sql": render(header002,
			block{comment002Checkpoint, []string{sql.CheckpointTable(checkpoint)}},
			block{comment002History, historyStmts},
			block{comment002Publication, []string{"DO $$\nBEGIN\n    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = " +
				sql.Literal(sql.DefaultPublication) + ") THEN\n        " +
				sql.CreatePublication(sql.DefaultPublication, outbox) + ";\n    END IF;\nEND\n$$"}}),
		"003_slot.sql": render(header003,
			block{"", []string{sql.CreateSlot(sql.DefaultSlot) +
				"\nWHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_replication_slots WHERE slot_name = " + sql.Literal(sql.DefaultSlot) + ")"}}),
		"004_retry.sql": render(header004,
			block{"", retryStmts[:1]},
			block{"Tables made before last-resort records, message timestamps, several outbox tables,\nrows owned by a slot and reason codes existed.", retryStmts[1:6]},
			block{comment004Unique, retryStmts[6:7]},
			block{"Indexes of earlier versions: without the slot, or on the aggregate's text.", retryStmts[7:10]},
			block{"An event is stored once per slot: inserting it again after a crash changes nothing.", retryStmts[10:11]},
			block{"The retry worker polls for its slot's due rows with it.", retryStmts[11:12]},
			block{comment004Aggregate, retryStmts[12:]},
			block{"The WAL buffer: what a relay that cannot deliver has read, in WAL order, so that\nits slot need not keep the WAL (postgres.max_retained_wal; docs/wal-buffer.md).",
				sql.WALBufferTableDDL(sql.WALBufferTable(retry))}),
		"005_replay.sql": render(header005, block{"", sql.ReplayTable(checkpoint)[:1]},
			block{"Tables made before runs belonged to a slot.", sql.ReplayTable(checkpoint)[1:]}),
		"006_grants.sql": render(header006, grantBlocks(sql.DefaultObjects(), sql.DefaultRole)...),
	}
}

// grantBlocks is 006_grants.sql after its header: the role, CONNECT, then a
// block per privilege saying which commands need it, and the DELETE that
// retention adds, commented out.
func grantBlocks(o sql.Objects, role string) []block {
	blocks := []block{
		{comment006Role, []string{sql.EnsureRole(role)}},
		{"Every command connects to this database.", []string{sql.GrantConnect("", role)}},
	}
	for _, p := range sql.RelayPrivileges(o) {
		blocks = append(blocks, block{wrap(p.What+": "+p.Why, 78), []string{p.Grant(role)}})
	}
	ret := o
	ret.Retention = true
	for _, p := range sql.TablePrivileges(ret) {
		if p.What == "outbox table" {
			blocks = append(blocks, block{"With outbox.retention on, the relay (and `outbox-relay prune`) deletes\ndelivered rows: uncomment.\n" +
				p.Grant(role, "DELETE") + ";", nil})
		}
	}
	return blocks
}

// wrap breaks text into lines of at most width bytes, at spaces.
func wrap(text string, width int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len(line)+1+len(w) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	return strings.Join(append(lines, line), "\n")
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestFilesGenerated fails when a committed .sql file differs from what the
// builders make; go generate (go test -run TestFilesGenerated -update)
// rewrites them.
func TestFilesGenerated(t *testing.T) {
	for name, want := range files(t) {
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) == want {
			continue
		}
		if *update {
			if err := os.WriteFile(name, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		t.Errorf("%s differs from the Go builders' DDL: run go generate ./sql and commit it; want:\n%s", name, want)
	}
}

const header001 = `The outbox table, with the default name (public.outbox) and column names.

Applications insert one row per event inside their business transaction;
outbox-relay reads the inserts from the WAL and produces them to Kafka.
The layout matches the Debezium outbox event router, so consumers can move
between the two unchanged:
  aggregate_type  routes the event to a topic (outbox.event.<aggregate_type>)
  aggregate_id    is the Kafka key, which keeps per-aggregate order
  id              is sent as the Kafka header "id": the consumers' dedup key
  payload         is the message value, the bytes as stored
  headers         (a JSON object) adds Kafka headers

Idempotent: safe to run again. ` + "`outbox-relay setup --create-outbox-table`" + `
runs the same statements with the configured names.

Generated from package sql's builders (go generate ./sql): edit those.`

const header002 = `What outbox-relay itself needs, with the default names: its checkpoint table,
the checkpoint history and the publication of the outbox table. Run after
001_outbox.sql (the publication names the table). Idempotent: safe to run
again.
` + "`outbox-relay setup`" + ` does the same with the configured names and also creates
the replication slot (003_slot.sql).

Generated from package sql's builders (go generate ./sql): edit those.`

const comment002Checkpoint = `The relay's own record of the last transaction delivered to Kafka, one row
per slot. It never moves backwards, unlike a slot's confirmed_flush_lsn,
which the server persists only at checkpoints and may lose in a crash.
system_identifier and timeline_id name the server the slot was read from: a
relay that finds its slot on another system, or on a timeline that forked
before the checkpoint, refuses to stream from it.`

const comment002History = `A compact history of the checkpoints saved, one row at most every
checkpoint.history_interval (1m) per slot, kept checkpoint.history_keep (30d).
It maps a checkpoint's LSN to its commit time (replay), and says which outbox
rows are delivered (retention): snapshot_xmin is the oldest transaction still
running when the row was written and snapshot_lsn the WAL position read just
after, so every transaction older than snapshot_xmin committed (if at all)
before snapshot_lsn. Once the checkpoint reaches snapshot_lsn, every row those
transactions inserted was delivered.`

const comment002Publication = `Only INSERTs are published: an event is an insert, and applications that
delete relayed rows (or update them) then cost no decoding bandwidth and no
network traffic, because the walsender filters those changes out before
they are sent. CREATE PUBLICATION has no IF NOT EXISTS, hence the DO block.`

const header003 = `The logical replication slot, with the default name. Optional here:
` + "`outbox-relay setup`" + ` creates it too. From the moment it exists the server
keeps WAL for it until outbox-relay confirms it, so create it only where the
relay will run (an unused slot fills the disk). Idempotent.

Must not run inside a transaction that has written anything (psql's default
autocommit is fine; docker-entrypoint-initdb.d runs files that way).

Generated from package sql's builders (go generate ./sql): edit those.`

const header004 = `The retry table, with its default name (outbox_relay_retry): events that
could not be delivered to Kafka, and the events of the same aggregate that
wait behind them so that per-aggregate order survives the failure.

  seq              global order of failure, and the short id that
                   ` + "`outbox-relay retries`" + ` takes
  event_key        the event's position in the WAL, lsn:<commit_lsn>:<n>
                   (older versions stored the event id); unique per slot,
                   so inserting again after a crash changes nothing. Short
                   by construction: with slot_name, the only text under a
                   btree index
  aggregate        the blocking identity (topic/key, or
                   unroutable:<aggregate_type>/<aggregate_id>): no row of an
                   aggregate is delivered while a lower seq of it is here.
                   Unbounded, so indexed by its md5 only
  headers          the event's extra headers (from the outbox headers
                   column), as [{"key":…,"value":…}]; a key or value that
                   is not valid UTF-8 or holds a NUL byte (which jsonb
                   cannot store) is in "key_b64"/"value_b64" instead. The
                   relay's own headers (id, event_type, aggregate_type) are
                   built from their columns at delivery
  status           pending (retried with backoff) or dead (kept for the
                   operator: requeue or drop it); a dead row still blocks
                   its aggregate
  waiting          true when the row is here only because an earlier event
                   of its aggregate is, not because it failed itself
  last_resort      NULL, except for an event the other columns refused
                   (a data error): then the whole event as a JSON document
                   (bytes in base64), the row is dead and the relay never
                   delivers it; see ` + "`outbox-relay retries show`" + `
  slot_name        the replication slot of the relay that stored the row:
                   only that relay (and its standbys, on the same slot)
                   reads, delivers, requeues, lists or deletes it, so
                   relays of several slots may share this table. NULL for
                   a row of an earlier version, which the relay adopts at
                   start-up when it can tell the row is its own (else it
                   refuses to start and says which UPDATE assigns them)

Idempotent: safe to run again, and upgrades a table made by an earlier
version. ` + "`outbox-relay setup`" + ` runs the same statements with the configured
name (retry.table). Run after 002_relay.sql.

Generated from package sql's builders (go generate ./sql): edit those.`

const comment004Unique = `Earlier versions made event_key unique across the table. It is unique per
slot now: two slots reading one outbox table park the same event under the
same key, each its own row.`

const comment004Aggregate = `Finding the head of an aggregate, and the rows waiting behind it. On the
md5 of the aggregate: a btree entry of the text itself fails above ~2.7 kB
(and an insert failing there would stall the relay). Queries compare both
md5(aggregate) and aggregate, so a collision costs a little speed only.
Earlier versions indexed the text itself.`

const header005 = `The replay table, with its default name (beside the checkpoint table):
` + "`outbox-relay replay`" + ` keeps each run's selection and progress here, so that a
run resumes by its --id. ` + "`outbox-relay setup`" + ` creates it too. Replay would create it
itself, but only as a role that may create tables in the schema. Idempotent.

Generated from package sql's builders (go generate ./sql): edit those.`

const header006 = `The privileges of the relay's role, with the default names and the role
outbox_relay: LOGIN and REPLICATION, never superuser, plus the grants below,
which cover ` + "`outbox-relay run`" + ` (with its retry worker and checkpoint history) and
the operator commands (lag, status, retries, checkpoint, prune, replay).
Run after 001 to 005, as a superuser (creating a role with REPLICATION needs
one). Idempotent. For other names, or another role, print the statements
with ` + "`outbox-relay setup --print-sql [--role NAME]`" + `; ` + "`outbox-relay check`" + ` names
any grant that is missing, with the statement that fixes it.

Generated from package sql's builders (go generate ./sql): edit those.`

const comment006Role = `The role, created if missing, without a password (set one: \password
outbox_relay in psql), and given REPLICATION if it has neither that nor
superuser. On a managed service grant its replication role instead (AWS RDS:
GRANT rds_replication TO outbox_relay).`
