package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/relay"
)

const (
	defaultWatch = 2 * time.Second
	minWatch     = time.Second
)

func newLagCmd(wrap wrapFunc) *cobra.Command {
	var (
		asJSON     bool
		watch      time.Duration
		maxBytes   int64
		maxSeconds float64
	)
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"},
		Use:         "lag [--watch [interval]] [--json] [--max-bytes N] [--max-seconds N]",
		Short:       "Show how far the relay is behind (slot, checkpoint, time lag, retries)",
		Long: `lag reads the replication slot, the relay's checkpoint, the outbox table and
the retry table over an ordinary read-only connection; it works whether or not
a relay is running and never disturbs one.

  lag bytes      WAL written since the position the relay confirmed
  reading        the transaction a running relay reads and has not confirmed:
                 its events and bytes so far (the lag in bytes misses it);
                 behind = lag bytes + those bytes, what --max-bytes checks
  retained       WAL the server keeps on disk for the slot
  time lag       age of the oldest event not yet delivered (estimated from
                 created_at: see docs/operating.md), or "caught up"

--json prints one object (one per redraw with --watch) with the fields listed
in docs/operating.md. --watch redraws every interval (default 2s, at least 1s) until
Ctrl-C.

Exit codes: 0 ok, 1 error (cannot connect, slot missing) or the slot is lost
(wal_status lost: it can never stream again, see docs/failover.md), 2 bad flags or
configuration, 3 a --max-bytes or --max-seconds threshold was exceeded, 4 the
slot does not continue from the relay's checkpoint (a slot gap: run refuses to
stream it; the report, with its slot_gap, is printed first; see
docs/failover.md). With
--watch, thresholds are shown in the output instead of ending the watch.`,
		Args: cobra.MaximumNArgs(1),
		RunE: wrap(func(cmd *cobra.Command, e *env, args []string) error {
			// "--watch 5s" with a space: pflag's optional value needs "=", so
			// the interval arrives as an argument.
			if len(args) == 1 {
				if !cmd.Flags().Changed("watch") {
					return fmt.Errorf("%w: unexpected argument %q", errConfig, args[0])
				}
				d, err := parseInterval(args[0])
				if err != nil {
					return fmt.Errorf("%w: --watch %q: %w", errConfig, args[0], err)
				}
				watch = d
			}
			if maxBytes < 0 || maxSeconds < 0 {
				return usageErrorf("--max-bytes and --max-seconds must not be negative")
			}
			// Each redraw runs several catalog queries; --watch 0.001 ran
			// ~800 a second against the server being watched.
			if cmd.Flags().Changed("watch") && watch < minWatch {
				return usageErrorf("--watch %s: the interval must be at least %s (e.g. --watch=%s)", watch, minWatch, defaultWatch)
			}
			opts := ops.LagOptions{
				JSON:       asJSON,
				Watch:      watch,
				Clear:      isTerminal(e.stdout),
				Thresholds: ops.Thresholds{MaxBytes: maxBytes, MaxSeconds: maxSeconds},
			}
			ctx := cmd.Context()
			if watch > 0 {
				var stop context.CancelFunc
				ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
				defer stop()
			}
			conn, err := newOpsConn(e, "outbox-relay lag")
			if err != nil {
				return err
			}
			defer conn.Close(context.WithoutCancel(ctx))
			return ops.RunLag(ctx, conn, e.opsConfig(), e.stdout, opts)
		}),
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "print JSON (field names in docs/operating.md)")
	f.DurationVar(&watch, "watch", 0, "redraw every interval (at least 1s) until Ctrl-C (default 2s when given without a value)")
	f.Lookup("watch").NoOptDefVal = defaultWatch.String()
	f.Int64Var(&maxBytes, "max-bytes", 0, "exit 3 when the slot's lag plus the transaction the relay is reading (behind_bytes) exceeds N bytes (0: no limit)")
	f.Float64Var(&maxSeconds, "max-seconds", 0, "exit 3 when the oldest undelivered event is older than N seconds (0: no limit)")
	return cmd
}

// parseInterval accepts a Go duration ("5s", "1m") or a number of seconds ("5").
func parseInterval(s string) (time.Duration, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	secs, err := strconv.ParseFloat(s, 64)
	if err != nil || secs <= 0 {
		return 0, fmt.Errorf("want a duration such as 5s or a number of seconds")
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// newOpsConn is the read-only session of lag, status and checkpoint show.
func newOpsConn(e *env, applicationName string) (*ops.Session, error) {
	s, err := ops.NewSession(e.cfg.Replication.DSN, redactDSN(e.cfg.Replication.DSN), applicationName)
	if err != nil {
		return nil, fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	return s, nil
}

// opsConfig names what lag and status examine.
func (e *env) opsConfig() ops.Config {
	return ops.Config{
		Slot:            e.cfg.Replication.Slot,
		Table:           e.cfg.Table,
		Tables:          e.cfg.moreTables(),
		TableOptional:   e.cfg.Source == relay.SourceMessages,
		CheckpointTable: e.cfg.CheckpointTable,
		RetryTable:      e.cfg.RetryTable,
		Fix:             hint,
	}
}

// isTerminal reports whether w is a terminal, where --watch clears the screen
// between redraws; piped output gets one report after another instead.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
