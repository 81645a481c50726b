package ops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/replication/pgslot"
	"github.com/outbox-relay/outbox-relay/sql"
)

// A Querier runs one query returning at most one row. *pgx.Conn, *pgxpool.Pool
// and pgx.Tx satisfy it. Lag and Status issue several queries in sequence and
// never concurrently.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Config names what to examine. The zero value of every field but Slot means
// its documented default.
type Config struct {
	Slot  string // replication slot; required
	Table string // outbox table, default sql.DefaultOutboxTable
	// Tables are more outbox tables read on the slot (outbox.tables): Lag
	// estimates the time lag of each too (LagReport.Tables).
	Tables []string
	// TableOptional: events come from logical decoding messages and the
	// table is only an archive, which may not exist; then the time lag is
	// unknown rather than an error.
	TableOptional   bool
	CreatedAtColumn string // default "created_at"
	CheckpointTable string // default sql.DefaultCheckpointTable
	RetryTable      string // default sql.DefaultRetryTable
	// Fix, when set, says how to fix an error found (a slot gap) in the
	// command line's words; "" leaves the error's own.
	Fix func(error) string
}

func (c *Config) validate() error {
	if c.Slot == "" {
		return errors.New("slot name is empty: set the replication slot in the config")
	}
	if c.Table == "" {
		c.Table = sql.DefaultOutboxTable
	}
	if c.CreatedAtColumn == "" {
		c.CreatedAtColumn = "created_at"
	}
	if c.CheckpointTable == "" {
		c.CheckpointTable = sql.DefaultCheckpointTable
	}
	if c.RetryTable == "" {
		c.RetryTable = sql.DefaultRetryTable
	}
	return nil
}

// Time lag states.
const (
	StateBehind   = "behind"    // at least one event is known not to be delivered
	StateCaughtUp = "caught_up" // every row in the outbox table was delivered
	StateUnknown  = "unknown"   // the outbox table is empty: nothing to estimate from
)

// Slot describes a replication slot and the backend that holds it.
type Slot struct {
	Active            bool       `json:"active"`
	ActivePID         *int32     `json:"active_pid"`
	ApplicationName   *string    `json:"application_name"`
	ClientAddr        *string    `json:"client_addr"`
	BackendStart      *time.Time `json:"backend_start"`
	WalsenderState    *string    `json:"walsender_state"`
	ConfirmedFlushLSN *string    `json:"confirmed_flush_lsn"`
	RestartLSN        *string    `json:"restart_lsn"`
	WALStatus         *string    `json:"wal_status"`
	SafeWALSizeBytes  *int64     `json:"safe_wal_size_bytes"`
}

// Checkpoint is the relay's saved position for the slot.
type Checkpoint struct {
	LSN            string     `json:"lsn"`
	SavedAt        *time.Time `json:"saved_at"`
	LastCommitTime *time.Time `json:"last_commit_time"`
	// The relay that last took the slot over (high availability): its epoch,
	// how it named itself (host, pid, start) and when. Absent before any did.
	LeaderEpoch *int64     `json:"leader_epoch,omitempty"`
	Leader      *string    `json:"leader,omitempty"`
	LeaderSince *time.Time `json:"leader_since,omitempty"`
	// Why the relay last stopped before a transaction it must not confirm
	// past (an insert it cannot place, the outbox changed), and that
	// transaction's commit LSN; absent when it did not, or once its
	// checkpoint passed it.
	StoppedBefore *string `json:"stopped_before,omitempty"`
	StopReason    *string `json:"stop_reason,omitempty"`
	// The last refill of a lost slot from the outbox table (when, why,
	// how many events, the range), absent before any.
	LastRefill *string `json:"last_refill,omitempty"`

	lastDeliveredAge *float64 // server's now() - LastCommitTime, for TimeLag
	reading          *Reading // the relay's figures of the transaction it reads, for Lag
}

