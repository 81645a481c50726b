package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

// The tables workload (issue 26): -tables outbox tables and one backlog
// spread over them, read by one relay on one slot (outbox.tables) and by as
// many relays as tables, each on a slot and a publication of its own, over
// the same WAL (every slot exists before the backlog). One slot decodes the
// WAL once; N slots decode it N times, each walsender reading every table's
// changes to filter out the others'. Measured for each side: the time until
// every event is in Kafka and every slot confirmed its table's last commit,
// the relay processes' CPU (summed) and peak RSS (summed for the N).

// TablesRun is one run of the tables workload.
type TablesRun struct {
	Run      int     `json:"run"`
	Tables   int     `json:"tables"`
	PerTxn   int     `json:"per_txn"`
	Events   int64   `json:"events"`
	WALBytes int64   `json:"wal_bytes"`
	OneFirst bool    `json:"one_first"`
	One      SideRun `json:"one_relay"`   // one relay, one slot, every table
	Many     SideRun `json:"many_relays"` // a relay and a slot per table
	Err      string  `json:"error,omitempty"`
}

// SideRun is one side of the tables workload.
type SideRun struct {
	Sec    float64 `json:"seconds"`     // start → every event in Kafka and every slot confirmed
	CPUSec float64 `json:"cpu_seconds"` // the relay processes', summed
	// WalsenderCPUSec is the CPU of the slots' walsenders (Postgres
	// decoding the WAL for them), summed, read from /proc when drained.
	WalsenderCPUSec float64 `json:"walsender_cpu_seconds"`
	PeakRSS         int64   `json:"peak_rss_bytes"` // VmHWM, summed over the processes
	Records         int64   `json:"kafka_records"`  // more than Events means duplicates
}

// Rate is the side's events/s; zero when it did not finish.
func (s SideRun) Rate(events int64) float64 { return perSec(float64(events), s.Sec) }

// tablesNames are the workload's tables, publications and slots in db.
type tablesNames struct {
	tables, pubs, slots []string // per table: its own publication and slot
	allPub, allSlot     string   // every table's
}

func namesFor(db *benchDB, n int) tablesNames {
	nm := tablesNames{allPub: db.Name + "_pub_all", allSlot: db.Name + "_one"}
	for i := 1; i <= n; i++ {
		nm.tables = append(nm.tables, fmt.Sprintf("outbox_%d", i))
		nm.pubs = append(nm.pubs, fmt.Sprintf("%s_pub_%d", db.Name, i))
		nm.slots = append(nm.slots, fmt.Sprintf("%s_t%d", db.Name, i))
	}
	return nm
}

