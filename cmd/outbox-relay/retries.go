package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
)

// retryTable is the configured retry table (retry.table).
func (e *env) retryTable() string { return e.cfg.RetryTable }

func newRetriesCmd(wrap wrapFunc) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "retries",
		Short: "List, show, requeue or drop the events that could not be delivered",
		Long: `retries works on the retry table, where the relay keeps the events Kafka
refused (unknown topic, too large, unroutable) and the later events of the same
aggregate, which wait behind them to keep per-aggregate order.

Pending events are retried with backoff by the running relay. Dead events are
not retried: they failed for good (or too long, or too often) and block their
aggregate until you requeue them (after fixing the cause) or drop them.

Every row belongs to the slot of the relay that parked it: these commands see
only the configured slot's (postgres.slot). Rows of other slots sharing the
table are their relays' own.

An ID is the SEQ number that list shows, or the event id.`,
		// cobra shows the help of a command without Run and exits 0, also
		// for "retries lsit": an unknown subcommand is a usage error (2).
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
	cmd.AddCommand(newRetriesListCmd(wrap), newRetriesShowCmd(wrap),
		newRetriesRequeueCmd(wrap), newRetriesDropCmd(wrap))
	// Only the table is involved: none of them needs kafka.brokers.
	for _, sub := range cmd.Commands() {
		sub.Annotations = map[string]string{"kafka": "optional"}
	}
	return cmd
}

// openRetryStore connects for a retries subcommand. List and show run in
// read-only sessions, so that looking can never change anything.
//
// A read-only session is a session setting (default_transaction_read_only,
// a startup parameter), which a pooler refuses or, in transaction mode, does
// not keep: list and show connect to postgres.replication_dsn when it is set
// (Postgres itself), the others to postgres.dsn.
func openRetryStore(ctx context.Context, e *env, readOnly bool) (*retry.Store, func(), error) {
	dsn := e.cfg.Replication.DSN
	if readOnly {
		dsn = e.cfg.Replication.ReplicationConnDSN()
	}
	pc, err := sqlconn.PoolConfig(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: postgres.dsn: %w", errConfig, err)
	}
	pc.MaxConns = 2
	rp := pc.ConnConfig.RuntimeParams
	rp["application_name"] = "outbox-relay retries"
	if readOnly {
		rp["default_transaction_read_only"] = "on"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to postgres %s: %w", redactDSN(dsn), err)
	}
	s, err := retry.NewStore(pool, e.retryTable(), e.cfg.Replication.Slot)
	if err != nil {
		pool.Close()
		return nil, nil, fmt.Errorf("%w: %w", errConfig, err)
	}
	return s, pool.Close, nil
}

// withRetryStore runs f with the store of a retries subcommand (see
// openRetryStore), explaining a missing retry table instead of quoting
// Postgres.
func withRetryStore(ctx context.Context, e *env, readOnly bool, f func(*retry.Store) error) error {
	s, closeFn, err := openRetryStore(ctx, e, readOnly)
	if err != nil {
		return err
	}
	defer closeFn()
	return retryErr(s, f(s))
}

// retryErr explains a missing retry table instead of quoting Postgres.
func retryErr(s *retry.Store, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("retry table %s does not exist: run `outbox-relay setup` to create it", s.Table())
	}
	return err
}

func newRetriesListCmd(wrap wrapFunc) *cobra.Command {
	var (
		f      retry.Filter
		status string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list [--status pending|dead] [--aggregate-type T] [--limit N] [--json]",
		Short: "List the events in the retry table, oldest first",
		Long: `list prints one line per event, in the order they will be delivered: SEQ (the
ID other subcommands take), the event id, its aggregate, topic, status
(pending, waiting: pending only behind an earlier event of its aggregate, or
dead), attempts, when the next attempt is due, how long it has been in the
table, and the last error. --json prints an array with every field but the
value (see show).`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			switch status {
			case "", "all":
			case string(retry.StatusPending), string(retry.StatusDead):
				f.Status = retry.Status(status)
			default:
				return fmt.Errorf("%w: --status %q: want pending or dead", errConfig, status)
			}
			if f.Limit < 0 {
				return fmt.Errorf("%w: --limit %d: want a positive number, or 0 for no limit", errConfig, f.Limit)
			}
			return withRetryStore(cmd.Context(), e, true, func(s *retry.Store) error {
				entries, err := s.List(cmd.Context(), f)
				if err != nil {
					return err
				}
				if asJSON {
					return writeRetryEntriesJSON(e.stdout, entries)
				}
				writeRetryEntries(e.stdout, entries, time.Now())
				if f.Limit > 0 && len(entries) == f.Limit {
					fmt.Fprintf(e.stdout, "(first %d shown; use --limit to see more)\n", f.Limit)
				}
				return nil
			})
		}),
	}
	fl := cmd.Flags()
	fl.StringVar(&status, "status", "", "only pending or only dead events")
	fl.StringVar(&f.AggregateType, "aggregate-type", "", "only events of this aggregate type")
	fl.IntVar(&f.Limit, "limit", 100, "at most N events (0: all)")
	fl.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// displayStatus tells waiting rows from those that failed themselves.
