package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/replay"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/sql"
)

func newReplayCmd(wrap wrapFunc) *cobra.Command {
	var (
		id, from, to, fromLSN, fromEvent, topic, orderBy, table string
		aggTypes, aggIDs                                        []string
		rate                                                    float64
		batch                                                   int
		dryRun                                                  bool
	)
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"}, // --dry-run needs none
		Use:         "replay [--id ID] [--table TABLE] [--from TIME | --from-lsn LSN | --from-event ID] [--to TIME] [--aggregate-type T]... [--aggregate-id ID]... [--topic T] [--order-by COLUMN] [--rate N] [--dry-run]",
		Short:       "Re-deliver events still in the outbox table, marked as a replay",
		Long: `replay reads rows still in the outbox table and sends them again, routed as the
relay routes them (or all to --topic), each with the header replay_id=<run id>.
It runs beside a live relay without touching its slot or checkpoint.

The selection: rows inserted before the run first started (rows inserted later
are the live relay's), from --from (created_at, the inserting transaction's
start: RFC 3339, "2006-01-02 15:04:05" in UTC, or a duration ago such as 24h),
--from-lsn (a checkpoint the relay saved, mapped to transactions with the
checkpoint history), or --from-event (that event and every one after it), until
--to, of the --aggregate-type and --aggregate-id given (repeatable).

Order: per aggregate, the table's order: --order-by COLUMN (an identity or
bigserial column: insert order) or, without it, created_at then ctid (see
"Replaying events" in docs/retention-and-replay.md). Rows are read in pages (--batch); the position is
saved after each page Kafka acknowledged: run again with the same --id to
continue a run that was stopped or failed. --dry-run prints how many events and
bytes would go and sends nothing. --rate limits events per second. With several
outbox tables (outbox.tables), --table names the one to replay (default
outbox.table), routed by its own settings.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			sel := replay.Selection{FromEvent: fromEvent, AggregateTypes: aggTypes, AggregateIDs: aggIDs}
			starts := 0
			for _, s := range []string{from, fromLSN, fromEvent} {
				if s != "" {
					starts++
				}
			}
			if starts > 1 {
				return usageErrorf("--from, --from-lsn and --from-event: give one start")
			}
			var err error
			if from != "" {
				if sel.From, err = parseWhen(from, time.Now()); err != nil {
					return usageErrorf("--from: %v", err)
				}
			}
			if to != "" {
				if sel.To, err = parseWhen(to, time.Now()); err != nil {
					return usageErrorf("--to: %v", err)
				}
			}
			if fromLSN != "" {
				if sel.FromLSN, err = parseLSN(fromLSN); err != nil {
					return usageErrorf("--from-lsn: %v", err)
				}
			}
			if rate < 0 || batch < 0 {
				return usageErrorf("--rate and --batch must not be negative")
			}
			if !dryRun && len(e.cfg.Sink.Brokers) == 0 {
				return usageErrorf("kafka.brokers: empty; a replay sends to Kafka (set it, or use --dry-run)")
			}
			if id == "" {
				b := make([]byte, 4)
				_, _ = rand.Read(b)
				id = "replay-" + time.Now().UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b)
			}
			return runReplay(cmd.Context(), e, cmd.ErrOrStderr(), replayArgs{id: id, sel: sel, topic: topic, orderBy: orderBy, table: table,
				rate: rate, batch: batch, dryRun: dryRun})
		}),
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "", "the run's id: the same id resumes a stopped run (default: a new id, printed)")
	f.StringVar(&table, "table", "", "the outbox table to replay: outbox.table (the default) or one of outbox.tables")
	f.StringVar(&from, "from", "", "rows whose created_at is at or after this time (RFC 3339, \"2006-01-02 15:04:05\" UTC, or a duration ago like 24h or 7d)")
	f.StringVar(&fromLSN, "from-lsn", "", "rows of transactions committed after this checkpoint LSN (with the checkpoint history)")
	f.StringVar(&fromEvent, "from-event", "", "the row with this event id, and every row after it")
	f.StringVar(&to, "to", "", "rows whose created_at is before this time (default: when the run first started)")
	f.StringSliceVar(&aggTypes, "aggregate-type", nil, "only these aggregate types (repeatable, or comma-separated)")
	f.StringSliceVar(&aggIDs, "aggregate-id", nil, "only these aggregate ids (repeatable, or comma-separated)")
	f.StringVar(&topic, "topic", "", "send every event to this topic instead of the routed one")
	f.StringVar(&orderBy, "order-by", "", "a unique NOT NULL column giving insert order (identity, bigserial); default created_at, then ctid")
	f.Float64Var(&rate, "rate", 0, "at most this many events per second (0: no limit)")
	f.IntVar(&batch, "batch", replay.DefaultBatchSize, "rows per page: read, sent and acknowledged at a time (with --rate, at most one second's worth)")
	f.BoolVar(&dryRun, "dry-run", false, "print how many events and bytes would go, send nothing")
	return cmd
}

type replayArgs struct {
	id, table      string
	sel            replay.Selection
	topic, orderBy string
	rate           float64
	batch          int
	dryRun         bool
}

// parseWhen reads a time: RFC 3339, a UTC date-time, a date, or a duration
// before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if d, err := parseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: a duration ago must be positive", s)
		}
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q is not a time: write 2026-11-21T09:00:00Z, \"2026-11-21 09:00:00\" (UTC), 2026-11-21, or a duration ago such as 24h or 7d", s)
}

func runReplay(ctx context.Context, e *env, stderr io.Writer, a replayArgs) error {
	// SIGINT/SIGTERM stop the run after the page in flight: it saves its
	// position and says how to resume.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := e.cfg
	pool, err := sqlconn.NewPool(ctx, c.Replication.DSN)
	if err != nil {
		return fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	defer pool.Close()
	name, rc := c.Table, c.routerConfig()
	if a.table != "" {
		want := a.table
		if !strings.Contains(want, ".") {
			want = "public." + want
		}
		found := want == c.Table
		for _, t := range c.Tables {
			if t.Table == want {
				name, rc, found = t.Table, t.Router, true
			}
		}
		if !found {
			return usageErrorf("--table %s: not an outbox table of the configuration (outbox.table, outbox.tables)", a.table)
		}
	}
	outbox, _ := sql.ParseTable(name)
	checkpoint, _ := sql.ParseTable(c.CheckpointTable)
	var s replay.Sink = dryRunSink{}
	if !a.dryRun {
		ks, closeSinks, err := newSinks(c.sinkConfig(e.log), 1)
		if err != nil {
			return err
		}
		defer closeSinks()
		s = ks[0]
	}
	progress := newProgressWriter(stderr, e, a.id)
	r, err := replay.New(ctx, pool, s, replay.Config{
		ID: a.id, Selection: a.sel, Topic: a.topic, OrderBy: a.orderBy, Rate: a.rate, BatchSize: a.batch,
		MarkAtLeastOnce: c.Delivery == relay.DeliveryExactlyOnce,
		Outbox:          outbox, Columns: sql.Columns(rc.Columns), Router: rc,
		CheckpointTable: checkpoint, Slot: c.Replication.Slot, Log: e.log, Progress: progress.update,
	})
	if err != nil {
		return err
	}
	if r.Finished() {
		fmt.Fprintf(stderr, "replay %s already finished; nothing to do (start a new run with another --id)\n", a.id)
		return nil
	}
	plan, err := r.Plan(ctx)
	if err != nil {
		return err
	}
	resumed, sent := r.Resumed()
	if plan.Note != "" {
		fmt.Fprintln(stderr, ops.Printable(plan.Note))
	}
	if a.dryRun {
		fmt.Fprintf(e.stdout, "replay %s would send %d events, %s of payload (created_at %s)\n",
			a.id, plan.Events, ops.Bytes(plan.Bytes), window(plan))
		return pruned(plan, plan.Events)
	}
	if resumed {
		fmt.Fprintf(stderr, "replay %s: resuming after %d events sent; %d to go\n", a.id, sent, plan.Events)
	} else {
		fmt.Fprintf(stderr, "replay %s: %d events, %s of payload (created_at %s); stop it with ^C and resume with --id %s\n",
			a.id, plan.Events, ops.Bytes(plan.Bytes), window(plan), a.id)
	}
	if err := r.Run(ctx); err != nil {
		progress.finish()
		return err
	}
	progress.finish()
	fmt.Fprintf(e.stdout, "replay %s done: %d events sent, each with header %s=%s\n", a.id, progress.last.Sent, replay.HeaderReplayID, a.id)
	return pruned(plan, progress.last.Sent)
}

// pruned is the plan's *replay.PrunedError with the rows found, nil when
// retention left the range whole.
func pruned(plan replay.Plan, found int64) error {
	if plan.Pruned == nil {
		return nil
	}
	pe := *plan.Pruned
	pe.Found = found
	return &pe
}

func window(p replay.Plan) string {
	from := "any time"
	if !p.From.IsZero() {
		from = p.From.UTC().Format(time.RFC3339)
	}
	return from + " to before " + p.To.UTC().Format(time.RFC3339)
}

// dryRunSink is never written to: --dry-run stops after the plan.
type dryRunSink struct{}

func (dryRunSink) Write(context.Context, []event.Event) error {
	return fmt.Errorf("dry run: nothing is sent")
}

// progressWriter draws a progress bar with rate and ETA on a terminal, and
// logs a line every 10 s otherwise.
type progressWriter struct {
	w        io.Writer
	e        *env
	id       string
	tty      bool
	last     replay.Progress
	logged   *int64 // Sent of the last line logged (not on a terminal)
	lastLine time.Time
	drawn    bool
}

func newProgressWriter(w io.Writer, e *env, id string) *progressWriter {
	p := &progressWriter{w: w, e: e, id: id}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

func (p *progressWriter) update(pr replay.Progress) {
	p.last = pr
	elapsed := time.Since(pr.Started)
	rate := 0.0
	if elapsed > 0 {
		rate = float64(pr.SentThisRun) / elapsed.Seconds()
	}
	eta := "?"
	if rate > 0 && pr.Total >= pr.Sent {
		eta = (time.Duration(float64(pr.Total-pr.Sent)/rate) * time.Second).Round(time.Second).String()
	}
	if p.tty {
		// A page can take a millisecond: redraw at most five times a second.
		if !pr.Done && time.Since(p.lastLine) < 200*time.Millisecond {
			return
		}
		p.lastLine = time.Now()
		const width = 30
		frac := 1.0
		if pr.Total > 0 {
			frac = min(float64(pr.Sent)/float64(pr.Total), 1)
		}
		filled := int(frac * width)
		bar := strings.Repeat("#", filled) + strings.Repeat(".", width-filled)
		fmt.Fprintf(p.w, "\r[%s] %3.0f%% %d/%d events  %.0f ev/s  ETA %s   ", bar, frac*100, pr.Sent, pr.Total, rate, eta)
		p.drawn = true
		return
	}
	// The last page's line already said what Done would say again.
	if time.Since(p.lastLine) >= 10*time.Second || pr.Done && (p.logged == nil || *p.logged != pr.Sent) {
		p.lastLine = time.Now()
		sent := pr.Sent
		p.logged = &sent
		p.e.log.Info("replay progress", "id", p.id, "sent", pr.Sent, "total", pr.Total, "skipped", pr.Skipped,
			"events_per_second", int64(rate), "eta", eta)
	}
}

func (p *progressWriter) finish() {
	if p.drawn {
		fmt.Fprintln(p.w)
	}
}