// tablesWorkload runs the tables workload once, in a database of its own.
func (b *bench) tablesWorkload(ctx context.Context, run int) (t TablesRun, err error) {
	per := b.o.DrainPerTxn[0]
	t = TablesRun{Run: run, Tables: b.o.Tables, PerTxn: per, OneFirst: run%2 == 1}
	fail := func(err error) (TablesRun, error) { t.Err = err.Error(); return t, err }
	db, err := b.freshDatabase(ctx, fmt.Sprintf("outbox_bench_%s_r%d_t", b.stamp, run))
	if err != nil {
		return fail(err)
	}
	nm := namesFor(db, b.o.Tables)
	db.ExtraSlots = append(append(db.ExtraSlots, nm.allSlot), nm.slots...)
	b.created.addSlots(db.ExtraSlots...)
	defer b.dropDatabase(ctx, db, &err)
	conn, err := pgx.Connect(ctx, db.DSN)
	if err != nil {
		return fail(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := createTablesObjects(ctx, conn, nm); err != nil {
		return fail(err)
	}
	prefix := fmt.Sprintf("b%sr%dt_", b.stamp, run)
	oneTopics, manyTopics := make([]string, len(nm.tables)), make([]string, len(nm.tables))
	for i := range nm.tables {
		oneTopics[i], manyTopics[i] = fmt.Sprintf("%sone_%d", prefix, i+1), fmt.Sprintf("%smany_%d", prefix, i+1)
	}
	client := b.kafka()
	topics := append(append([]string{}, oneTopics...), manyTopics...)
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(err)
	}
	defer b.deleteTopics(ctx, client, topics)

	// The backlog: transactions of per events, table after table in turn,
	// then one last transaction per table, whose commit each slot must pass.
	var start string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&start); err != nil {
		return fail(err)
	}
	txns := max(b.o.Events/per, len(nm.tables))
	b.log.Info("inserting the tables backlog", "run", run, "tables", len(nm.tables), "events", txns*per, "per_txn", per)
	if _, err := conn.Exec(ctx, tablesBacklogProc); err != nil {
		return fail(fmt.Errorf("create backlog procedure: %w", err))
	}
	if _, err := conn.Exec(ctx, "CALL public.outbox_bench_tables($1, $2, $3, $4)", nm.tables, per, txns-len(nm.tables), b.o.PayloadBytes); err != nil {
		return fail(fmt.Errorf("insert backlog: %w", err))
	}
	lastBefore := make([]pglogrepl.LSN, len(nm.tables))
	for i := range nm.tables {
		if lastBefore[i], err = lastTableTxn(ctx, conn, nm.tables[i], per, b.o.PayloadBytes); err != nil {
			return fail(err)
		}
	}
	var end string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&end); err != nil {
		return fail(err)
	}
	t.Events = int64(txns * per)
	s0, _ := pglogrepl.ParseLSN(start)
	e0, _ := pglogrepl.ParseLSN(end)
	t.WALBytes = int64(e0 - s0)

	one := func() error {
		var err error
		t.One, err = b.tablesSide(ctx, db, fmt.Sprintf("one-run%d", run), []relaySpec{b.oneRelay(db, nm, oneTopics)},
			[]string{nm.allSlot}, []pglogrepl.LSN{maxLSN(lastBefore)}, oneTopics, t.Events)
		return err
	}
	many := func() error {
		var err error
		t.Many, err = b.tablesSide(ctx, db, fmt.Sprintf("many-run%d", run), b.manyRelays(db, nm, manyTopics),
			nm.slots, lastBefore, manyTopics, t.Events)
		return err
	}
	order := []func() error{one, many}
	if !t.OneFirst {
		order = []func() error{many, one}
	}
	if err := inTurn(ctx, order); err != nil {
		return fail(err)
	}
	b.log.Info("tables drained", "run", run, "tables", len(nm.tables),
		"one_relay_events_per_s", int(t.One.Rate(t.Events)), "many_relays_events_per_s", int(t.Many.Rate(t.Events)),
		"one_relay_cpu_s", t.One.CPUSec, "many_relays_cpu_s", t.Many.CPUSec)
	return t, nil
}

func maxLSN(ls []pglogrepl.LSN) pglogrepl.LSN {
	var m pglogrepl.LSN
	for _, l := range ls {
		m = max(m, l)
	}
	return m
}

// createTablesObjects creates the tables, a publication of each and one of
// all, and every slot, before the backlog.
func createTablesObjects(ctx context.Context, conn *pgx.Conn, nm tablesNames) error {
	// The relay's own tables, as setup makes them (setup would also make
	// the outbox, publication and slot of the drains).
	relayTables := append([]string{outboxsql.CheckpointTable(outboxsql.Table{Schema: "public", Name: outboxsql.DefaultCheckpointTable})},
		outboxsql.CheckpointHistoryTable(outboxsql.Table{Schema: "public", Name: outboxsql.DefaultCheckpointTable})...)
	relayTables = append(relayTables, outboxsql.RetryTable(outboxsql.Table{Schema: "public", Name: outboxsql.DefaultRetryTable})...)
	for _, stmt := range relayTables {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create the relay's tables: %w", err)
		}
	}
	var all []outboxsql.Table
	for i, name := range nm.tables {
		t := outboxsql.Table{Schema: "public", Name: name}
		for _, stmt := range outboxsql.OutboxTable(t, outboxsql.Columns{}, outboxsql.LayoutRelay) {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("create %s: %w", name, err)
			}
		}
		if _, err := conn.Exec(ctx, outboxsql.CreatePublication(nm.pubs[i], t)); err != nil {
			return fmt.Errorf("create publication %s: %w", nm.pubs[i], err)
		}
		all = append(all, t)
	}
	if _, err := conn.Exec(ctx, outboxsql.CreatePublication(nm.allPub, all[0], all[1:]...)); err != nil {
		return fmt.Errorf("create publication %s: %w", nm.allPub, err)
	}
	for _, slot := range append([]string{nm.allSlot}, nm.slots...) {
		if _, err := conn.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			return fmt.Errorf("create slot %s: %w", slot, err)
		}
	}
	return nil
}

