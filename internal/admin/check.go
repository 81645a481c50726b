package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retention"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
	"github.com/outbox-relay/outbox-relay/sink/kafkaclient"
	"github.com/outbox-relay/outbox-relay/sql"
)

// Check runs the preflight checks, in the order an operator would fix what
// they find, writes one line per check ("ok" or "FAIL" with what to do) and a
// final count of failures, and returns the number that failed. It changes
// nothing.
func Check(ctx context.Context, cfg Config, k Kafka, w io.Writer) (failed int) {
	c := &checker{out: w}
	checkPostgres(ctx, &cfg, c)
	checkKafka(ctx, &cfg, k, c)
	if c.failed > 0 {
		fmt.Fprintf(w, "%d check(s) failed\n", c.failed)
	}
	return c.failed
}

type checker struct {
	out    io.Writer
	failed int
	// quiet prints only FAIL lines: setup's checks before it changes
	// anything print what stops it, as check does, and nothing else.
	quiet bool
}

// ok and fail escape the whole line: names from the catalog and server
// messages may hold control characters.
func (c *checker) ok(name, format string, args ...any) {
	if c.quiet {
		return
	}
	fmt.Fprintf(c.out, "ok    %s: %s\n", name, ops.Printable(fmt.Sprintf(format, args...)))
}

func (c *checker) fail(name, format string, args ...any) {
	c.failed++
	fmt.Fprintf(c.out, "FAIL  %s: %s\n", name, ops.Printable(fmt.Sprintf(format, args...)))
}

// warn reports what works but should change; info what an operator should
// know. Neither fails the check.
func (c *checker) warn(name, format string, args ...any) {
	if c.quiet {
		return
	}
	fmt.Fprintf(c.out, "warn  %s: %s\n", name, ops.Printable(fmt.Sprintf(format, args...)))
}

func (c *checker) info(name, format string, args ...any) {
	if c.quiet {
		return
	}
	fmt.Fprintf(c.out, "info  %s: %s\n", name, ops.Printable(fmt.Sprintf(format, args...)))
}

