package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
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
	s := &setupRun{conn: conn, cfg: cfg, createOutbox: createOutbox, out: w, moreOIDs: map[sql.Table]uint32{}}
	// The steps, in this order: each may use what those before it found
	// (the outbox table's OID, the publication), and the slot comes last,
	// since it retains WAL from the moment it exists.
	for _, step := range []func(context.Context) error{
		s.outboxTable,
		s.messages,
		s.outboxColumns,
		s.moreTables,
		s.checkpointTable,
		s.checkpointHistory,
		s.retryTable,
		s.walBuffer,
		s.owners,
		s.replayTable,
		s.publication,
		s.publicationOfMore,
		s.checkpointTopic,
		s.slot,
	} {
		if err := step(ctx); err != nil {
			return err
		}
	}
	if s.problems > 0 {
		return fmt.Errorf("setup incomplete: %d problem(s) above", s.problems)
	}
	return nil
}

// setupRun is one run of setup: what its steps share, and what those
// before a step found that it needs.
type setupRun struct {
	conn         *pgx.Conn
	cfg          *Config
	createOutbox bool
	out          io.Writer
	problems     int

	oid      uint32 // the outbox table's, 0 when missing
	more     []sql.Table
	moreOIDs map[sql.Table]uint32
	pub      publicationInfo
}

// say prints one line; escaped, since names come from the config and
// the catalog and may hold control characters.
func (s *setupRun) say(format string, args ...any) {
	fmt.Fprintln(s.out, ops.Printable(fmt.Sprintf(format, args...)))
}

// problem prints a line about what setup cannot fix, and counts it.
func (s *setupRun) problem(format string, args ...any) {
	s.problems++
	s.say(format, args...)
}

// createOutboxTable runs the statements of an outbox table and returns its OID.
func (s *setupRun) createOutboxTable(ctx context.Context, t sql.Table, columns sql.Columns, layout sql.Layout) (uint32, error) {
	for _, stmt := range sql.OutboxTable(t, columns, layout) {
		if _, err := s.conn.Exec(ctx, stmt); err != nil {
			return 0, fmt.Errorf("create outbox table %s: %w", t, err)
		}
	}
	return tableOID(ctx, s.conn, t)
}

func (s *setupRun) outboxTable(ctx context.Context) error {
	cfg, outbox := s.cfg, s.cfg.OutboxTable
	oid, err := tableOID(ctx, s.conn, outbox)
	if err != nil {
		return err
	}
	switch {
	case oid != 0:
		s.say("outbox table %s: already exists", outbox)
	case s.createOutbox:
		if oid, err = s.createOutboxTable(ctx, outbox, cfg.Columns, cfg.Layout); err != nil {
			return err
		}
		s.say("outbox table %s: created (%s layout)", outbox, cfg.Layout)
	case cfg.MessagesOnly:
		s.say("outbox table %s: none; events come from logical decoding messages (outbox.source: messages), and this table is only the optional archive replay and recover read", outbox)
	default:
		s.problem("outbox table %s: missing; create it with `outbox-relay setup --create-outbox-table`, or set outbox.table to your outbox table", outbox)
	}
	s.oid = oid
	return nil
}

func (s *setupRun) messages(ctx context.Context) error {
	if !s.cfg.Messages {
		return nil
	}
	p, err := messagesProblem(ctx, s.conn)
	if err != nil {
		return err
	}
	if p != "" {
		s.problem("messages: %s", p)
	}
	return nil
}

// outboxColumns checks the columns the relay reads, as run checks them at
// start: a mapping that cannot work is a problem now, not at the first event.
func (s *setupRun) outboxColumns(ctx context.Context) error {
	if s.oid == 0 {
		return nil
	}
	var ce *placement.ColumnsError
	switch err := outboxColumns(ctx, s.conn, s.oid, s.cfg.OutboxTable, s.cfg); {
	case errors.As(err, &ce):
		s.problem("%v", err)
	case err != nil:
		return err
	}
	return nil
}