func retryStatus(en retry.Entry) string {
	if en.Status == retry.StatusPending && en.Waiting {
		return "waiting"
	}
	return string(en.Status)
}

func writeRetryEntries(w io.Writer, entries []retry.Entry, now time.Time) {
	if len(entries) == 0 {
		fmt.Fprintln(w, "no events in the retry table")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tEVENT ID\tAGGREGATE\tTOPIC\tSTATUS\tATTEMPTS\tNEXT ATTEMPT\tAGE\tLAST ERROR")
	for _, en := range entries {
		next := "-" // dead: not until requeued
		if en.Status == retry.StatusPending {
			if d := en.NextAttemptAt.Sub(now); d > 0 {
				next = "in " + ops.RoughDuration(d)
			} else {
				next = "due"
			}
		}
		// Every field comes from event data or the broker: escaped, so that
		// no control character reaches the operator's terminal.
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", en.Seq, ops.Printable(dashIfEmpty(en.EventID)),
			ops.Printable(truncateRunes(en.Aggregate, 40)), ops.Printable(dashIfEmpty(en.Topic)), retryStatus(en), en.Attempts, next,
			ops.RoughDuration(now.Sub(en.CreatedAt)), ops.Printable(truncateRunes(singleLine(lastError(en)), 60)))
	}
	tw.Flush()
}

// retryEntryJSON is an Entry as list --json and show --json print it.
type retryEntryJSON struct {
	Seq           int64             `json:"seq"`
	EventKey      string            `json:"event_key"`
	EventID       *string           `json:"event_id"`
	Aggregate     string            `json:"aggregate"`
	AggregateType *string           `json:"aggregate_type"`
	AggregateID   *string           `json:"aggregate_id"`
	EventType     *string           `json:"event_type"`
	Topic         *string           `json:"topic"`
	OutboxTable   *string           `json:"outbox_table"` // null for a logical decoding message's event
	Status        string            `json:"status"`
	Waiting       bool              `json:"waiting"`
	Attempts      int               `json:"attempts"`
	NextAttemptAt time.Time         `json:"next_attempt_at"`
	LastError     string            `json:"last_error"`  // with the config keys of its code (lastError)
	ReasonCode    *string           `json:"reason_code"` // null for none and for rows of earlier versions
	FirstFailedAt time.Time         `json:"first_failed_at"`
	SourceLSN     *string           `json:"source_lsn"`
	CommitTime    *time.Time        `json:"commit_time"`
	CreatedAt     time.Time         `json:"created_at"`
	UpdatedAt     time.Time         `json:"updated_at"`
	Key           *string           `json:"key,omitempty"`
	Value         *string           `json:"value,omitempty"`
	Encoding      string            `json:"encoding,omitempty"` // of key and value: utf8 or hex
	Extra         []retryHeaderJSON `json:"headers,omitempty"`  // the extra headers (retry.Entry.Extra)
	LastResort    bool              `json:"last_resort"`
}