// Reading is the transaction a running relay has been reading for a second
// or more and not yet confirmed, as it records it in its checkpoint row
// (about once a second): the server decodes a transaction whole before it
// sends it, and the relay confirms the positions reported meanwhile, so
// lag_bytes does not count it.
type Reading struct {
	CommitLSN  string    `json:"commit_lsn"`
	Since      time.Time `json:"since"`       // when the relay began to read it (its clock)
	AgeSeconds *float64  `json:"age_seconds"` // now - since (server's now), null when unknown
	Events     int64     `json:"events"`      // events read of it so far
	Bytes      int64     `json:"bytes"`       // their bytes, as pgoutput sent them
	UpdatedAt  time.Time `json:"updated_at"`  // when the relay last recorded it (server's clock)
}

// TimeLag estimates how old the oldest undelivered event is (see the package doc).
type TimeLag struct {
	State                   string     `json:"state"`
	OldestUndeliveredAt     *time.Time `json:"oldest_undelivered_at"`
	Seconds                 *float64   `json:"seconds"`
	LastDeliveredAgeSeconds *float64   `json:"last_delivered_age_seconds"`

	slotAtRisk bool // "caught up" was withheld: the slot is lost or unreserved
}

// TableLag is the time lag of one more outbox table.
type TableLag struct {
	Table   string  `json:"table"`
	TimeLag TimeLag `json:"time_lag"`
}

// Retry summarises the retry table.
type Retry struct {
	Pending                 int64    `json:"pending"`
	Dead                    int64    `json:"dead"`
	OldestPendingAgeSeconds *float64 `json:"oldest_pending_age_seconds"`
}

// LagReport is the answer of Lag. Its JSON form is documented in the package doc.
type LagReport struct {
	SlotName      string    `json:"slot_name"`
	CheckedAt     time.Time `json:"checked_at"`
	Slot          Slot      `json:"slot"`
	CurrentWALLSN string    `json:"current_wal_lsn"`
	LagBytes      *int64    `json:"lag_bytes"`
	// Reading is the transaction the relay is reading and has not
	// confirmed (nil when none), and BehindBytes lag_bytes plus what it read
	// of it: what --max-bytes checks.
	Reading          *Reading    `json:"reading"`
	BehindBytes      *int64      `json:"behind_bytes"`
	RetainedWALBytes *int64      `json:"retained_wal_bytes"`
	Checkpoint       *Checkpoint `json:"checkpoint"`
	TimeLag          TimeLag     `json:"time_lag"`
	// Tables holds the time lag of each more outbox table (Config.Tables),
	// in their order; TimeLag is the first table's.
	Tables []TableLag `json:"tables,omitempty"`
	Retry  *Retry     `json:"retry"`
	// Buffer is what the WAL buffer holds (package walbuffer); nil when
	// it holds nothing of the slot.
	Buffer *Buffer `json:"wal_buffer,omitempty"`
	// SlotGap is set when the slot does not continue from the checkpoint:
	// run refuses to stream it (see FindGap).
	SlotGap *SlotGap `json:"slot_gap"`

	// The server's max_slot_wal_keep_size as SHOW prints it ("-1", "1MB",
	// "10GB"), and in bytes (nil when -1: unlimited).
	MaxSlotWALKeepSize      string `json:"max_slot_wal_keep_size"`
	MaxSlotWALKeepSizeBytes *int64 `json:"max_slot_wal_keep_size_bytes"`
}

// WAL statuses of a slot (pg_replication_slots.wal_status).
const (
	WALReserved   = "reserved"
	WALExtended   = "extended"
	WALUnreserved = "unreserved" // invalidated at the next checkpoint unless it advances
	WALLost       = "lost"       // invalidated: it can never stream again
)

// Lost reports whether the slot was invalidated (wal_status lost).
func (s Slot) Lost() bool { return s.WALStatus != nil && *s.WALStatus == WALLost }

// atRisk reports a slot that is lost or about to be.
func (s Slot) atRisk() bool {
	return s.Lost() || (s.WALStatus != nil && *s.WALStatus == WALUnreserved)
}

