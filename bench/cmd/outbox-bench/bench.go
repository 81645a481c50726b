package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// bench runs the phases of one invocation and collects them into rep.
type bench struct {
	o       options
	dir     string
	stamp   string // lower-case, unique per invocation: part of every name created
	log     *slog.Logger
	rep     *Report
	created *created
}

// debezium reports whether Debezium runs as a peer (-peers debezium).
func (b *bench) debezium() bool { return slices.Contains(b.o.Peers, "debezium") }

// cleanupTimeout bounds cleanup, which runs on a context that is not
// cancelled by Ctrl-C: the point of cleanup is to run after it.
const cleanupTimeout = 60 * time.Second

func (b *bench) kafka() *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(b.o.Brokers...), Timeout: 10 * time.Second}
}

// runOnce runs every workload once, each in a fresh database of its own (the
// outbox, the publications and slots it needs), dropped when it is done.
func (b *bench) runOnce(ctx context.Context, run int) error {
	var errs []error
	for _, per := range b.o.DrainPerTxn {
		if b.o.SkipDrain || ctx.Err() != nil {
			break
		}
		d, err := b.drainWorkload(ctx, run, per)
		b.rep.Drain = append(b.rep.Drain, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("drain %d per txn: %w", per, err))
		}
	}
	if !b.o.SkipDrain && b.o.Tables > 1 && ctx.Err() == nil {
		t, err := b.tablesWorkload(ctx, run)
		b.rep.Tables = append(b.rep.Tables, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("tables: %w", err))
		}
	}
	for _, per := range b.o.SustainedPerTxn {
		if b.o.SkipSustained || ctx.Err() != nil {
			break
		}
		if err := b.sustainedWorkload(ctx, run, workload{Per: per}); err != nil {
			errs = append(errs, fmt.Errorf("sustained %d per txn: %w", per, err))
		}
	}
	if !b.o.SkipSustained && b.o.HighRate > 0 && ctx.Err() == nil {
		if err := b.sustainedWorkload(ctx, run, workload{Per: highRatePerTxn, Rate: b.o.HighRate}); err != nil {
			errs = append(errs, fmt.Errorf("sustained %d per txn at %d events/s: %w", highRatePerTxn, b.o.HighRate, err))
		}
	}
	return errors.Join(errs...)
}

// inTurn runs the sides of a workload one after the other, each even when
// an earlier one failed, until ctx is done; it returns every failure.
func inTurn(ctx context.Context, sides []func() error) error {
	var errs []error
	for _, f := range sides {
		if ctx.Err() != nil {
			break
		}
		if err := f(); err != nil {
			errs = append(errs, err)
		}
	}
	if ctx.Err() != nil {
		errs = append(errs, ctx.Err())
	}
	return errors.Join(errs...)
}

// workloadDB creates a fresh database, outbox_bench_<stamp>_<label>, with the
// relay's objects (by `outbox-relay setup`), Debezium's publication when it
// runs, and for a drain the slots of pg_recvlogical and Debezium: they exist
// before the backlog, so all read the same WAL.
func (b *bench) workloadDB(ctx context.Context, label string, drain bool) (*benchDB, error) {
	db, err := b.freshDatabase(ctx, fmt.Sprintf("outbox_bench_%s_%s", b.stamp, label))
	if err != nil {
		return nil, err
	}
	if err := b.relaySetup(ctx, db, label); err != nil {
		// The bench's own DDL below still lets the other systems run.
		b.log.Warn("outbox-relay setup failed; creating the objects without it", "err", err)
	}
	pubs, slots := []string{db.Publication}, []string{db.RelaySlot}
	if drain {
		slots = append(slots, db.RecvSlot)
		if b.o.ExactlyOnce {
			slots = append(slots, db.EOSSlot)
		}
	}
	if b.debezium() {
		pubs = append(pubs, db.DbzPublication)
		if drain {
			slots = append(slots, db.DbzSlot)
		}
	}
	if err := db.ensureObjects(ctx, pubs, slots); err != nil {
		var derr error
		b.dropDatabase(ctx, db, &derr)
		return nil, errors.Join(err, derr)
	}
	return db, nil
}

// relayEnv is the environment of the relay: the caller's, with the relay's
// connection settings replaced by the bench database's.
func (b *bench) relayEnv(db *benchDB) []string {
	set := map[string]string{
		"RELAY_POSTGRES_DSN":         db.DSN,
		"RELAY_KAFKA_BROKERS":        strings.Join(b.o.Brokers, ","),
		"RELAY_POSTGRES_SLOT":        db.RelaySlot,
		"RELAY_POSTGRES_PUBLICATION": db.Publication,
		"RELAY_OUTBOX_TABLE":         "public.outbox",
		"RELAY_METRICS_LISTEN":       "",
		"RELAY_LOG_FORMAT":           "json",
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ours := set[k]; !ours {
			env = append(env, kv)
		}
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	return env
}

func (b *bench) relaySetup(ctx context.Context, db *benchDB, label string) error {
	p, err := startProc(b.o.RelayBin, []string{"setup", "--create-outbox-table"}, b.relayEnv(db),
		filepath.Join(b.dir, "relay-setup-"+label+".log"))
	if err != nil {
		return err
	}
	u, err := p.wait(ctx, time.Minute)
	if err != nil {
		p.stop(5 * time.Second)
		return fmt.Errorf("setup: %w", err)
	}
	if u.ExitError != "" {
		return fmt.Errorf("setup: %s: %s", u.ExitError, p.logTail(5))
	}
	return nil
}

// createTopics creates the topics and records them for the left-behind check.
func (b *bench) createTopics(ctx context.Context, client *kafka.Client, topics []string) error {
	b.created.addTopics(topics...)
	return createTopics(ctx, client, topics)
}

func (b *bench) deleteTopics(ctx context.Context, client *kafka.Client, topics []string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if err := deleteTopics(cctx, client, topics); err != nil {
		b.log.Warn("delete topics", "err", err)
	}
}

// countable is a consumer's tally of the events it has seen.
type countable interface{ count() int64 }

// A watched process is one whose early exit ends a wait.
type watched interface {
	exited() bool
	exitErr() string
	logTail(n int) string
}

// waitCount waits until the consumer has seen n events, polling every
// 20ms, and fails early when the process delivering them exits.
func waitCount(ctx context.Context, seen countable, n int64, timeout time.Duration, p watched) error {
	deadline := time.Now().Add(timeout)
	for seen.count() < n {
		if p.exited() {
			return fmt.Errorf("exited: %s: %s", p.exitErr(), p.logTail(10))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer saw %d of %d events after %s", seen.count(), n, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// freshDatabase creates a throwaway database, recorded so that the end of the
// bench can warn if it is left behind.
func (b *bench) freshDatabase(ctx context.Context, name string) (*benchDB, error) {
	db, err := createDatabase(ctx, b.o.PostgresDSN, b.o.CleanupDSN, name)
	if err != nil {
		return nil, err
	}
	b.created.addDB(db.Name)
	b.created.addSlots(db.slots()...)
	return db, nil
}

// dropDatabase drops db, even after ctx is cancelled, adding a failure to *err.
func (b *bench) dropDatabase(ctx context.Context, db *benchDB, err *error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if derr := db.drop(cctx); derr != nil {
		*err = errors.Join(*err, fmt.Errorf("clean up: %w", derr))
	}
}