// checkPostgres checks, in the order an operator would fix them, what the
// relay needs from the server and the database.
func checkPostgres(ctx context.Context, cfg *Config, c *checker) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := cfg.connect(cctx)
	if err != nil {
		c.fail("postgres", "%v; check postgres.dsn and that the server is reachable", cfg.scrub(err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	c.ok("postgres", "connected to %s", cfg.RedactedDSN)
	checkTLS(ctx, conn, cfg, c)

	sl, role, ok := checkServer(ctx, conn, cfg, c)
	if !ok {
		return
	}
	checkReplicationConn(ctx, cfg, c)

	oid := checkOutboxTables(ctx, conn, cfg, c)
	pub := checkPublication(ctx, conn, cfg, c, oid)
	checkSlot(ctx, conn, cfg, c, sl, pub)
	cpOID, hOID := checkCheckpointTables(ctx, conn, cfg, c)
	if cpOID != 0 {
		checkSlotGap(ctx, conn, cfg, c)
		if hOID != 0 && oid != 0 {
			checkRefill(ctx, conn, cfg, c)
		}
	}
	checkFailover(ctx, conn, cfg, c, sl)
	checkWALBound(ctx, conn, cfg, c)
	checkRetryTables(ctx, conn, cfg, c)
	checkPrivileges(ctx, conn, cfg, c, role)
	checkRetention(ctx, conn, cfg, c, oid)
}

// checkOutboxTables checks the outbox table and its columns, the server's
// logical decoding messages when the relay reads them, and the other outbox
// tables, each with its columns and in the publication. It returns the outbox
// table's OID, 0 when it is missing or could not be read.
func checkOutboxTables(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) (oid uint32) {
	// The outbox table and its columns.
	outbox := cfg.OutboxTable
	oid, err := tableOID(ctx, conn, outbox)
	switch {
	case err != nil:
		c.fail("outbox table", "%v", cfg.scrub(err))
	case oid == 0 && cfg.MessagesOnly:
		c.ok("outbox table", "%s does not exist: events come from logical decoding messages (outbox.source: messages); without this archive, replay and recover have no rows to read (see docs/outbox-table.md)", outbox)
	case oid == 0:
		c.fail("outbox table", "%s does not exist; run `outbox-relay setup --create-outbox-table`, or set outbox.table", outbox)
	default:
		checkColumns(ctx, conn, oid, outbox, cfg, c)
	}
	if cfg.Messages {
		switch p, err := messagesProblem(ctx, conn); {
		case err != nil:
			c.fail("messages", "%v", cfg.scrub(err))
		case p != "":
			c.fail("messages", "%s", p)
		default:
			c.ok("messages", "the server's pgoutput sends logical decoding messages")
		}
	}

	// The other outbox tables, each with its columns and in the publication.
	for _, t := range cfg.Tables {
		toid, err := tableOID(ctx, conn, t.Name)
		switch {
		case err != nil:
			c.fail("outbox table", "%v", cfg.scrub(err))
			continue
		case toid == 0:
			c.fail("outbox table", "%s (outbox.tables) does not exist; run `outbox-relay setup --create-outbox-table`, or remove it from outbox.tables", t.Name)
			continue
		}
		if err := tableColumns(ctx, conn, toid, t.Name, t.Router); err != nil {
			c.fail("outbox table", "%v", strings.TrimPrefix(err.Error(), "outbox table "))
		} else {
			c.ok("outbox table", "%s has the mapped columns with usable types", t.Name)
		}
		switch tp, err := publication(ctx, conn, cfg.Publication, toid); {
		case err != nil:
			c.fail("publication", "%v", cfg.scrub(err))
		case tp.Exists && !tp.Covers:
			c.fail("publication", "%s does not cover the outbox table %s; ALTER PUBLICATION %s ADD TABLE %s",
				cfg.Publication, t.Name, sql.Ident(cfg.Publication), t.Name.Quoted())
		case tp.Exists:
			c.ok("publication", "%s covers the outbox table %s", cfg.Publication, t.Name)
		}
	}
	return oid
}

// checkPublication checks the publication of the outbox table (of OID oid)
// and returns it as found.
func checkPublication(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, oid uint32) publicationInfo {
	outbox := cfg.OutboxTable
	pubName := cfg.Publication
	pub, err := publication(ctx, conn, pubName, oid)
	switch {
	case err != nil:
		c.fail("publication", "%v", cfg.scrub(err))
	case !pub.Exists:
		c.fail("publication", "%s does not exist; run `outbox-relay setup`", pubName)
	case cfg.MessagesOnly && oid != 0 && pub.Covers:
		c.fail("publication", "%s covers %s, whose inserts stop a relay that reads messages only; ALTER PUBLICATION %s DROP TABLE %s, or set outbox.source: both if its inserts are events too",
			pubName, outbox, sql.Ident(pubName), outbox.Quoted())
	case cfg.MessagesOnly:
		c.ok("publication", "%s exists (covers %s; the relay reads messages only)", pubName, publicationTables(pub))
	case oid != 0 && !pub.Covers:
		c.fail("publication", "%s does not cover %s (it covers %s); ALTER PUBLICATION %s ADD TABLE %s",
			pubName, outbox, publicationTables(pub), sql.Ident(pubName), outbox.Quoted())
	case !pub.Insert:
		c.fail("publication", "%s does not publish inserts; ALTER PUBLICATION %s SET (publish = 'insert')", pubName, sql.Ident(pubName))
	case pub.PartitionsByName():
		c.fail("publication", "%s publishes the partitions of the partitioned %s under their own names, so an insert into a partition detached before the relay reads it cannot be told from another table's (the relay then stops); %s (or run `outbox-relay setup`)",
			pubName, outbox, sql.PublishViaRoot(pubName))
	case oid == 0:
		c.ok("publication", "%s exists (covers %s)", pubName, publicationTables(pub))
	case pub.Partitioned:
		c.ok("publication", "%s covers the partitioned %s (its partitions under its name) and publishes inserts", pubName, outbox)
	default:
		c.ok("publication", "%s covers %s and publishes inserts", pubName, outbox)
	}
	return pub
}

// checkSlot checks the slot as checkServer found it, and whether it can
// decode with the publication pub.
func checkSlot(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, sl slotInfo, pub publicationInfo) {
	slotName, pubName := cfg.Slot, cfg.Publication
	switch {
	case !sl.Exists:
		// With a checkpoint, setup would only replace the gap by another
		// (slot continuity says so, and names recover).
		c.fail("slot", "%s does not exist; run `outbox-relay setup` (or, if a relay delivered from it before, `outbox-relay recover`: see slot continuity)", slotName)
	case sl.problem(slotName) != "":
		c.fail("slot", "%s %s", slotName, sl.problem(slotName))
	case sl.Active:
		c.ok("slot", "%s uses pgoutput, confirmed up to %s, retains %s of WAL; active: held by PID %d (another relay, or a connection the server has not yet noticed is gone)",
			slotName, deref(sl.ConfirmedFlushLSN), ops.BytesOrNA(sl.RetainedWALBytes), deref(sl.ActivePID))
	default:
		c.ok("slot", "%s uses pgoutput, confirmed up to %s, retains %s of WAL; inactive",
			slotName, deref(sl.ConfirmedFlushLSN), ops.BytesOrNA(sl.RetainedWALBytes))
	}
	// Both may look fine and still not work together: a publication
	// recreated after the slot's position fails every start of the relay.
	if sl.Exists && sl.problem(slotName) == "" && pub.Exists {
		switch p, err := publicationAtSlot(ctx, conn, pubName, sl); {
		case err != nil:
			c.fail("slot decoding", "%v", cfg.scrub(err))
		case p != "":
			c.fail("slot decoding", "%s", p)
		case sl.Active:
			c.ok("slot decoding", "not tried: a relay holds the slot")
		default:
			c.ok("slot decoding", "%s can decode with publication %s from its position", slotName, pubName)
		}
	}
}

// checkCheckpointTables checks the checkpoint table and its history, and
// returns their OIDs, 0 when missing or not read.
func checkCheckpointTables(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) (cpOID, hOID uint32) {
	slotName, cpTable := cfg.Slot, cfg.CheckpointTable
	cpOID, err := tableOID(ctx, conn, cpTable)
	switch {
	case err != nil:
		c.fail("checkpoint table", "%v", cfg.scrub(err))
	case cpOID == 0:
		c.fail("checkpoint table", "%s does not exist; run `outbox-relay setup`", cpTable)
	default:
		checkpointLine(ctx, conn, cfg, c, "checkpoint table", cpTable, cpOID, func() (string, error) { return savedCheckpoint(ctx, conn, cpTable, slotName) })
	}
	history := sql.CheckpointHistoryName(cpTable)
	hOID, err = tableOID(ctx, conn, history)
	switch {
	case err != nil:
		c.fail("checkpoint history", "%v", cfg.scrub(err))
	case hOID == 0:
		c.fail("checkpoint history", "%s does not exist; run `outbox-relay setup` (a relay whose role may create tables there creates it at start); "+
			"without it retention deletes nothing and replay cannot map an LSN to rows", history)
	default:
		checkpointLine(ctx, conn, cfg, c, "checkpoint history", history, hOID, func() (string, error) { return historySummary(ctx, conn, history, slotName) })
	}
	return cpOID, hOID
}

// checkRetryTables checks the retry table, the owners of its neighbours,
// and the replay table.
func checkRetryTables(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	// The retry table: run stores failed events there.
	switch rOID, err := tableOID(ctx, conn, cfg.RetryTable); {
	case err != nil:
		c.fail("retry table", "%v", cfg.scrub(err))
	case rOID == 0:
		c.fail("retry table", "%s does not exist; run `outbox-relay setup`", cfg.RetryTable)
	default:
		c.ok("retry table", "%s exists", cfg.RetryTable)
		checkOwners(ctx, conn, cfg, c)
	}
	// The replay table is replay's alone: missing, it fails nothing.
	replayTable := sql.ReplayTableName(cfg.CheckpointTable)
	switch oid, err := tableOID(ctx, conn, replayTable); {
	case err != nil:
		c.fail("replay table", "%v", cfg.scrub(err))
	case oid == 0:
		c.ok("replay table", "%s does not exist yet: `outbox-relay setup` creates it (replay creates it only as a role that may create tables there)", replayTable)
	default:
		c.ok("replay table", "%s exists", replayTable)
	}
}

// checkRetention checks, when retention is on, what it needs of the outbox
// table (of OID oid).
func checkRetention(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, oid uint32) {
	outbox := cfg.OutboxTable
	// Retention, when on: what it needs of the outbox table.
	switch {
	case cfg.Retention <= 0:
		c.ok("retention", "off (outbox.retention): the outbox table keeps every row")
	case oid == 0:
		c.fail("retention", "on, but the outbox table %s does not exist", outbox)
	default:
		if err := retention.CheckTable(ctx, conn, outbox.String()); err != nil {
			c.fail("retention", "%s", cfg.text(field.Within("Retention", cfg.scrub(err))))
		} else if err := retention.CheckPartitions(ctx, conn, outbox.String(), cfg.RetentionPartitions); err != nil {
			c.fail("retention", "%s", cfg.text(field.Within("Retention", cfg.scrub(err))))
		} else if m := cfg.RetentionPartitions; m == retention.PartitionsDrop || m == retention.PartitionsDetach {
			c.ok("retention", "partitions of %s whose range ends more than %s ago are %s once all their rows are delivered; the default partition's rows are deleted (partitioned by created_at, owned)",
				outbox, period(cfg.Retention), map[retention.PartitionMode]string{retention.PartitionsDrop: "dropped", retention.PartitionsDetach: "detached"}[m])
		} else {
			c.ok("retention", "rows of %s older than %s are deleted once delivered (created_at, DELETE allowed)", outbox, period(cfg.Retention))
		}
	}
}

// checkServer checks what the relay needs of the server and its role, which
// setup cannot create (it runs them before it changes anything): wal_level,
// room for the slot and a sender, the role's REPLICATION. It returns the slot
// as found, the role's name, and false when it could not read them.
func checkServer(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) (sl slotInfo, role string, ok bool) {
	// Server settings.
	var walLevel string
	var maxSlots, usedSlots, maxSenders, usedSenders int
	err := conn.QueryRow(ctx, `SELECT current_setting('wal_level'),
       current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots)::int,
       current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication)::int`).
		Scan(&walLevel, &maxSlots, &usedSlots, &maxSenders, &usedSenders)
	if err != nil {
		c.fail("postgres settings", "cannot read them: %v", cfg.scrub(err))
		return sl, role, false
	}
	if walLevel == "logical" {
		c.ok("wal_level", "logical")
	} else {
		c.fail("wal_level", "%s; set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET wal_level = logical) and restart Postgres", walLevel)
	}
	sl, err = readSlot(ctx, conn, cfg.Slot)
	if err != nil {
		c.fail("slot", "%v", cfg.scrub(err))
		return sl, role, false
	}
	switch {
	case sl.Exists:
		c.ok("max_replication_slots", "%d of %d in use, including %s", usedSlots, maxSlots, cfg.Slot)
	case usedSlots < maxSlots:
		c.ok("max_replication_slots", "%d of %d in use; room for %s", usedSlots, maxSlots, cfg.Slot)
	default:
		c.fail("max_replication_slots", "all %d in use; raise max_replication_slots (restart needed) or drop an unused slot (SELECT slot_name, active FROM pg_replication_slots)", maxSlots)
	}
	// The relay's own sender counts when the slot is active.
	if usedSenders < maxSenders || sl.Active {
		c.ok("max_wal_senders", "%d of %d in use", usedSenders, maxSenders)
	} else {
		c.fail("max_wal_senders", "all %d in use; raise max_wal_senders (restart needed)", maxSenders)
	}

	// Privileges, then the replication connection itself (pg_hba, limits).
	var super, repl bool
	err = conn.QueryRow(ctx, `SELECT rolname, rolsuper, rolreplication FROM pg_roles WHERE rolname = current_user`).
		Scan(&role, &super, &repl)
	switch {
	case err != nil:
		c.fail("role", "cannot read it: %v", cfg.scrub(err))
	case super:
		c.warn("role", "%s is a superuser: the relay does not need superuser; give it a role with LOGIN REPLICATION and the grants of `outbox-relay setup --print-sql --role NAME`", role)
	case repl:
		c.ok("role", "%s has REPLICATION", role)
	default:
		c.fail("role", "%s has neither REPLICATION nor superuser; ALTER ROLE %s REPLICATION", role, sql.Ident(role))
	}
	return sl, role, true
}

// period writes a retention period as it is configured: 7d, 12h0m0s.
func period(d time.Duration) string {
	if day := 24 * time.Hour; d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return d.String()
}

// checkpointLine reports a table of the checkpoint that exists: what it
// holds, read with describe, when the role may read it. A role that may not
// gets its FAIL, with the GRANT, from checkPrivileges; any other error
// reading it fails here.
func checkpointLine(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker, name string, table sql.Table, oid uint32, describe func() (string, error)) {
	var readable bool
	err := conn.QueryRow(ctx, `SELECT has_table_privilege(c.oid, 'SELECT') AND has_schema_privilege(c.relnamespace, 'USAGE')
FROM pg_catalog.pg_class c WHERE c.oid = $1`, oid).Scan(&readable)
	if err != nil {
		c.fail(name, "%s: %v", table, cfg.scrub(err))
		return
	}
	if !readable {
		c.ok(name, "%s exists (this role may not read it: see privileges below)", table)
		return
	}
	d, err := describe()
	if err != nil {
		c.fail(name, "%s exists but reading it failed: %v", table, cfg.scrub(err))
		return
	}
	c.ok(name, "%s exists; %s", table, d)
}

// historySummary describes the slot's checkpoint history, for information.
func historySummary(ctx context.Context, conn *pgx.Conn, table sql.Table, slot string) (string, error) {
	var n int64
	var newest *time.Time
	err := conn.QueryRow(ctx, `SELECT count(*), max(saved_at) FROM `+table.Quoted()+` WHERE slot_name = $1`, slot).Scan(&n, &newest)
	switch {
	case err != nil:
		return "", err
	case newest == nil:
		return "no rows yet for " + slot + " (a relay records one at most every checkpoint.history_interval)", nil
	}
	return fmt.Sprintf("%d rows for %s, the newest saved %s", n, slot, newest.UTC().Format(time.RFC3339)), nil
}

// savedCheckpoint describes the checkpoint row of slot, for information.
func savedCheckpoint(ctx context.Context, conn *pgx.Conn, table sql.Table, slot string) (string, error) {
	var lsn string
	var saved time.Time
	err := conn.QueryRow(ctx, `SELECT lsn::text, saved_at FROM `+table.Quoted()+` WHERE slot_name = $1`, slot).Scan(&lsn, &saved)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return "nothing saved yet for " + slot, nil
	case err != nil:
		return "", err
	}
	return fmt.Sprintf("%s saved up to %s at %s", slot, lsn, saved.UTC().Format(time.RFC3339)), nil
}

func checkColumns(ctx context.Context, conn *pgx.Conn, oid uint32, table sql.Table, cfg *Config, c *checker) {
	if err := outboxColumns(ctx, conn, oid, table, cfg); err != nil {
		c.fail("outbox table", "%v", strings.TrimPrefix(err.Error(), "outbox table "))
		return
	}
	c.ok("outbox table", "%s has the mapped columns with usable types", table)
}

// outboxColumns returns the *placement.ColumnsError of the outbox table's
// columns against what the relay's router reads, as run reports it at start.
func outboxColumns(ctx context.Context, conn *pgx.Conn, oid uint32, table sql.Table, cfg *Config) error {
	return tableColumns(ctx, conn, oid, table, cfg.Router)
}

// tableColumns is outboxColumns for a table routed by rc.
func tableColumns(ctx context.Context, conn *pgx.Conn, oid uint32, table sql.Table, rc router.Config) error {
	rt, err := router.New(rc)
	if err != nil {
		return err
	}
	return placement.CheckColumns(ctx, conn, oid, table.String(), rt.Needs())
}

// checkReplicationConn opens a replication connection as the relay will:
// pg_hba.conf and the role's connection limit are only tested this way.
func checkReplicationConn(ctx context.Context, cfg *Config, c *checker) {
	pc, err := pgconn.ParseConfig(cfg.ReplicationConnDSN())
	if err != nil {
		c.fail("replication connection", "%v", cfg.scrub(err))
		return
	}
	pc.RuntimeParams["replication"] = "database"
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, pc)
	if replication.PoolerRefused(err) {
		// Not pg_hba.conf's doing: the pooler refused before Postgres saw it.
		c.fail("replication connection", "%s (%v)", replication.PoolerAdvice, cfg.scrub(err))
		return
	}
	if err != nil {
		c.fail("replication connection", "%v; allow it in pg_hba.conf (a line for this database, user and host) and check the role's privileges", cfg.scrub(err))
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	sys, err := pglogrepl.IdentifySystem(cctx, conn)
	if err != nil {
		c.fail("replication connection", "IDENTIFY_SYSTEM: %v", cfg.scrub(err))
		return
	}
	c.ok("replication connection", "system %s, timeline %d, WAL at %s", sys.SystemID, sys.Timeline, sys.XLogPos)
}

// Kafka is what Check asks Kafka, with the relay's settings (cfg.Kafka):
// sink.Kafka is one. Ping returns nil once a broker answers a fresh metadata
// request; CheckIdempotence once a broker hands out a producer id, as the
// relay's first idempotent write asks. Both block until answered or ctx is
// done.
type Kafka interface {
	Ping(ctx context.Context) error
	CheckIdempotence(ctx context.Context) error
	// CheckTransactions takes transactionalID, writes a record to topic in
	// a transaction, aborts it and reads topic read_committed, as an
	// exactly-once relay does: nil when all of it is allowed (wrapping
	// sink.ErrTransactionsNotAllowed when the principal lacks the
	// TransactionalId ACLs).
	CheckTransactions(ctx context.Context, transactionalID, topic string) error
}

func checkKafka(ctx context.Context, cfg *Config, k Kafka, c *checker) {
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := k.Ping(cctx); err != nil {
		// A refusal of the relay's own settings (SASL, TLS) is named with
		// the mechanism and the key to change; anything else may be an
		// outage.
		var auth *kafkaclient.AuthError
		if a, ok := k.(interface{ CheckAuth(context.Context) error }); ok && errors.As(a.CheckAuth(ctx), &auth) {
			c.fail("kafka", "refused: %s (%v)", cfg.text(field.Within("Sink", auth.FieldError())), cfg.scrub(auth.Err))
			return
		}
		c.fail("kafka", "%v; check kafka.brokers, TLS and SASL settings", cfg.scrub(err))
		return
	}
	c.ok("kafka", "%s answered a metadata request", strings.Join(cfg.Kafka.Brokers, ","))
	if cfg.Kafka.DisableIdempotence {
		return
	}
	// A principal without IdempotentWrite (Kafka before 3.0, or no WRITE
	// on any topic) is refused a producer id.
	if err := k.CheckIdempotence(cctx); err != nil {
		c.fail("kafka idempotence", "%v", cfg.scrub(err))
		return
	}
	c.ok("kafka idempotence", "the broker hands the relay a producer id (idempotent writes allowed)")
	if cfg.ExactlyOnce {
		checkTransactions(ctx, cfg, k, c)
	}
}

// checkTransactions checks what delivery: exactly-once needs of Kafka, under
// a transactional id of check's own beside the relay's (taking the relay's
// would fence a running relay): the same prefix, so the same ACLs.
func checkTransactions(ctx context.Context, cfg *Config, k Kafka, c *checker) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id := cfg.TransactionalID + "-check"
	err := k.CheckTransactions(cctx, id, cfg.CheckpointTopic)
	switch {
	case err == nil:
		c.ok("kafka transactions", "the relay may take transactional ids like %s and write %s in transactions (a test record, aborted)", id, cfg.CheckpointTopic)
	case errors.Is(err, sink.ErrTransactionsNotAllowed):
		principal := "the relay's principal"
		if u := cfg.Kafka.SASL.Username; u != "" {
			principal = "User:" + u
		}
		c.fail("kafka transactions", "%v; fix: kafka-acls.sh --add --allow-principal %s --operation Write --operation Describe --transactional-id %s --resource-pattern-type prefixed",
			cfg.scrub(err), principal, sink.TransactionalIDPrefix)
	case errors.Is(err, sink.ErrIdempotenceNotAllowed):
		c.fail("kafka transactions", "%v", cfg.scrub(err))
	default:
		c.fail("kafka transactions", "%v; the checkpoint topic must exist (outbox-relay setup creates it) and the relay's principal needs READ, WRITE and DESCRIBE on it, and WRITE and DESCRIBE on TransactionalId prefixed %s",
			cfg.scrub(err), sink.TransactionalIDPrefix)
	}
}