// SlotLostError is RunLag's error for a lost slot (wal_status lost): the
// server removed WAL the slot needed, so no relay can stream it again and
// events after its confirmed position were never delivered by it. It maps to
// exitcode.Failure (1), the code of a missing slot, which is what a lost slot
// amounts to: recreate it (see "When the slot is at risk" in docs/failover.md).
type SlotLostError struct {
	Slot               string
	ConfirmedFlushLSN  string
	MaxSlotWALKeepSize string
}

func (e *SlotLostError) Error() string {
	return fmt.Sprintf("replication slot %q is lost (wal_status lost): the server removed WAL it needed "+
		"(max_slot_wal_keep_size = %s); it can never stream again and events committed after %s were not relayed "+
		"by it: recreate it (see \"When the slot is at risk\" in docs/failover.md)", e.Slot, e.MaxSlotWALKeepSize, e.ConfirmedFlushLSN)
}

// ExitCode is exitcode.Failure: see the type's doc.
func (e *SlotLostError) ExitCode() int { return exitcode.Failure }

// StoppedError is RunLag's error when the relay recorded that it stopped
// before a transaction it must not confirm past: it makes no progress
// until an operator applies the fix the reason names. Exit code 1.
type StoppedError struct {
	Slot, Before, Reason string
}

func (e *StoppedError) Error() string {
	return fmt.Sprintf("the relay of slot %q stopped before the transaction committed at %s and delivers nothing from it on until it is fixed: %s",
		e.Slot, e.Before, e.Reason)
}

// ExitCode is exitcode.Failure.
func (e *StoppedError) ExitCode() int { return exitcode.Failure }

// stoppedError returns the report's *StoppedError, or nil.
func (c *Checkpoint) stoppedError(slot string) *StoppedError {
	if c == nil || c.StoppedBefore == nil {
		return nil
	}
	return &StoppedError{Slot: slot, Before: *c.StoppedBefore, Reason: *c.StopReason}
}

// StatusReport is the answer of Status. Its JSON form is documented in the package doc.
type StatusReport struct {
	SlotName   string      `json:"slot_name"`
	CheckedAt  time.Time   `json:"checked_at"`
	Streaming  bool        `json:"streaming"`
	Version    *string     `json:"version"`
	Slot       Slot        `json:"slot"`
	Checkpoint *Checkpoint `json:"checkpoint"`
	SlotGap    *SlotGap    `json:"slot_gap"`             // as in LagReport
	Buffer     *Buffer     `json:"wal_buffer,omitempty"` // as in LagReport
}

// Buffer is what the WAL buffer table holds of a slot: the relay is
// buffering (or draining) while it holds events.
type Buffer struct {
	Table  string    `json:"table"`
	Events int64     `json:"events"`
	Bytes  int64     `json:"bytes"`
	Since  time.Time `json:"since"` // when the oldest event held was buffered
	// OldestLSN is the commit LSN of the oldest event held.
	OldestLSN string `json:"oldest_commit_lsn"`
}

// QueryBuffer reads what the WAL buffer beside retryTable holds of slot;
// nil when nothing (or no table).
func QueryBuffer(ctx context.Context, q Querier, retryTable, slot string) (*Buffer, error) {
	t, err := walbuffer.TableFor(retryTable)
	if err != nil {
		return nil, err
	}
	st, err := walbuffer.ReadStats(ctx, q, t, slot)
	if err != nil || st.Events == 0 {
		return nil, err
	}
	return &Buffer{Table: t.String(), Events: st.Events, Bytes: st.Bytes, Since: st.Oldest, OldestLSN: st.OldestLSN.String()}, nil
}

type slotRow struct {
	slot          Slot
	currentLSN    string
	lag, retained *int64
	now           time.Time
	walsender     bool
	keepSize      string // max_slot_wal_keep_size as SHOW prints it
	keepSizeBytes *int64 // nil when unlimited
}