// retryHeaderJSON is a header; a key or value that is not UTF-8 is given in
// hex, with Encoding "hex", so that JSON output is exact.
type retryHeaderJSON struct {
	Key      string `json:"key"`
	Value    string `json:"value"`
	Encoding string `json:"encoding,omitempty"`
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func retryEntryToJSON(en retry.Entry, withBody bool) retryEntryJSON {
	j := retryEntryJSON{
		Seq: en.Seq, EventKey: en.EventKey, EventID: nullIfEmpty(en.EventID), Aggregate: en.Aggregate,
		AggregateType: nullIfEmpty(en.AggregateType), AggregateID: nullIfEmpty(en.AggregateID),
		EventType: nullIfEmpty(en.EventType), Topic: nullIfEmpty(en.Topic), OutboxTable: nullIfEmpty(en.Table), Status: string(en.Status),
		Waiting: en.Waiting, Attempts: en.Attempts, NextAttemptAt: en.NextAttemptAt, LastError: lastError(en), ReasonCode: nullIfEmpty(en.ReasonCode),
		FirstFailedAt: en.FirstFailedAt, CreatedAt: en.CreatedAt, UpdatedAt: en.UpdatedAt,
		LastResort: en.LastResort,
	}
	if en.SourceLSN != 0 {
		j.SourceLSN = nullIfEmpty(en.SourceLSN.String())
	}
	if !en.CommitTime.IsZero() {
		ct := en.CommitTime
		j.CommitTime = &ct
	}
	if withBody {
		j.Encoding = "utf8"
		if !utf8.Valid(en.Key) || !utf8.Valid(en.Value) {
			j.Encoding = "hex"
		}
		enc := func(b []byte) *string {
			if b == nil {
				return nil
			}
			if j.Encoding == "hex" {
				s := hex.EncodeToString(b)
				return &s
			}
			s := string(b)
			return &s
		}
		j.Key, j.Value = enc(en.Key), enc(en.Value)
		for _, h := range en.Extra {
			hj := retryHeaderJSON{Key: h.Key, Value: string(h.Value)}
			if !utf8.ValidString(h.Key) || !utf8.Valid(h.Value) {
				hj = retryHeaderJSON{Key: hex.EncodeToString([]byte(h.Key)), Value: hex.EncodeToString(h.Value), Encoding: "hex"}
			}
			j.Extra = append(j.Extra, hj)
		}
	}
	return j
}

func writeRetryEntriesJSON(w io.Writer, entries []retry.Entry) error {
	out := make([]retryEntryJSON, len(entries))
	for i, en := range entries {
		out[i] = retryEntryToJSON(en, false)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func newRetriesShowCmd(wrap wrapFunc) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID [--json]",
		Short: "Show everything about one event: error, timing, key, value, headers",
		Long: `show prints every field of one event of the retry table. The key and value are
printed as text when they are UTF-8, else in hex. ID is the SEQ number that
list shows, or the event id.`,
		Args: cobra.ExactArgs(1),
		RunE: wrap(func(cmd *cobra.Command, e *env, args []string) error {
			return withRetryStore(cmd.Context(), e, true, func(s *retry.Store) error {
				en, err := s.Get(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if asJSON {
					enc := json.NewEncoder(e.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(retryEntryToJSON(en, true))
				}
				writeRetryEntry(e.stdout, en, time.Now())
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func writeRetryEntry(w io.Writer, en retry.Entry, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// The values come from event data and the broker: every string is
	// escaped, so that no control character reaches the operator's terminal.
	row := func(name, format string, args ...any) {
		for i, a := range args {
			if s, ok := a.(string); ok {
				args[i] = ops.Printable(s)
			}
		}
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{name}, args...)...)
	}
	row("seq", "%d", en.Seq)
	row("event id", "%s", dashIfEmpty(en.EventID))
	if en.EventKey != en.EventID {
		row("event key", "%s", en.EventKey)
	}
	row("status", "%s", retryStatus(en))
	if en.LastResort {
		row("last resort", "yes: the retry table could not store this event in its columns; it is kept whole in the last_resort document and is never delivered by the relay")
	}
	row("aggregate", "%s", en.Aggregate)
	row("aggregate type", "%s", dashIfEmpty(en.AggregateType))
	row("aggregate id", "%s", dashIfEmpty(en.AggregateID))
	row("event type", "%s", dashIfEmpty(en.EventType))
	row("topic", "%s", dashIfEmpty(en.Topic))
	row("outbox table", "%s", dashIfEmpty(en.Table))
	row("attempts", "%d", en.Attempts)
	switch {
	case en.Status == retry.StatusDead:
		row("next attempt", "none until requeued (outbox-relay retries requeue %d)", en.Seq)
	case en.NextAttemptAt.After(now):
		row("next attempt", "%s (in %s)", en.NextAttemptAt.Format(time.RFC3339), ops.RoughDuration(en.NextAttemptAt.Sub(now)))
	default:
		row("next attempt", "due")
	}
	row("last error", "%s", dashIfEmpty(lastError(en)))
	row("first failed", "%s (%s ago)", en.FirstFailedAt.Format(time.RFC3339), ops.RoughDuration(now.Sub(en.FirstFailedAt)))
	row("in table since", "%s (%s ago)", en.CreatedAt.Format(time.RFC3339), ops.RoughDuration(now.Sub(en.CreatedAt)))
	row("updated", "%s", en.UpdatedAt.Format(time.RFC3339))
	if en.SourceLSN != 0 {
		row("source lsn", "%s", en.SourceLSN.String())
	}
	if !en.CommitTime.IsZero() {
		row("commit time", "%s", en.CommitTime.Format(time.RFC3339Nano))
	}
	row("key", "%s", bytesText(en.Key))
	row("value", "%s", bytesText(en.Value))
	if len(en.Extra) == 0 {
		row("headers", "-")
	}
	tw.Flush()
	if len(en.Extra) > 0 {
		fmt.Fprintln(w, "headers:")
		for _, h := range en.Extra {
			fmt.Fprintf(w, "  %s: %s\n", ops.Printable(h.Key), ops.Printable(bytesText(h.Value)))
		}
	}
}

// bytesText prints b as text when it is UTF-8, else as hex, saying which.
func bytesText(b []byte) string {
	switch {
	case b == nil:
		return "(null)"
	case utf8.Valid(b):
		return string(b)
	}
	return fmt.Sprintf("(%d bytes, not UTF-8, hex) %s", len(b), hex.EncodeToString(b))
}

func newRetriesRequeueCmd(wrap wrapFunc) *cobra.Command {
	var allDead bool
	cmd := &cobra.Command{
		Use:   "requeue ID... | --all-dead",
		Short: "Retry events now: dead ones after you fixed the cause, or pending ones early",
		Long: `requeue makes the events pending and due now, with attempts and the max-age
window starting over; the last error is kept until the next attempt. The
running relay delivers them within its poll interval, in order behind any
earlier event of their aggregate. If an ID does not exist, nothing is
requeued.`,
		RunE: wrap(func(cmd *cobra.Command, e *env, args []string) error {
			if allDead == (len(args) > 0) {
				return fmt.Errorf("%w: give the IDs to requeue, or --all-dead", errConfig)
			}
			return withRetryStore(cmd.Context(), e, false, func(s *retry.Store) error {
				var seqs []int64
				var err error
				if allDead {
					seqs, err = s.RequeueAllDead(cmd.Context())
				} else {
					seqs, err = s.Requeue(cmd.Context(), args)
				}
				if err != nil {
					return err
				}
				if allDead && len(seqs) == 0 {
					fmt.Fprintln(e.stdout, "no dead events to requeue")
					return nil
				}
				fmt.Fprintf(e.stdout, "requeued %s\n", countedSeqs(seqs))
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&allDead, "all-dead", false, "requeue every dead event")
	return cmd
}

func newRetriesDropCmd(wrap wrapFunc) *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "drop ID... --yes",
		Short: "Delete events from the retry table: they are never delivered",
		Long: `drop deletes the events from the retry table. They are then lost: never
delivered to Kafka, and not in the WAL the relay reads any more. The events
waiting behind them in their aggregate are delivered next. Without --yes
nothing is dropped and it exits 2. If an ID does not exist, nothing is
dropped.`,
		Args: cobra.MinimumNArgs(1),
		RunE: wrap(func(cmd *cobra.Command, e *env, args []string) error {
			if !yes {
				// A usage error (exit 2), as checkpoint set without --yes:
				// nothing was started.
				return usageErrorf("not dropping %s: a dropped event is lost, never delivered to Kafka; "+
					"requeue it instead if its cause is fixed, or run again with --yes", strings.Join(args, ", "))
			}
			return withRetryStore(cmd.Context(), e, false, func(s *retry.Store) error {
				seqs, err := s.Drop(cmd.Context(), args)
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "dropped %s\n", countedSeqs(seqs))
				return nil
			})
		}),
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: the dropped events are lost")
	return cmd
}

// countSeqs says "3 events: 12, 13, 14".
func countedSeqs(seqs []int64) string {
	ss := make([]string, len(seqs))
	for i, s := range seqs {
		ss[i] = strconv.FormatInt(s, 10)
	}
	noun := "events"
	if len(seqs) == 1 {
		noun = "event"
	}
	return fmt.Sprintf("%d %s: %s", len(seqs), noun, strings.Join(ss, ", "))
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func singleLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}