// checkWALBound reports postgres.max_retained_wal against the server's
// max_slot_wal_keep_size: the bound protects only while the relay runs; the
// server's limit protects the disk from a stopped relay, and must stay well
// above the bound so that a running relay buffers long before its slot is
// invalidated (a refill then heals a stopped relay's lost slot).
func checkWALBound(ctx context.Context, conn *pgx.Conn, cfg *Config, c *checker) {
	var keepMB, maxWALMB int64
	var fpiHints bool
	var role string
	err := conn.QueryRow(ctx, `SELECT (SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'),
       (SELECT setting::bigint FROM pg_settings WHERE name = 'max_wal_size'),
       current_setting('data_checksums') = 'on' OR current_setting('wal_log_hints') = 'on', current_user`).Scan(&keepMB, &maxWALMB, &fpiHints, &role)
	if err != nil {
		c.warn("max_retained_wal", "cannot read max_slot_wal_keep_size: %v", cfg.scrub(err))
		return
	}
	bound := cfg.MaxRetainedWAL
	// The bound plus the headroom below which the shipped alert
	// OutboxRelaySlotAtRisk fires (safe_wal_size < 2e9): a running relay at
	// its bound must not look at risk. Never under 2 x the bound or
	// 2 x max_wal_size (a checkpoint's worth of WAL on top of the bound).
	const atRiskHeadroom = 2 << 30
	recommend := max(2*bound, bound+atRiskHeadroom, 2*maxWALMB<<20)
	mb := func(b int64) string { return fmt.Sprintf("%dMB", b>>20) }
	switch {
	case bound == 0 && keepMB < 0:
		c.warn("max_retained_wal", "off, and max_slot_wal_keep_size is unlimited: while Kafka is away the slot keeps every table's WAL until the disk is full; set postgres.max_retained_wal (1GB) and max_slot_wal_keep_size with postgres.on_slot_loss: refill (docs/wal-buffer.md)")
	case bound == 0:
		c.warn("max_retained_wal", "off: while Kafka is away the slot keeps WAL up to max_slot_wal_keep_size = %s, then it is invalidated and needs a refill; set postgres.max_retained_wal (1GB) to buffer in Postgres instead (docs/wal-buffer.md)", mb(keepMB<<20))
	case keepMB < 0:
		c.warn("max_retained_wal", "%s while the relay runs; max_slot_wal_keep_size is unlimited, so a STOPPED relay's slot keeps WAL until the disk is full: set max_slot_wal_keep_size = '%s' (the bound plus the 2 GB under which OutboxRelaySlotAtRisk fires; at least 2 x the bound and 2 x max_wal_size) with postgres.on_slot_loss: refill (docs/wal-buffer.md)%s", mb(bound), mb(recommend), eosNote(cfg))
	case keepMB<<20 < recommend:
		c.warn("max_retained_wal", "%s, but max_slot_wal_keep_size = %s may invalidate the slot of a running relay before it buffers (it starts at half the bound, and the slot keeps up to ~15 s of WAL more): raise max_slot_wal_keep_size to at least '%s' or lower postgres.max_retained_wal (docs/wal-buffer.md)%s", mb(bound), mb(keepMB<<20), mb(recommend), eosNote(cfg))
	default:
		c.ok("max_retained_wal", "%s, below max_slot_wal_keep_size = %s: a running relay buffers in Postgres long before its slot could be lost%s", mb(bound), mb(keepMB<<20), eosNote(cfg))
	}
	if bound > 0 {
		checkSnapshots(ctx, conn, role, cfg, c)
	}
	if bound > 0 && fpiHints {
		// Said apart: vacuum's bursts are the WAL an operator sizing the
		// bound by the application's write rate leaves out.
		c.info("max_retained_wal", "data checksums or wal_log_hints are on: vacuum writes full-page images in bursts (about 40 MB/s at the default autovacuum cost settings) that a slot retains until the next xl_running_xacts record, whatever the relay confirms; size the bound for the largest burst on top of 45 s of the steady WAL rate (a few seconds where the relay logs the records itself), twice over (docs/wal-buffer.md)")
	}
}