func querySlot(ctx context.Context, q Querier, slot string) (slotRow, error) {
	ps, err := pgslot.Read(ctx, q, slot)
	if err != nil {
		return slotRow{}, err
	}
	r := slotRow{
		slot: Slot{
			Active:            ps.Active,
			ActivePID:         ps.ActivePID,
			ConfirmedFlushLSN: ps.ConfirmedFlushLSN,
			RestartLSN:        ps.RestartLSN,
			WALStatus:         ps.WALStatus,
			SafeWALSizeBytes:  ps.SafeWALSizeBytes,
		},
		currentLSN: ps.CurrentWALLSN,
		lag:        ps.LagBytes,
		retained:   ps.RetainedWALBytes,
		now:        ps.Now,
		walsender:  ps.Walsender != nil,
	}
	if w := ps.Walsender; w != nil {
		r.slot.ApplicationName, r.slot.ClientAddr, r.slot.BackendStart, r.slot.WalsenderState =
			w.ApplicationName, w.ClientAddr, w.BackendStart, w.State
	}
	var keepSetting *string
	err = q.QueryRow(ctx, `SELECT current_setting('max_slot_wal_keep_size'),
       (SELECT setting || ' ' || coalesce(unit, '') FROM pg_settings WHERE name = 'max_slot_wal_keep_size')`).
		Scan(&r.keepSize, &keepSetting)
	if err != nil {
		return r, fmt.Errorf("read max_slot_wal_keep_size: %w", err)
	}
	if keepSetting != nil {
		if r.keepSizeBytes, err = settingBytes(*keepSetting); err != nil {
			return r, fmt.Errorf("max_slot_wal_keep_size: %w", err)
		}
	}
	return r, nil
}

// settingBytes converts pg_settings' "setting unit" of a size ("1 MB":
// max_slot_wal_keep_size is kept in MB; "16 8kB" for block-sized ones) to
// bytes; -1 (unlimited) is nil.
func settingBytes(s string) (*int64, error) {
	setting, unit, _ := strings.Cut(s, " ")
	n, err := strconv.ParseInt(setting, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("setting %q is not a number", setting)
	}
	if n < 0 {
		return nil, nil
	}
	mult := int64(1)
	digits := strings.TrimRight(unit, "kMGTB")
	if digits != "" {
		if mult, err = strconv.ParseInt(digits, 10, 64); err != nil {
			return nil, fmt.Errorf("unit %q not understood", unit)
		}
	}
	switch unit[len(digits):] {
	case "B", "":
	case "kB":
		mult <<= 10
	case "MB":
		mult <<= 20
	case "GB":
		mult <<= 30
	case "TB":
		mult <<= 40
	default:
		return nil, fmt.Errorf("unit %q not understood", unit)
	}
	if n > math.MaxInt64/mult {
		return nil, fmt.Errorf("%d %s is out of range", n, unit)
	}
	b := n * mult
	return &b, nil
}

// resolveTable returns the table's name quoted for use in SQL, or "" when it
// does not exist. Names are exact, as everywhere in the relay's config
// ("public.Outbox" is the table Outbox); to_regclass resolves an unqualified
// one with the session's search_path.
func resolveTable(ctx context.Context, q Querier, name string) (string, error) {
	t, err := sql.ParseTable(name)
	if err != nil {
		return "", err
	}
	var quoted *string
	if err := q.QueryRow(ctx, "SELECT to_regclass($1)::text", t.Quoted()).Scan(&quoted); err != nil {
		return "", fmt.Errorf("resolve table %q: %w", name, err)
	}
	if quoted == nil {
		return "", nil
	}
	return *quoted, nil
}