// moreTables does for the other outbox tables (outbox.tables) what
// outboxTable and outboxColumns do for the first.
func (s *setupRun) moreTables(ctx context.Context) error {
	for _, t := range s.cfg.Tables {
		toid, err := tableOID(ctx, s.conn, t.Name)
		if err != nil {
			return err
		}
		switch {
		case toid != 0:
			s.say("outbox table %s: already exists", t.Name)
		case s.createOutbox:
			if toid, err = s.createOutboxTable(ctx, t.Name, t.Columns, t.Layout); err != nil {
				return err
			}
			s.say("outbox table %s: created (%s layout)", t.Name, t.Layout)
		default:
			s.problem("outbox table %s: missing; create it with `outbox-relay setup --create-outbox-table`, or remove it from outbox.tables", t.Name)
			continue
		}
		var ce *placement.ColumnsError
		switch err := tableColumns(ctx, s.conn, toid, t.Name, t.Router); {
		case errors.As(err, &ce):
			s.problem("%v", err)
		case err != nil:
			return err
		}
		s.more = append(s.more, t.Name)
		s.moreOIDs[t.Name] = toid
	}
	return nil
}

func (s *setupRun) checkpointTable(ctx context.Context) error {
	checkpoint := s.cfg.CheckpointTable
	cpOID, err := tableOID(ctx, s.conn, checkpoint)
	if err != nil {
		return err
	}
	if cpOID == 0 {
		if _, err := s.conn.Exec(ctx, sql.CheckpointTable(checkpoint)); err != nil {
			return fmt.Errorf("create checkpoint table %s: %w", checkpoint, err)
		}
		s.say("checkpoint table %s: created", checkpoint)
		return nil
	}
	// A table from before high availability gets the epoch columns
	// that fence a former leader (a no-op when present).
	var have int
	if err := s.conn.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_attribute
WHERE attrelid = $1 AND attname = ANY($2) AND NOT attisdropped`, cpOID, sql.CheckpointUpgradeColumns).Scan(&have); err != nil {
		return fmt.Errorf("look up checkpoint table %s: %w", checkpoint, err)
	}
	if have < len(sql.CheckpointUpgradeColumns) {
		if _, err := s.conn.Exec(ctx, sql.CheckpointUpgrade(checkpoint)); err != nil {
			return fmt.Errorf("add the columns of this version to checkpoint table %s: %w", checkpoint, err)
		}
		s.say("checkpoint table %s: added the columns of this version (%s)", checkpoint, strings.Join(sql.CheckpointUpgradeColumns, ", "))
	}
	s.say("checkpoint table %s: already exists", checkpoint)
	return nil
}

// idempotent runs stmts, idempotent statements, whether or not table exists
// (so that they also create what is missing of it, or upgrade it), and says
// which: existed or created. what names the table in the error.
func (s *setupRun) idempotent(ctx context.Context, table sql.Table, stmts []string, what, existed, created string) error {
	oid, err := tableOID(ctx, s.conn, table)
	if err != nil {
		return err
	}
	for _, stmt := range stmts {
		if _, err := s.conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("%s %s: %w", what, table, err)
		}
	}
	if oid != 0 {
		s.say(existed, table)
	} else {
		s.say(created, table)
	}
	return nil
}

// checkpointHistory: idempotent statements, run either way, so that a
// missing index is created too.
func (s *setupRun) checkpointHistory(ctx context.Context) error {
	checkpoint := s.cfg.CheckpointTable
	return s.idempotent(ctx, sql.CheckpointHistoryName(checkpoint), sql.CheckpointHistoryTable(checkpoint),
		"create checkpoint history table", "checkpoint history table %s: already exists", "checkpoint history table %s: created")
}

// retryTable: the statements are idempotent and also upgrade a table made
// by an earlier version (what lets it store every event): run them either way.
func (s *setupRun) retryTable(ctx context.Context) error {
	t := s.cfg.RetryTable
	return s.idempotent(ctx, t, sql.RetryTable(t),
		"create or upgrade retry table", "retry table %s: already exists (upgraded if an earlier version made it)", "retry table %s: created")
}

// walBuffer: the WAL buffer beside the retry table (postgres.max_retained_wal).
func (s *setupRun) walBuffer(ctx context.Context) error {
	buf, err := walbuffer.TableFor(s.cfg.RetryTable.String())
	if err != nil {
		return err
	}
	return s.idempotent(ctx, buf, walbuffer.CreateTable(buf),
		"create WAL buffer table", "WAL buffer table %s: already exists", "WAL buffer table %s: created")
}

func (s *setupRun) owners(ctx context.Context) error {
	return setupOwners(ctx, s.conn, s.cfg, s.say, s.problem)
}

// replayTable: replay would create it itself, but only as a role that may
// create tables; created here, replay runs with grants alone. Idempotent,
// and they upgrade a table of an earlier version (runs belong to a slot):
// run them either way.
func (s *setupRun) replayTable(ctx context.Context) error {
	checkpoint := s.cfg.CheckpointTable
	return s.idempotent(ctx, sql.ReplayTableName(checkpoint), sql.ReplayTable(checkpoint),
		"create or upgrade replay table", "replay table %s: already exists (upgraded if an earlier version made it)", "replay table %s: created")
}

// publication creates the publication of the outbox tables, or says what
// is wrong with the one that exists.
func (s *setupRun) publication(ctx context.Context) error {
	cfg, conn, oid := s.cfg, s.conn, s.oid
	pubName, outbox := cfg.Publication, cfg.OutboxTable
	pub, err := publication(ctx, conn, pubName, oid)
	if err != nil {
		return err
	}
	switch {
	case cfg.MessagesOnly && !pub.Exists:
		if _, err := conn.Exec(ctx, sql.CreateMessagesPublication(pubName)); err != nil {
			return fmt.Errorf("create publication %s: %w", pubName, err)
		}
		s.say("publication %s: created for no table (logical decoding messages are sent whatever it covers)", pubName)
	case cfg.MessagesOnly && oid != 0 && pub.Covers:
		s.problem("publication %s: covers %s, whose inserts would stop a relay that reads messages only; fix: ALTER PUBLICATION %s DROP TABLE %s, or set outbox.source: both if its inserts are events too",
			pubName, outbox, sql.Ident(pubName), outbox.Quoted())
	case cfg.MessagesOnly:
		s.say("publication %s: already exists", pubName)
	case !pub.Exists && oid == 0:
		s.problem("publication %s: not created: the outbox table is missing", pubName)
	case !pub.Exists:
		if _, err := conn.Exec(ctx, sql.CreatePublication(pubName, outbox, s.more...)); err != nil {
			return fmt.Errorf("create publication %s: %w", pubName, err)
		}
		names := outbox.String()
		for _, t := range s.more {
			names += ", " + t.String()
		}
		s.say("publication %s: created for %s, inserts only, partitions under the table's name (publish_via_partition_root)", pubName, names)
		pub.Exists, s.more = true, nil // all covered
	case oid == 0:
		s.say("publication %s: already exists", pubName)
	case !pub.Covers:
		s.problem("publication %s: already exists but does not cover %s (it covers %s); fix: ALTER PUBLICATION %s ADD TABLE %s, or set postgres.publication to another name",
			pubName, outbox, publicationTables(pub), sql.Ident(pubName), outbox.Quoted())
	case !pub.Insert:
		s.problem("publication %s: already exists but does not publish inserts; fix: ALTER PUBLICATION %s SET (publish = 'insert')",
			pubName, sql.Ident(pubName))
	case pub.PartitionsByName():
		// The relay places partitions' inserts by the catalog, but one of
		// a partition detached before the relay read it could not be told
		// from another table's: publish under the root's name.
		if _, err := conn.Exec(ctx, sql.PublishViaRoot(pubName)); err != nil {
			return fmt.Errorf("set publish_via_partition_root on publication %s: %w", pubName, err)
		}
		s.say("publication %s: already exists, covers the partitioned %s; set publish_via_partition_root = true, so that its partitions' inserts arrive under its name", pubName, outbox)
	default:
		s.say("publication %s: already exists, covers %s", pubName, outbox)
	}
	s.pub = pub
	return nil
}

// publicationOfMore: an existing publication must cover every other outbox
// table too.
func (s *setupRun) publicationOfMore(ctx context.Context) error {
	pubName := s.cfg.Publication
	for _, t := range s.more {
		if !s.pub.Exists || s.cfg.MessagesOnly {
			break
		}
		tp, err := publication(ctx, s.conn, pubName, s.moreOIDs[t])
		if err != nil {
			return err
		}
		if !tp.Covers {
			s.problem("publication %s: does not cover the outbox table %s; fix: ALTER PUBLICATION %s ADD TABLE %s",
				pubName, t, sql.Ident(pubName), t.Quoted())
		}
	}
	return nil
}

// checkpointTopic: the checkpoint topic of exactly-once delivery, before
// the slot.
func (s *setupRun) checkpointTopic(ctx context.Context) error {
	cfg := s.cfg
	if !cfg.ExactlyOnce {
		return nil
	}
	switch created, err := cfg.Topics.CreateCompactedTopic(ctx, cfg.CheckpointTopic); {
	case err != nil:
		s.problem("kafka checkpoint topic %s: %v; create it (one partition, cleanup.policy=compact), or set kafka.checkpoint_topic to one that exists", cfg.CheckpointTopic, cfg.scrub(err))
	case created:
		s.say("kafka checkpoint topic %s: created (one partition, cleanup.policy=compact)", cfg.CheckpointTopic)
	default:
		s.say("kafka checkpoint topic %s: already exists", cfg.CheckpointTopic)
	}
	return nil
}

// slot creates the pgoutput slot, last and only when nothing before it
// found a problem, or checks the one that exists.
func (s *setupRun) slot(ctx context.Context) error {
	cfg, conn := s.cfg, s.conn
	slotName := cfg.Slot
	sl, err := readSlot(ctx, conn, slotName)
	if err != nil {
		return err
	}
	if cfg.Failover {
		p, err := failoverProblem(ctx, conn, cfg)
		if err != nil {
			return err
		}
		if p != "" {
			s.problem("slot %s: %s", slotName, p)
		}
	}
	switch {
	case sl.Exists:
		return s.existingSlot(ctx, sl)
	case s.problems > 0:
		// A slot holds WAL back from the moment it exists: not before the
		// relay can use it.
		s.problem("slot %s: not created until the problems above are fixed", slotName)
	default:
		how := "pgoutput"
		if cfg.Failover {
			how = "pgoutput, failover"
		}
		if err := pgslot.Create(ctx, conn, slotName, cfg.Failover); err != nil {
			return fmt.Errorf("create slot %s: %w", slotName, err)
		}
		sl, err := readSlot(ctx, conn, slotName)
		if err != nil {
			return err
		}
		s.say("slot %s: created (%s) at %s", slotName, how, deref(sl.ConfirmedFlushLSN))
	}
	return nil
}

// existingSlot checks the slot that exists, and with postgres.failover
// makes it a failover slot.
func (s *setupRun) existingSlot(ctx context.Context, sl slotInfo) error {
	cfg, conn := s.cfg, s.conn
	slotName := cfg.Slot
	if p := sl.problem(slotName); p != "" {
		s.problem("slot %s: already exists but %s", slotName, p)
		return nil
	}
	s.say("slot %s: already exists (pgoutput)", slotName)
	if cfg.Failover && s.problems == 0 {
		if err := setupFailover(ctx, cfg, conn, slotName, s.say, s.problem); err != nil {
			return err
		}
	}
	// An existing slot and a publication created (now or earlier) after
	// its position: each looks fine, together they fail every start.
	if s.pub.Exists || s.oid != 0 {
		p, err := publicationAtSlot(ctx, conn, cfg.Publication, sl)
		if err != nil {
			return err
		}
		if p != "" {
			s.problem("slot %s: %s", slotName, p)
		}
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
	slotStmt, slotNote := sql.CreateSlotIfMissing(cfg.Slot, cfg.Failover), ""
	if cfg.Failover {
		// postgres.failover: a failover slot (Postgres 17+).
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
