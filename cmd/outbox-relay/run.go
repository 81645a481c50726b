package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	"github.com/outbox-relay/outbox-relay/internal/tracing"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

func newRunCmd(wrap wrapFunc) *cobra.Command {
	var (
		startLSN string
		force    bool
	)
	cmd := &cobra.Command{
		Use:   "run [--start-lsn X/Y [--force]]",
		Short: "Stream outbox inserts to Kafka until SIGTERM or SIGINT",
		Long: `run streams until it receives SIGTERM or SIGINT, then stops reading, waits up to
pipeline.shutdown_timeout for Kafka to acknowledge what is in flight, saves the
checkpoint and exits 0. A second signal exits at once, 1 (nothing is lost: what
was not confirmed is delivered again on the next start), as does a drain that
outlasts pipeline.shutdown_timeout (Kafka unreachable, say).

A slot gap (postgres.on_slot_loss: fail), a stop before an insert the relay
cannot deliver or a pgoutput message it cannot decode keeps run up not ready
(/readyz 503, the metrics scraped) for health.stop_linger, then it exits 4
(gap) or 1; SIGTERM meanwhile exits at once with that code. Exit codes: docs/commands.md#exit-codes.

With delivery: exactly-once, a Postgres transaction that takes longer to write than
kafka.transaction_timeout is aborted by the broker: run reports it (/readyz, the
stall metrics, the log), writes it again once with the timeout raised to the broker's
transaction.max.timeout.ms, and exits 6 with the fix when it cannot, or when stopped
while writing it again (docs/guarantees.md#exactly-once).

--start-lsn X/Y starts at that WAL position instead of the saved checkpoint: a
forward skip, for an operator who decided to drop events. Starting behind the
slot's confirmed position is refused, because the server no longer has that WAL.
A position beyond the server's current WAL position (pg_current_wal_lsn()) is
refused too, unless --force is given: every event committed until the WAL
reaches that position would be skipped for good.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			rc := e.cfg.relayConfig(e.log)
			if force && startLSN == "" {
				return usageErrorf("--force only applies to --start-lsn; give the position to start at")
			}
			if startLSN != "" {
				lsn, err := parseLSN(startLSN)
				if err != nil {
					return usageErrorf("--start-lsn: %w", err)
				}
				if err := checkStartLSN(cmd.Context(), e, lsn, force); err != nil {
					return err
				}
				rc.StartLSN = lsn
				rc.StartLSNForce = force
			}
			shutdownTracing, err := startTracing(cmd.Context(), e, &rc)
			if err != nil {
				return err
			}
			defer shutdownTracing()
			stages, stopProfiles := startProfiles(e.log) // RELAY_CPUPROFILE etc.: profile.go
			defer stopProfiles()
			rc.StageTrace = stages
			r, closeSinks, err := newRelay(rc)
			if err != nil {
				return fmt.Errorf("%w: %w", errConfig, err)
			}
			defer closeSinks()
			setMemoryLimit(e)
			setMaxProcs(e)
			ctx, stop := signalContext(cmd.Context(), e)
			defer stop()
			e.log.Info("starting",
				"version", version,
				"postgres", redactDSN(e.cfg.Replication.DSN),
				"replication_postgres", redactDSN(e.cfg.Replication.ReplicationConnDSN()),
				"slot", e.cfg.Replication.Slot,
				"publication", e.cfg.Replication.Publication,
				"table", e.cfg.Table,
				"brokers", strings.Join(e.cfg.Sink.Brokers, ","),
				"start_lsn", startLSN,
				"force", force)
			err = r.Run(ctx)
			if err == nil || isCanceled(ctx, err) {
				return nil
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&startLSN, "start-lsn", "", "start at this WAL position (X/Y, hex), SKIPPING every event committed before it")
	cmd.Flags().BoolVar(&force, "force", false, "with --start-lsn: accept a position beyond the server's current WAL position. "+
		"DANGER: every event committed until the WAL reaches it is SKIPPED FOR GOOD (never delivered)")
	return cmd
}

// startTracing sets rc.Spans to a tracer exporting to tracing.otlp_endpoint,
// when one is set, and returns what flushes its spans at exit.
func startTracing(ctx context.Context, e *env, rc *relay.Config) (shutdown func(), err error) {
	ep := e.cfg.Tracing.OTLPEndpoint
	if ep == "" {
		return func() {}, nil
	}
	if tracing.GRPCPort(ep) {
		// Not an error: a collector may serve OTLP/HTTP there,
		// and tracing must never stop delivery.
		e.log.Warn("tracing: tracing.otlp_endpoint names port 4317, OTLP/gRPC's; the relay exports over OTLP/HTTP (port 4318 by default), so a gRPC receiver there will refuse its spans", "endpoint", ep)
	}
	tr, err := tracing.New(ctx, tracing.Config{Endpoint: ep, ServiceName: e.cfg.Tracing.ServiceName, Version: version})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	rc.Spans = tr
	return func() {
		// The spans still queued, within a bounded wait: a
		// collector that is down must not hold up the exit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tr.Shutdown(ctx); err != nil {
			e.log.Warn("tracing: spans not exported at shutdown", "endpoint", ep, "err", err)
		}
	}, nil
}

// lsnForm is the accepted spelling of a WAL position, for messages.
const lsnForm = "two hexadecimal numbers of 1 to 8 digits separated by one '/', like 16/B374D848"

// parseLSN reads a WAL position strictly. pglogrepl.ParseLSN uses Sscanf,
// which reads "1/2/3" as 1/2 and ignores trailing garbage: a typo would then
// move the slot to a position nobody asked for.
func parseLSN(s string) (pglogrepl.LSN, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok || !isHex8(hi) || !isHex8(lo) {
		return 0, fmt.Errorf("%q is not a WAL position: want %s", s, lsnForm)
	}
	h, _ := strconv.ParseUint(hi, 16, 32)
	l, _ := strconv.ParseUint(lo, 16, 32)
	return pglogrepl.LSN(h<<32 | l), nil
}

func isHex8(s string) bool {
	if len(s) < 1 || len(s) > 8 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

// checkStartLSN refuses a --start-lsn beyond the server's current WAL position
// before anything starts (the relay checks again when it connects): the slot
// would jump there and every event committed until the WAL reaches it would
// be skipped. When Postgres cannot be asked now, the relay's own check decides.
func checkStartLSN(ctx context.Context, e *env, lsn pglogrepl.LSN, force bool) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := sqlconn.Connect(cctx, e.cfg.Replication.DSN)
	if err != nil {
		err = fmt.Errorf("connect to postgres %s: %w", redactDSN(e.cfg.Replication.DSN), err)
		e.log.Warn("cannot check --start-lsn against the server's WAL position now; the relay checks it when it connects", "error", err)
		return nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var beyond *pgslot.BeyondWALError
	switch err := pgslot.ReachedNow(cctx, conn, lsn); {
	case err == nil:
		return nil
	case !errors.As(err, &beyond):
		e.log.Warn("cannot read the server's WAL position to check --start-lsn; the relay checks it when it connects", "error", err)
		return nil
	case !force:
		return usageErrorf("--start-lsn %v for good; to start from now use --start-lsn %s, "+
			"or add --force if skipping up to %s is really intended", beyond, beyond.Current, lsn)
	}
	cur := beyond.Current
	e.log.Warn("--force: starting beyond the server's current WAL position; every event committed until the WAL reaches it is SKIPPED FOR GOOD",
		"start_lsn", lsn.String(), "current_wal_lsn", cur.String(), "skipped_bytes_at_least", uint64(lsn-cur))
	return nil
}

// signalContext is cancelled by the first SIGTERM or SIGINT; a second one
// exits the process at once, for an operator who will not wait for the drain.
// A repeat within a second is taken as the same request: timeout(1) and some
// supervisors signal both the process and its process group.
// stop releases the signals and waits for the watcher goroutine.
func signalContext(parent context.Context, e *env) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case sig := <-sigs:
			e.log.Info("shutting down: draining in-flight events; send the signal again to exit at once", "signal", sig.String())
			cancel()
		case <-done:
			return
		}
		first := time.Now()
		for {
			select {
			case sig := <-sigs:
				if time.Since(first) < time.Second {
					continue
				}
				e.log.Warn("exiting at once without draining; unconfirmed events will be delivered again on the next start", "signal", sig.String())
				os.Exit(exitcode.Failure)
			case <-done:
				return
			}
		}
	})
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		wg.Wait()
		cancel()
	}
}

// setMaxProcs sets GOMAXPROCS to pipeline.max_procs unless the GOMAXPROCS
// variable is set (the operator's word wins) or the setting is 0 (Go's
// default, one per CPU).
func setMaxProcs(e *env) {
	if os.Getenv("GOMAXPROCS") != "" || e.cfg.MaxProcs == 0 {
		return
	}
	if prev := runtime.GOMAXPROCS(e.cfg.MaxProcs); prev != e.cfg.MaxProcs {
		e.log.Info("GOMAXPROCS set from pipeline.max_procs (the GOMAXPROCS variable overrides it)", "procs", e.cfg.MaxProcs, "cpus", runtime.NumCPU())
	}
}

// setMemoryLimit gives the Go runtime a soft memory limit derived from
// pipeline.max_in_flight_bytes, unless GOMEMLIMIT is set. What the relay holds
// live is bounded by that window; without a limit the garbage collector lets
// the heap grow to twice the live set, which on a backlog is most of the
// process's memory. 32 MiB + 2 x the window leaves the collector room to work
// (64 MiB at the defaults).
func setMemoryLimit(e *env) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := memoryLimit(e.cfg.MaxInFlightBytes)
	debug.SetMemoryLimit(limit)
	e.log.Info("soft memory limit set (GOMEMLIMIT overrides it)", "bytes", limit)
}

// memoryLimit is 32 MiB + 2 x window, saturating at math.MaxInt64 (which
// SetMemoryLimit reads as "no limit") instead of wrapping to a negative
// limit. validate bounds the window far below that; this keeps the
// arithmetic safe on its own.
func memoryLimit(window int) int64 {
	const base = int64(32 << 20)
	w := int64(window)
	if w <= 0 {
		return base
	}
	if w > (math.MaxInt64-base)/2 {
		return math.MaxInt64
	}
	return base + 2*w
}