func queryCheckpoint(ctx context.Context, q Querier, table, slot string) (*Checkpoint, error) {
	t, err := resolveTable(ctx, q, table)
	if err != nil || t == "" {
		return nil, err
	}
	var c Checkpoint
	// The leadership columns through to_jsonb: a table from before they
	// existed reads as no leader, not as an error.
	var epoch *int64
	var reading []byte
	var readingAge *float64
	err = q.QueryRow(ctx, "SELECT lsn::text, saved_at, last_commit_time, "+
		"extract(epoch FROM now() - last_commit_time)::float8, "+
		"(to_jsonb(c)->>'epoch')::bigint, to_jsonb(c)->>'leader', (to_jsonb(c)->>'leader_since')::timestamptz, "+
		"to_jsonb(c)->>'stopped_before', to_jsonb(c)->>'stop_reason', to_jsonb(c)->>'last_refill', "+
		"to_jsonb(c)->'reading', extract(epoch FROM now() - (to_jsonb(c)->'reading'->>'since')::timestamptz)::float8 FROM "+t+" c WHERE slot_name = $1", slot).
		Scan(&c.LSN, &c.SavedAt, &c.LastCommitTime, &c.lastDeliveredAge, &epoch, &c.Leader, &c.LeaderSince, &c.StoppedBefore, &c.StopReason, &c.LastRefill,
			&reading, &readingAge)
	if err == nil && len(reading) > 0 && string(reading) != "null" {
		var rd Reading
		if json.Unmarshal(reading, &rd) == nil {
			rd.AgeSeconds = readingAge
			c.reading = &rd
		}
	}
	if c.StoppedBefore == nil || c.StopReason == nil {
		c.StoppedBefore, c.StopReason = nil, nil
	}
	if epoch != nil && *epoch > 0 {
		c.LeaderEpoch = epoch
	} else {
		c.Leader, c.LeaderSince = nil, nil
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint from %s: %w", t, err)
	}
	return &c, nil
}

// Lag reports how far the relay of cfg.Slot is behind. It works whether or not
// a relay is running. It returns an error wrapping pgslot.ErrNotFound when the
// slot does not exist.
func Lag(ctx context.Context, q Querier, cfg Config) (*LagReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sr, err := querySlot(ctx, q, cfg.Slot)
	if err != nil {
		g, err := missingSlot(ctx, q, cfg, err)
		if g == nil {
			return nil, err
		}
		return missingLag(ctx, q, cfg, g)
	}
	r := &LagReport{
		SlotName:                cfg.Slot,
		CheckedAt:               sr.now,
		Slot:                    sr.slot,
		CurrentWALLSN:           sr.currentLSN,
		LagBytes:                sr.lag,
		RetainedWALBytes:        sr.retained,
		MaxSlotWALKeepSize:      sr.keepSize,
		MaxSlotWALKeepSizeBytes: sr.keepSizeBytes,
	}
	if r.Checkpoint, err = queryCheckpoint(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
		return nil, err
	}
	r.Reading, r.BehindBytes = behind(r.Checkpoint, r.LagBytes)
	if r.TimeLag, err = queryTimeLag(ctx, q, cfg, r.Checkpoint); err != nil {
		return nil, err
	}
	// Every row delivered so far says nothing about a slot that cannot (lost)
	// or soon cannot (unreserved) stream: what is committed next is not
	// delivered through it. "caught up" would tell the operator all is well.
	if r.TimeLag.State == StateCaughtUp && r.Slot.atRisk() {
		r.TimeLag.State, r.TimeLag.Seconds, r.TimeLag.slotAtRisk = StateUnknown, nil, true
	}
	for _, t := range cfg.Tables {
		tc := cfg
		tc.Table = t
		tl, err := queryTimeLag(ctx, q, tc, r.Checkpoint)
		if err != nil {
			return nil, err
		}
		if tl.State == StateCaughtUp && r.Slot.atRisk() {
			tl.State, tl.Seconds, tl.slotAtRisk = StateUnknown, nil, true
		}
		r.Tables = append(r.Tables, TableLag{Table: t, TimeLag: tl})
	}
	if r.Retry, err = QueryRetry(ctx, q, cfg.RetryTable, cfg.Slot); err != nil {
		return nil, err
	}
	if r.SlotGap, err = FindGap(ctx, q, cfg.CheckpointTable, cfg.Slot, cfg.Fix); err != nil {
		return nil, err
	}
	if r.Buffer, err = QueryBuffer(ctx, q, cfg.RetryTable, cfg.Slot); err != nil {
		return nil, err
	}
	return r, nil
}

