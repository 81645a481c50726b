package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/relay"
)

func newRunCmd(wrap wrapFunc) *cobra.Command {
	var startLSN string
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Stream outbox inserts to Kafka until SIGTERM or SIGINT",
		Long: `run streams until it receives SIGTERM or SIGINT, then stops reading, waits up to
pipeline.shutdown_timeout for Kafka to acknowledge what is in flight, saves the
checkpoint and exits 0. A second signal exits at once (nothing is lost: what was
not confirmed is delivered again on the next start).

--start-lsn X/Y starts at that WAL position instead of the saved checkpoint: a
forward skip, for an operator who decided to drop events. Starting behind the
slot's confirmed position is refused, because the server no longer has that WAL.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			rc := e.cfg.relayConfig(e.log)
			if startLSN != "" {
				lsn, err := pglogrepl.ParseLSN(startLSN)
				if err != nil {
					return fmt.Errorf("%w: --start-lsn %q: want a WAL position like 16/B374D848", errConfig, startLSN)
				}
				rc.StartLSN = lsn
			}
			r, err := relay.New(rc)
			if err != nil {
				return fmt.Errorf("%w: %w", errConfig, err)
			}
			setMemoryLimit(e)
			ctx, stop := signalContext(cmd.Context(), e)
			defer stop()
			e.log.Info("starting",
				"version", version,
				"postgres", redactDSN(e.cfg.Postgres.DSN),
				"slot", e.cfg.Postgres.Slot,
				"publication", e.cfg.Postgres.Publication,
				"table", e.cfg.Outbox.Table,
				"brokers", strings.Join(e.cfg.Kafka.Brokers, ","),
				"start_lsn", startLSN)
			err = r.Run(ctx)
			if err == nil || isCanceled(ctx, err) {
				return nil
			}
			return err
		}),
	}
	cmd.Flags().StringVar(&startLSN, "start-lsn", "", "start at this WAL position (X/Y), skipping everything before it")
	return cmd
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
				os.Exit(exitFail)
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
	limit := int64(32<<20) + 2*int64(e.cfg.Pipeline.MaxInFlightBytes)
	debug.SetMemoryLimit(limit)
	e.log.Info("soft memory limit set (GOMEMLIMIT overrides it)", "bytes", limit)
}
