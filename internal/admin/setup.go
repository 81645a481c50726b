package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/sql"
)

// ErrNothingCreated is Setup's error when a check it runs first failed
// (wal_level, room for the slot and a sender, the role's REPLICATION, a
// replication connection): it created and changed nothing.
var ErrNothingCreated = errors.New("setup created nothing")

// Setup creates what the relay needs and is missing: the checkpoint table and
// its history, the retry table, the replay table, the outbox table (with createOutbox), the publication of the outbox
// table (inserts only) and the pgoutput slot, and writes a line per object
// saying what it found or did. It is idempotent and alters nothing that
// exists, except a retry table of an earlier version, which it upgrades.
// A problem it cannot fix (the outbox table missing, a publication of other
// tables) is written with the fix; the slot is then not created, since it
// would retain WAL before the relay can use it, and Setup returns an error.
func Setup(ctx context.Context, cfg Config, createOutbox bool, w io.Writer) error {
	return cfg.scrub(setup(ctx, &cfg, createOutbox, w))
}

func setup(ctx context.Context, cfg *Config, createOutbox bool, w io.Writer) error {
	conn, err := cfg.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// What setup cannot create, checked before it creates anything: a
	// setup that stopped half-way (five tables and a publication, then the
	// slot refused at wal_level = replica) left the operator to guess.
	pre := &checker{out: w, quiet: true}
	if _, _, ok := checkServer(ctx, conn, cfg, pre); ok {
		checkReplicationConn(ctx, cfg, pre)
	}
	if pre.failed > 0 {
		return fmt.Errorf("%w: %d check(s) failed (the FAIL lines above, as `outbox-relay check` prints them); fix them and run setup again", ErrNothingCreated, pre.failed)
	}
	// say prints one line; escaped, since names come from the config and
	// the catalog and may hold control characters.
	say := func(format string, args ...any) {
		fmt.Fprintln(w, ops.Printable(fmt.Sprintf(format, args...)))
	}
	problems := 0
	problem := func(format string, args ...any) {
		problems++
		say(format, args...)
	}

	outbox := cfg.OutboxTable
	oid, err := tableOID(ctx, conn, outbox)
	if err != nil {
		return err
	}
	switch {
	case oid != 0:
		say("outbox table %s: already exists", outbox)
	case createOutbox:
		for _, stmt := range sql.OutboxTable(outbox, cfg.Columns, cfg.Layout) {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("create outbox table %s: %w", outbox, err)
			}
		}
		if oid, err = tableOID(ctx, conn, outbox); err != nil {
			return err
		}
		say("outbox table %s: created (%s layout)", outbox, cfg.Layout)
	case cfg.MessagesOnly:
		say("outbox table %s: none; events come from logical decoding messages (outbox.source: messages), and this table is only the optional archive replay and recover read", outbox)
	default:
		problem("outbox table %s: missing; create it with `outbox-relay setup --create-outbox-table`, or set outbox.table to your outbox table", outbox)
	}
	if cfg.Messages {
		p, err := messagesProblem(ctx, conn)
		if err != nil {
			return err
		}
		if p != "" {
			problem("messages: %s", p)
		}
	}

	// The columns the relay reads, as run checks them at start: a mapping
	// that cannot work is a problem now, not at the first event.
	if oid != 0 {
		var ce *placement.ColumnsError
		switch err := outboxColumns(ctx, conn, oid, outbox, cfg); {
		case errors.As(err, &ce):
			problem("%v", err)
		case err != nil:
			return err
		}
	}

	// The other outbox tables (outbox.tables), each as the first.
	var more []sql.Table
	moreOIDs := map[sql.Table]uint32{}
	for _, t := range cfg.Tables {
		toid, err := tableOID(ctx, conn, t.Name)
		if err != nil {
			return err
		}
		switch {
		case toid != 0:
			say("outbox table %s: already exists", t.Name)
		case createOutbox:
			for _, stmt := range sql.OutboxTable(t.Name, t.Columns, t.Layout) {
				if _, err := conn.Exec(ctx, stmt); err != nil {
					return fmt.Errorf("create outbox table %s: %w", t.Name, err)
				}
			}
			if toid, err = tableOID(ctx, conn, t.Name); err != nil {
				return err
			}
			say("outbox table %s: created (%s layout)", t.Name, t.Layout)
		default:
			problem("outbox table %s: missing; create it with `outbox-relay setup --create-outbox-table`, or remove it from outbox.tables", t.Name)
			continue
		}
		var ce *placement.ColumnsError
		switch err := tableColumns(ctx, conn, toid, t.Name, t.Router); {
		case errors.As(err, &ce):
			problem("%v", err)
		case err != nil:
			return err
		}
		more = append(more, t.Name)
		moreOIDs[t.Name] = toid
	}

	checkpoint := cfg.CheckpointTable
	cpOID, err := tableOID(ctx, conn, checkpoint)
	if err != nil {
		return err
	}
	if cpOID != 0 {
		// A table from before high availability gets the epoch columns
		// that fence a former leader (a no-op when present).
		var have int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attname = ANY($2) AND NOT attisdropped`, cpOID, sql.CheckpointUpgradeColumns).Scan(&have); err != nil {
			return fmt.Errorf("look up checkpoint table %s: %w", checkpoint, err)
		}
		if have < len(sql.CheckpointUpgradeColumns) {
			if _, err := conn.Exec(ctx, sql.CheckpointUpgrade(checkpoint)); err != nil {
				return fmt.Errorf("add the columns of this version to checkpoint table %s: %w", checkpoint, err)
			}
			say("checkpoint table %s: added the columns of this version (%s)", checkpoint, strings.Join(sql.CheckpointUpgradeColumns, ", "))
		}
		say("checkpoint table %s: already exists", checkpoint)
	} else {
		if _, err := conn.Exec(ctx, sql.CheckpointTable(checkpoint)); err != nil {
			return fmt.Errorf("create checkpoint table %s: %w", checkpoint, err)
		}
		say("checkpoint table %s: created", checkpoint)
	}

	// The history of the checkpoint table: idempotent statements, run
	// either way, so that a missing index is created too.
	history := sql.CheckpointHistoryName(checkpoint)
	hOID, err := tableOID(ctx, conn, history)
	if err != nil {
		return err
	}
	for _, stmt := range sql.CheckpointHistoryTable(checkpoint) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create checkpoint history table %s: %w", history, err)
		}
	}
	if hOID != 0 {
		say("checkpoint history table %s: already exists", history)
	} else {
		say("checkpoint history table %s: created", history)
	}

	retryTable := cfg.RetryTable
	rOID, err := tableOID(ctx, conn, retryTable)
	if err != nil {
		return err
	}
	// The statements are idempotent and also upgrade a table made by an
	// earlier version (what lets it store every event): run them either way.
	for _, stmt := range sql.RetryTable(retryTable) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create or upgrade retry table %s: %w", retryTable, err)
		}
	}
	if rOID != 0 {
		say("retry table %s: already exists (upgraded if an earlier version made it)", retryTable)
	} else {
		say("retry table %s: created", retryTable)
	}
	// The WAL buffer beside the retry table (postgres.max_retained_wal).
	buf, err := walbuffer.TableFor(retryTable.String())
	if err != nil {
		return err
	}
	bOID, err := tableOID(ctx, conn, buf)
	if err != nil {
		return err
	}
	for _, stmt := range walbuffer.CreateTable(buf) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create WAL buffer table %s: %w", buf, err)
		}
	}
	if bOID != 0 {
		say("WAL buffer table %s: already exists", buf)
	} else {
		say("WAL buffer table %s: created", buf)
	}
	if err := setupOwners(ctx, conn, cfg, say, problem); err != nil {
		return err
	}

	// The replay table: replay would create it itself, but only as a role
	// that may create tables; created here, replay runs with grants alone.
	replayTable := sql.ReplayTableName(checkpoint)
	rpOID, err := tableOID(ctx, conn, replayTable)
	if err != nil {
		return err
	}
	// Idempotent, and they upgrade a table of an earlier version (runs
	// belong to a slot): run them either way.
	for _, stmt := range sql.ReplayTable(checkpoint) {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create or upgrade replay table %s: %w", replayTable, err)
		}
	}
	if rpOID != 0 {
		say("replay table %s: already exists (upgraded if an earlier version made it)", replayTable)
	} else {
		say("replay table %s: created", replayTable)
	}

	pubName := cfg.Publication
	pub, err := publication(ctx, conn, pubName, oid)
	if err != nil {
		return err
	}
	switch {
	case cfg.MessagesOnly && !pub.Exists:
		if _, err := conn.Exec(ctx, sql.CreateMessagesPublication(pubName)); err != nil {
			return fmt.Errorf("create publication %s: %w", pubName, err)
		}
		say("publication %s: created for no table (logical decoding messages are sent whatever it covers)", pubName)
	case cfg.MessagesOnly && oid != 0 && pub.Covers:
		problem("publication %s: covers %s, whose inserts would stop a relay that reads messages only; fix: ALTER PUBLICATION %s DROP TABLE %s, or set outbox.source: both if its inserts are events too",
			pubName, outbox, sql.Ident(pubName), outbox.Quoted())
	case cfg.MessagesOnly:
		say("publication %s: already exists", pubName)
	case !pub.Exists && oid == 0:
		problem("publication %s: not created: the outbox table is missing", pubName)
	case !pub.Exists:
		if _, err := conn.Exec(ctx, sql.CreatePublication(pubName, outbox, more...)); err != nil {
			return fmt.Errorf("create publication %s: %w", pubName, err)
		}
		names := outbox.String()
		for _, t := range more {
			names += ", " + t.String()
		}
		say("publication %s: created for %s, inserts only, partitions under the table's name (publish_via_partition_root)", pubName, names)
		pub.Exists, more = true, nil // all covered
	case oid == 0:
		say("publication %s: already exists", pubName)
	case !pub.Covers:
		problem("publication %s: already exists but does not cover %s (it covers %s); fix: ALTER PUBLICATION %s ADD TABLE %s, or set postgres.publication to another name",
			pubName, outbox, publicationTables(pub), sql.Ident(pubName), outbox.Quoted())
	case !pub.Insert:
		problem("publication %s: already exists but does not publish inserts; fix: ALTER PUBLICATION %s SET (publish = 'insert')",
			pubName, sql.Ident(pubName))
	case pub.PartitionsByName():
		// The relay places partitions' inserts by the catalog, but one of
		// a partition detached before the relay read it could not be told
		// from another table's: publish under the root's name.
		if _, err := conn.Exec(ctx, sql.PublishViaRoot(pubName)); err != nil {
			return fmt.Errorf("set publish_via_partition_root on publication %s: %w", pubName, err)
		}
		say("publication %s: already exists, covers the partitioned %s; set publish_via_partition_root = true, so that its partitions' inserts arrive under its name", pubName, outbox)
	default:
		say("publication %s: already exists, covers %s", pubName, outbox)
	}

	// An existing publication must cover every other outbox table too.
	for _, t := range more {
		if !pub.Exists || cfg.MessagesOnly {
			break
		}
		tp, err := publication(ctx, conn, pubName, moreOIDs[t])
		if err != nil {
			return err
		}
		if !tp.Covers {
			problem("publication %s: does not cover the outbox table %s; fix: ALTER PUBLICATION %s ADD TABLE %s",
				pubName, t, sql.Ident(pubName), t.Quoted())
		}
	}

	if cfg.ExactlyOnce {
		// The checkpoint topic of exactly-once delivery, before the slot.
		switch created, err := cfg.Topics.CreateCompactedTopic(ctx, cfg.CheckpointTopic); {
		case err != nil:
			problem("kafka checkpoint topic %s: %v; create it (one partition, cleanup.policy=compact), or set kafka.checkpoint_topic to one that exists", cfg.CheckpointTopic, cfg.scrub(err))
		case created:
			say("kafka checkpoint topic %s: created (one partition, cleanup.policy=compact)", cfg.CheckpointTopic)
		default:
			say("kafka checkpoint topic %s: already exists", cfg.CheckpointTopic)
		}
	}

	slotName := cfg.Slot
	s, err := readSlot(ctx, conn, slotName)
	if err != nil {
		return err
	}
	if cfg.Failover {
		p, err := failoverProblem(ctx, conn, cfg)
		if err != nil {
			return err
		}
		if p != "" {
			problem("slot %s: %s", slotName, p)
		}
	}
	switch {
	case s.Exists:
		if p := s.problem(slotName); p != "" {
			problem("slot %s: already exists but %s", slotName, p)
			break
		}
		say("slot %s: already exists (pgoutput)", slotName)
		if cfg.Failover && problems == 0 {
			if err := setupFailover(ctx, cfg, conn, slotName, say, problem); err != nil {
				return err
			}
		}
		// An existing slot and a publication created (now or earlier) after
		// its position: each looks fine, together they fail every start.
		if pub.Exists || oid != 0 {
			p, err := publicationAtSlot(ctx, conn, pubName, s)
			if err != nil {
				return err
			}
			if p != "" {
				problem("slot %s: %s", slotName, p)
			}
		}
	case problems > 0:
		// A slot holds WAL back from the moment it exists: not before the
		// relay can use it.
		problem("slot %s: not created until the problems above are fixed", slotName)
	default:
		create, how := sql.CreateSlot(slotName), "pgoutput"
		if cfg.Failover {
			create, how = sql.CreateFailoverSlot(slotName), "pgoutput, failover"
		}
		if _, err := conn.Exec(ctx, create); err != nil {
			return fmt.Errorf("create slot %s: %w", slotName, err)
		}
		s, err := readSlot(ctx, conn, slotName)
		if err != nil {
			return err
		}
		say("slot %s: created (%s) at %s", slotName, how, deref(s.ConfirmedFlushLSN))
	}

	if problems > 0 {
		return fmt.Errorf("setup incomplete: %d problem(s) above", problems)
	}
	return nil
}

// PrintSQL writes, without connecting, every statement Setup would run for
// cfg's names (the outbox table too with createOutbox), each idempotent, then
// what the relay's role needs: LOGIN REPLICATION (the role is created if
// missing), CONNECT on the DSN's database, and the grants of
// sql.RelayPrivileges; the slot comes last, since it retains WAL from the
// moment it exists. It is for a DBA to run as the tables' owner or a
// superuser (psql -v ON_ERROR_STOP=1 -f FILE), so that the relay runs as a
// role that is neither. role "" means the DSN's user.
func PrintSQL(cfg Config, role string, createOutbox bool, w io.Writer) error {
	pc, err := pgconn.ParseConfig(cfg.DSN)
	if err != nil {
		return cfg.scrub(fmt.Errorf("postgres.dsn %s: %w", cfg.RedactedDSN, err))
	}
	if role == "" {
		role = pc.User
	}
	if role == "" {
		return errors.New("no role to grant to: give --role, or a user in postgres.dsn")
	}
	// A name in a comment must not end the comment line.
	inComment := ops.Printable(sql.Ident(role))
	var b strings.Builder
	block := func(comment string, stmts ...string) {
		b.WriteString("\n")
		for _, para := range strings.Split(comment, "\n") {
			for _, line := range WrapWords(para, 80) {
				b.WriteString(strings.TrimRight("-- "+line, " ") + "\n")
			}
		}
		for _, s := range stmts {
			b.WriteString(s + ";\n")
		}
	}
	fmt.Fprintf(&b, `-- outbox-relay setup --print-sql: what `+"`outbox-relay setup`"+` does for this
-- configuration, and the privileges of the relay's role %s. Run it as the
-- owner of the tables or a superuser, in psql's autocommit mode:
--   psql -v ON_ERROR_STOP=1 -f FILE
-- Every statement is idempotent. The relay then runs as %s with LOGIN and
-- REPLICATION and these grants, never as superuser; `+"`outbox-relay check`"+`, run as
-- %s, names any that is missing.
`, inComment, inComment, inComment)
	o := cfg.objects()
	var more []sql.Table
	for _, t := range cfg.Tables {
		more = append(more, t.Name)
	}
	if createOutbox {
		block(fmt.Sprintf("The outbox table (%s layout).", cfg.Layout), sql.OutboxTable(o.Outbox, cfg.Columns, cfg.Layout)...)
		for _, t := range cfg.Tables {
			block(fmt.Sprintf("The outbox table %s (%s layout).", t.Name, t.Layout), sql.OutboxTable(t.Name, t.Columns, t.Layout)...)
		}
	}
	block("The checkpoint table: the last transaction delivered, one row per slot, and the\n"+
		"epoch of the relay that leads the slot (a table from an earlier version gets the column).",
		sql.CheckpointTable(o.Checkpoint), sql.CheckpointUpgrade(o.Checkpoint))
	block("The checkpoint history (replay and retention map LSNs to rows with it).", sql.CheckpointHistoryTable(o.Checkpoint)...)
	block("The retry table: failed events, and those waiting behind them.", sql.RetryTable(o.Retry)...)
	block("The WAL buffer: what the relay read and could not deliver yet (postgres.max_retained_wal).", walbuffer.CreateTable(sql.WALBufferTable(o.Retry))...)
	block("The replay table: replay's resumable runs.", sql.ReplayTable(o.Checkpoint)...)
	if cfg.MessagesOnly {
		block("The publication, of no table: the relay reads logical decoding messages, which\n"+
			"pgoutput sends whatever the publication covers.",
			sql.CreateMessagesPublicationIfMissing(cfg.Publication))
	} else {
		block("The publication of the outbox table, inserts only; a partitioned outbox's partitions\n"+
			"publish under its name (an existing publication gets the option too).",
			sql.CreatePublicationIfMissing(cfg.Publication, o.Outbox, more...), sql.PublishViaRoot(cfg.Publication))
	}
	block("The relay's role: LOGIN REPLICATION, created without a password if missing\n"+
		"(set one: \\password in psql). Needs a superuser; on a managed service grant\n"+
		"its replication role instead (AWS RDS: GRANT rds_replication TO "+inComment+").",
		sql.EnsureRole(role))
	block("Every command connects to the database.", sql.GrantConnect(pc.Database, role))
	for _, p := range sql.RelayPrivileges(o) {
		block(p.What+": "+p.Why, p.Grant(role))
	}
	if cfg.MaxRetainedWAL > 0 {
		block("Postgres 16+ (skipped before): the relay near postgres.max_retained_wal logs\n"+
			"running-xacts records itself, so that its slot follows what it confirms within\n"+
			"seconds rather than every 15 s or more (docs/wal-buffer.md).",
			sql.GrantLogSnapshots(role))
	}
	slotStmt, slotNote := sql.CreateSlotIfMissing(cfg.Slot), ""
	if cfg.Failover {
		// postgres.failover: a failover slot (Postgres 17+).
		slotStmt = strings.Replace(slotStmt, sql.CreateSlot(cfg.Slot), sql.CreateFailoverSlot(cfg.Slot), 1)
		slotNote = "\nA failover slot (postgres.failover; Postgres 17+), synced to standbys with\nsync_replication_slots = on: see docs/failover.md."
	}
	block("The replication slot, last: from the moment it exists the server keeps WAL\n"+
		"for it until the relay confirms it. Not inside a transaction that has written."+slotNote,
		slotStmt)
	_, err = io.WriteString(w, b.String())
	return err
}

// WrapWords breaks text into lines of at most width bytes, at spaces (the
// printed SQL of setup, and the comments of config.example.yaml).
func WrapWords(text string, width int) []string {
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
	return append(lines, line)
}