// checkSnapshots says how the relay near its bound logs running-xacts
// records so that its slot follows what it confirms within seconds
// (walbuffer.SnapshotMethodOf), and what that costs.
func checkSnapshots(ctx context.Context, conn *pgx.Conn, role string, cfg *Config, c *checker) {
	method, function, err := walbuffer.SnapshotMethodOf(ctx, conn)
	switch {
	case err != nil:
		c.warn("max_retained_wal", "cannot read how the role may log running-xacts records: %v", cfg.scrub(err))
	case method == walbuffer.SnapshotFunction:
		c.ok("max_retained_wal", "%s may run pg_log_standby_snapshot(): near the bound the relay logs running-xacts records itself, so its slot follows what it confirms within seconds", sql.Ident(role))
	case method == walbuffer.SnapshotSlot && function:
		c.info("max_retained_wal", "%s may not run pg_log_standby_snapshot(): near the bound the relay logs running-xacts records by creating and dropping a temporary slot (one free entry of max_replication_slots for a moment; the server logs \"logical decoding found consistent point\" each time); GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %s (setup --print-sql prints it) does it without either (docs/wal-buffer.md)", sql.Ident(role), sql.Ident(role))
	case method == walbuffer.SnapshotSlot:
		c.info("max_retained_wal", "before Postgres 16 the relay near the bound logs running-xacts records by creating and dropping a temporary slot, so that its slot follows what it confirms within seconds: it needs one free entry of max_replication_slots for a moment, and the server logs \"logical decoding found consistent point\" each time (docs/wal-buffer.md)")
	default:
		c.info("max_retained_wal", "the relay cannot log running-xacts records here (a standby, or a role without REPLICATION): the slot moves only at the server's, every 15 s, and a record that finds a transaction open does not move it, so the bound must leave room for 45 s of the server's WAL (docs/wal-buffer.md)")
	}
}

// eosNote is what check adds about the WAL buffer with exactly-once
// delivery: the buffered range is delivered at least once.
func eosNote(cfg *Config) string {
	if !cfg.ExactlyOnce || cfg.MaxRetainedWAL == 0 {
		return ""
	}
	return "; with delivery: exactly-once, events that go through the buffer are delivered at least once, marked outbox-relay-delivery: at-least-once (docs/wal-buffer.md)"
}
