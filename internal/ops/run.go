package ops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// LagOptions are the flags of `outbox-relay lag`.
type LagOptions struct {
	JSON       bool          // one JSON object (per redraw) instead of the table
	Watch      time.Duration // redraw at this interval until ctx is done; 0 checks once
	Clear      bool          // clear the terminal before each redraw (stdout is a terminal)
	Thresholds Thresholds
}

// clearScreen moves the cursor home and clears the screen (ANSI).
const clearScreen = "\x1b[H\x1b[2J"

// RunLag checks once, or redraws every opts.Watch until ctx is done, writing
// to w. Checking once, it returns the error of Lag, a *SlotLostError when the
// slot is lost, or a *ThresholdError when a threshold is exceeded (map it
// with exitcode.Of). Watching, a failed check or
// an exceeded threshold is shown in the redraw instead, so that a passing
// outage does not end the watch; it returns nil when ctx is done.
func RunLag(ctx context.Context, q Querier, cfg Config, w io.Writer, opts LagOptions) error {
	if opts.Watch <= 0 {
		r, err := Lag(ctx, q, cfg)
		if err != nil {
			return err
		}
		if err := write(w, r, opts.JSON); err != nil {
			return err
		}
		if r.Slot.Lost() {
			return r.lostError()
		}
		if r.SlotGap != nil {
			return r.SlotGap.Err()
		}
		if se := r.Checkpoint.stoppedError(r.SlotName); se != nil {
			return se
		}
		return opts.Thresholds.Check(r)
	}
	t := time.NewTicker(opts.Watch)
	defer t.Stop()
	for {
		if err := redraw(ctx, q, cfg, w, opts); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// redraw shows one check in watch mode. Only a failure to write ends the watch.
func redraw(ctx context.Context, q Querier, cfg Config, w io.Writer, opts LagOptions) error {
	r, err := Lag(ctx, q, cfg)
	if ctx.Err() != nil {
		return nil // Ctrl-C during the query: leave the last frame on screen
	}
	if opts.Clear && !opts.JSON {
		if _, err := io.WriteString(w, clearScreen); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if err != nil {
		if opts.JSON {
			return WriteJSON(w, map[string]string{"error": err.Error()})
		}
		_, werr := fmt.Fprintf(w, "%s  error: %s\n", time.Now().UTC().Format(time.RFC3339), Printable(err.Error()))
		return werr
	}
	if err := write(w, r, opts.JSON); err != nil {
		return err
	}
	if r.Slot.Lost() && !opts.JSON {
		if _, err := fmt.Fprintf(w, "SLOT LOST: %s\n", Printable(r.lostError().Error())); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if se := r.Checkpoint.stoppedError(r.SlotName); se != nil && !opts.JSON {
		if _, err := fmt.Fprintf(w, "STOPPED: %s\n", Printable(se.Error())); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	var te *ThresholdError
	if terr := opts.Thresholds.Check(r); errors.As(terr, &te) && !opts.JSON {
		if _, err := fmt.Fprintf(w, "THRESHOLD EXCEEDED: %s\n", strings.Join(te.Exceeded, "; ")); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if !opts.Clear && !opts.JSON {
		_, err := io.WriteString(w, "\n")
		return err
	}
	return nil
}

func write(w io.Writer, r *LagReport, asJSON bool) error {
	if asJSON {
		return WriteJSON(w, r)
	}
	return r.WriteText(w)
}

func (r *LagReport) lostError() *SlotLostError {
	return &SlotLostError{Slot: r.SlotName, ConfirmedFlushLSN: orNA(r.Slot.ConfirmedFlushLSN), MaxSlotWALKeepSize: r.MaxSlotWALKeepSize}
}