// behind returns the transaction the relay recorded it reads when the
// checkpoint has not passed it (a relay that stopped mid-way leaves it: it is
// still undelivered), and lag plus its bytes.
func behind(cp *Checkpoint, lag *int64) (*Reading, *int64) {
	if cp == nil || cp.reading == nil || lag == nil {
		return nil, lag
	}
	commit, err1 := pglogrepl.ParseLSN(cp.reading.CommitLSN)
	saved, err2 := pglogrepl.ParseLSN(cp.LSN)
	if err1 != nil || err2 != nil || commit < saved {
		return nil, lag
	}
	b := *lag + cp.reading.Bytes
	return cp.reading, &b
}

func queryTimeLag(ctx context.Context, q Querier, cfg Config, cp *Checkpoint) (TimeLag, error) {
	var tl TimeLag
	t, err := resolveTable(ctx, q, cfg.Table)
	if err != nil {
		return tl, err
	}
	var since *time.Time
	if cp != nil {
		since = cp.LastCommitTime
		tl.LastDeliveredAgeSeconds = cp.lastDeliveredAge
	}
	if t == "" && cfg.TableOptional {
		tl.State = StateUnknown
		return tl, nil
	}
	if t == "" {
		return tl, fmt.Errorf("outbox table %q does not exist: check the table setting or run `outbox-relay setup`", cfg.Table)
	}
	col := sql.Ident(cfg.CreatedAtColumn)
	// A plain range condition (rather than "$1 IS NULL OR col > $1") lets the
	// planner use the created_at index.
	where := ""
	var args []any
	if since != nil {
		where = " WHERE " + col + " > $1"
		args = append(args, *since)
	}
	sql := "SELECT s.m, EXISTS (SELECT 1 FROM " + t + "), extract(epoch FROM now() - s.m)::float8 " +
		"FROM (SELECT min(" + col + ") AS m FROM " + t + where + ") s"
	var anyRow bool
	if err := q.QueryRow(ctx, sql, args...).Scan(&tl.OldestUndeliveredAt, &anyRow, &tl.Seconds); err != nil {
		return tl, fmt.Errorf("query outbox table %s: %w", t, err)
	}
	switch {
	case tl.OldestUndeliveredAt != nil:
		tl.State = StateBehind
		if *tl.Seconds < 0 { // created_at in the future: the server clock was set back
			*tl.Seconds = 0
		}
	case anyRow:
		tl.State = StateCaughtUp
		zero := 0.0
		tl.Seconds = &zero
	default:
		tl.State = StateUnknown
	}
	return tl, nil
}

// Columns of the retry table (issue #4) that QueryRetry reads.
const retrySelect = `SELECT count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'dead'),
       extract(epoch FROM now() - min(first_failed_at) FILTER (WHERE status = 'pending'))::float8
FROM `