// tablesBacklogProc commits txns transactions of per events, transaction i
// into table i mod the number of tables.
const tablesBacklogProc = `CREATE OR REPLACE PROCEDURE public.outbox_bench_tables(tables text[], per int, txns int, pad int)
LANGUAGE plpgsql AS $$
BEGIN
	FOR i IN 0 .. txns - 1 LOOP
		EXECUTE format('INSERT INTO public.%I (id, aggregate_type, aggregate_id, event_type, payload)
			SELECT gen_random_uuid(), ''order'', ''agg-'' || (g %% 1000), ''created'',
				jsonb_build_object(''txn'', $1, ''seq'', g, ''pad'', repeat(''x'', $2))
			FROM generate_series(0, $3 - 1) AS g', tables[(i % array_length(tables, 1)) + 1])
		USING i, pad, per;
		COMMIT;
	END LOOP;
END $$`

// lastTableTxn commits one more transaction into table and returns the WAL
// insert position before its commit: its slot is drained past it.
func lastTableTxn(ctx context.Context, conn *pgx.Conn, table string, per, pad int) (pglogrepl.LSN, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO public.%s (id, aggregate_type, aggregate_id, event_type, payload)
		SELECT gen_random_uuid(), 'order', 'agg-' || (g %% 1000), 'created', jsonb_build_object('txn', -1, 'seq', g, 'pad', repeat('x', $1))
		FROM generate_series(0, $2 - 1) AS g`, pgx.Identifier{table}.Sanitize()), pad, per); err != nil {
		return 0, fmt.Errorf("last transaction of %s: %w", table, err)
	}
	var s string
	if err := tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	return pglogrepl.ParseLSN(s)
}

// A relaySpec is one relay process of a side: its environment and config file.
type relaySpec struct {
	env    []string
	config string // YAML, "" for none
}

// oneRelay is the relay that reads every table on one slot.
func (b *bench) oneRelay(db *benchDB, nm tablesNames, topics []string) relaySpec {
	var cfg strings.Builder
	fmt.Fprintf(&cfg, "outbox:\n  table: public.%s\n  tables:\n", nm.tables[0])
	for i := 1; i < len(nm.tables); i++ {
		fmt.Fprintf(&cfg, "    - table: public.%s\n      topics:\n        template: %s\n", nm.tables[i], topics[i])
	}
	fmt.Fprintf(&cfg, "topics:\n  template: %s\n", topics[0])
	return relaySpec{env: b.tablesEnv(db, nm.allSlot, nm.allPub, ""), config: cfg.String()}
}

// manyRelays are a relay per table, each on its own slot and publication.
func (b *bench) manyRelays(db *benchDB, nm tablesNames, topics []string) []relaySpec {
	var out []relaySpec
	for i := range nm.tables {
		env := b.tablesEnv(db, nm.slots[i], nm.pubs[i], "public."+nm.tables[i])
		env = append(env, "RELAY_TOPICS_TEMPLATE="+topics[i])
		out = append(out, relaySpec{env: env})
	}
	return out
}

// tablesEnv is relayEnv with the slot, publication and table of one relay of
// the workload; N relays on one machine each get their own metrics port
// (none).
func (b *bench) tablesEnv(db *benchDB, slot, pub, table string) []string {
	var env []string
	for _, kv := range b.relayEnv(db) {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "RELAY_POSTGRES_SLOT", "RELAY_POSTGRES_PUBLICATION", "RELAY_OUTBOX_TABLE", "RELAY_TOPICS_TEMPLATE":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "RELAY_POSTGRES_SLOT="+slot, "RELAY_POSTGRES_PUBLICATION="+pub)
	if table != "" {
		env = append(env, "RELAY_OUTBOX_TABLE="+table)
	}
	return env
}

// tablesSide starts the relays of one side together and measures until
// every event is in topics and every slot confirmed past its table's last
// commit (lastBefore, as slots); then stops them with SIGTERM.
func (b *bench) tablesSide(ctx context.Context, db *benchDB, label string, specs []relaySpec, slots []string,
	lastBefore []pglogrepl.LSN, topics []string, events int64) (SideRun, error) {
	var s SideRun
	conn, err := pgx.Connect(ctx, db.AdminDSN)
	if err != nil {
		return s, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop(30 * time.Second) // on the error paths
		}
	}()
	began := time.Now()
	for i, spec := range specs {
		args := []string{"run"}
		if spec.config != "" {
			path := filepath.Join(b.dir, fmt.Sprintf("relay-tables-%s.yaml", label))
			if err := os.WriteFile(path, []byte(spec.config), 0o644); err != nil {
				return s, err
			}
			args = append(args, "--config", path)
		}
		log := filepath.Join(b.dir, fmt.Sprintf("relay-tables-%s-%d.log", label, i+1))
		p, err := startProc(b.o.RelayBin, args, b.profiled(spec.env, log), log)
		if err != nil {
			return s, fmt.Errorf("relay %s %d: %w", label, i+1, err)
		}
		procs = append(procs, p)
	}
	client := b.kafka()
	confirmed := make([]bool, len(slots))
	var kafkaDone bool
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var doneAt time.Time
	for i := 0; doneAt.IsZero(); i++ {
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-deadline:
			return s, fmt.Errorf("%s: not drained after %s (kafka %v, slots confirmed %v)", label, b.o.Timeout, kafkaDone, confirmed)
		case <-tick.C:
		}
		for j, p := range procs {
			if p.exited() {
				return s, fmt.Errorf("%s: relay %d exited while draining: %s: %s", label, j+1, p.exitErr(), p.logTail(10))
			}
		}
		all := true
		for j, slot := range slots {
			if !confirmed[j] {
				lsn, err := confirmedFlushLSN(ctx, conn, slot)
				if err != nil {
					return s, err
				}
				confirmed[j] = lsn > lastBefore[j]
			}
			all = all && confirmed[j]
		}
		if !kafkaDone && i%3 == 0 {
			n, err := endOffsets(ctx, client, topics)
			if err != nil {
				return s, err
			}
			kafkaDone = n >= events
		}
		if all && kafkaDone {
			doneAt = time.Now()
		}
	}
	s.Sec = doneAt.Sub(began).Seconds()
	// The walsenders run as long as their relay: what they used so far is
	// the decoding of this side's WAL (Postgres is on this machine).
	var pids []int32
	rows, err := conn.Query(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = ANY($1) AND active_pid IS NOT NULL", slots)
	if err == nil {
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int32])
	}
	if err != nil {
		return s, fmt.Errorf("walsenders of %s: %w", label, err)
	}
	for _, pid := range pids {
		if c, err := pidCPU(int(pid)); err == nil {
			s.WalsenderCPUSec += c.Seconds()
		}
	}
	for _, p := range procs {
		rss, rssErr := p.peakRSS()
		u := p.stop(30 * time.Second)
		if rssErr != nil {
			rss = u.MaxRSS
		}
		s.CPUSec += u.CPU.Seconds()
		s.PeakRSS += rss
	}
	procs = nil
	if s.Records, err = endOffsets(ctx, client, topics); err != nil {
		return s, err
	}
	// The slots have served their purpose: drop them now rather than let
	// them retain WAL through the other side's turn.
	for _, slot := range slots {
		if err := b.dropSlot(ctx, db, slot); err != nil {
			return s, err
		}
	}
	return s, nil
}