// QueryRetry summarises the rows of slot in the retry table: those of other
// slots (other relays sharing the table) are theirs to report. It returns
// nil, nil when the table does not exist (the retry worker is not set up):
// that is not an error. A table of an earlier version, whose rows belong to
// no slot yet (the relay adopts them at start-up), is summarised whole.
func QueryRetry(ctx context.Context, q Querier, table, slot string) (*Retry, error) {
	t, err := resolveTable(ctx, q, table)
	if err != nil || t == "" {
		return nil, err
	}
	var owned bool
	if err := q.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute
WHERE attrelid = $1::regclass AND attname = 'slot_name' AND NOT attisdropped)`, t).Scan(&owned); err != nil {
		return nil, fmt.Errorf("query retry table %s: %w", t, err)
	}
	where, args := "", []any{}
	if owned {
		where, args = " WHERE slot_name = $1", []any{slot}
	}
	var r Retry
	if err := q.QueryRow(ctx, retrySelect+t+where, args...).Scan(&r.Pending, &r.Dead, &r.OldestPendingAgeSeconds); err != nil {
		return nil, fmt.Errorf("query retry table %s: %w", t, err)
	}
	return &r, nil
}

// SlotLag is what the metrics sampler exports of a slot (read with
// pgslot.Read): lag and retained WAL in bytes, and safe_wal_size (nil when
// unlimited).
type SlotLag struct {
	Active           bool
	LagBytes         *int64
	RetainedWALBytes *int64
	SafeWALSizeBytes *int64
	WALStatus        string // pg_replication_slots.wal_status; empty when unknown
}

// Status reports whether a relay is streaming cfg.Slot now and its last saved
// checkpoint. It returns an error wrapping pgslot.ErrNotFound when the slot does
// not exist.
func Status(ctx context.Context, q Querier, cfg Config) (*StatusReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	sr, err := querySlot(ctx, q, cfg.Slot)
	if err != nil {
		g, err := missingSlot(ctx, q, cfg, err)
		if g == nil {
			return nil, err
		}
		r := &StatusReport{SlotName: cfg.Slot, SlotGap: g}
		if r.CheckedAt, err = serverNow(ctx, q); err != nil {
			return nil, err
		}
		if r.Checkpoint, err = queryCheckpoint(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
			return nil, err
		}
		return r, nil
	}
	r := &StatusReport{
		SlotName:  cfg.Slot,
		CheckedAt: sr.now,
		Streaming: sr.slot.Active && sr.walsender,
		Slot:      sr.slot,
	}
	if sr.slot.ApplicationName != nil {
		r.Version = relayVersion(*sr.slot.ApplicationName)
	}
	if r.Checkpoint, err = queryCheckpoint(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
		return nil, err
	}
	if r.SlotGap, err = FindGap(ctx, q, cfg.CheckpointTable, cfg.Slot, cfg.Fix); err != nil {
		return nil, err
	}
	if r.Buffer, err = QueryBuffer(ctx, q, cfg.RetryTable, cfg.Slot); err != nil {
		return nil, err
	}
	return r, nil
}

// missingSlot turns a slot-not-found error into the gap run refuses
// (slot_missing, exit code 4, naming recover) when a checkpoint says events
// were delivered from it: the reports then say so, with what they can still
// read, rather than print nothing. Else it returns err (run setup).
func missingSlot(ctx context.Context, q Querier, cfg Config, err error) (*SlotGap, error) {
	if !errors.Is(err, pgslot.ErrNotFound) {
		return nil, err
	}
	if g, gerr := FindGap(ctx, q, cfg.CheckpointTable, cfg.Slot, cfg.Fix); gerr == nil && g != nil {
		return g, g.Err()
	}
	return nil, err
}

// missingLag is Lag's report on a slot that is missing though the checkpoint
// says events were delivered from it: the checkpoint, the retry table and
// the gap; no slot, so no WAL figures, and no time lag (what is committed now
// is not read by any slot).
func missingLag(ctx context.Context, q Querier, cfg Config, g *SlotGap) (*LagReport, error) {
	r := &LagReport{SlotName: cfg.Slot, SlotGap: g, TimeLag: TimeLag{State: StateUnknown}}
	var err error
	if r.CheckedAt, err = serverNow(ctx, q); err != nil {
		return nil, err
	}
	if r.Checkpoint, err = queryCheckpoint(ctx, q, cfg.CheckpointTable, cfg.Slot); err != nil {
		return nil, err
	}
	if r.Retry, err = QueryRetry(ctx, q, cfg.RetryTable, cfg.Slot); err != nil {
		return nil, err
	}
	return r, nil
}

func serverNow(ctx context.Context, q Querier) (time.Time, error) {
	var now time.Time
	if err := q.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
		return now, fmt.Errorf("read the server's time: %w", err)
	}
	return now, nil
}

// Problem is the error the report stands for, for the exit code: the slot
// gap (exit 4), else nil.
func (r *StatusReport) Problem() error {
	if r.SlotGap != nil {
		return r.SlotGap.Err()
	}
	return nil
}

// relayVersion extracts the relay version from an application_name of the form
// "outbox-relay/<version>". It returns nil for any other name, such as the
// bare default "outbox-relay" or another program holding the slot.
func relayVersion(applicationName string) *string {
	v, ok := strings.CutPrefix(applicationName, "outbox-relay/")
	if !ok || v == "" {
		return nil
	}
	return &v
}
