package replication

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestQuoteLiteral(t *testing.T) {
	tests := []struct{ in, want string }{
		{"outbox_relay", "'outbox_relay'"},
		{"it's", "'it''s'"},
		{"''", "''''''"},
	}
	for _, tt := range tests {
		if got := quoteLiteral(tt.in); got != tt.want {
			t.Errorf("quoteLiteral(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{DSN: "postgres://x", Slot: "relay_slot", Publication: "pub"}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"valid", func(*Config) {}, ""},
		{"no DSN", func(c *Config) { c.DSN = "" }, "DSN: empty"},
		{"slot with a dash", func(c *Config) { c.Slot = "relay-slot" }, `Slot: slot name "relay-slot" may contain only`},
		{"slot injection", func(c *Config) { c.Slot = "x LOGICAL 0/0; DROP" }, "may contain only"},
		{"no publication", func(c *Config) { c.Publication = "" }, "Publication: empty"},
		{"backoff inverted", func(c *Config) { c.ReconnectMin = time.Minute }, "below ReconnectMin"},
		{"negative rows", func(c *Config) { c.MaxBatchRows = -1 }, "must not be negative"},
		{"unread too long", func(c *Config) { c.MaxUnread = 2 * time.Minute }, "MaxUnread: 2m0s is outside 0 (the default, 5s) to 1m0s"},
		{"negative unread", func(c *Config) { c.MaxUnread = -time.Second }, "MaxUnread: -1s is outside"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.withDefaults().validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Errorf("validate() = %v; want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("validate() = %v; want an error containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := Config{}.withDefaults()
	if c.ApplicationName != "outbox-relay" || c.StatusInterval != 10*time.Second/3 || c.WalSenderTimeout != 10*time.Second || c.MaxBatchRows != 1000 ||
		c.MaxBatchBytes != 1<<20 || c.ReconnectMin != 100*time.Millisecond || c.ReconnectMax != 10*time.Second || c.MaxUnread != 5*time.Second || c.Logger == nil {
		t.Errorf("Config{}.withDefaults() = %+v; want the documented defaults", c)
	}
}

func TestRunInvalidConfig(t *testing.T) {
	err := New(Config{}).Run(t.Context(), 0, make(chan Batch))
	if !errors.Is(err, ErrConfig) {
		t.Errorf("Run with an empty Config = %v; want ErrConfig", err)
	}
}

func TestConfirmNeverMovesBack(t *testing.T) {
	s := New(Config{})
	for _, lsn := range []uint64{10, 30, 20, 0} {
		s.Confirm(pglogrepl.LSN(lsn))
	}
	if got := s.Stats().ConfirmedLSN; got != 30 {
		t.Errorf("ConfirmedLSN after Confirm(10, 30, 20, 0) = %s; want 0/1E", got)
	}
}

func TestClassify(t *testing.T) {
	s := New(Config{Slot: "relay_slot", Publication: "pub"})
	tests := []struct {
		name  string
		err   error
		want  error // nil: retryable
		fatal bool
	}{
		{"auth", &pgconn.PgError{Code: "28P01", Message: "password authentication failed"}, ErrAuth, true},
		{"no hba entry", &pgconn.PgError{Code: "28000", Message: "no pg_hba.conf entry for replication connection"}, ErrAuth, true},
		{"no replication role", &pgconn.PgError{Code: "42501", Message: "must be superuser or replication role"}, ErrPermission, true},
		{"slot missing", &pgconn.PgError{Code: "42704", Message: `replication slot "relay_slot" does not exist`}, ErrSlotMissing, true},
		{"publication missing", &pgconn.PgError{Code: "42704", Message: `publication "pub" does not exist`}, ErrPublicationMissing, true},
		{"slot busy", &pgconn.PgError{Code: "55006", Message: "replication slot is active for PID 7"}, errSlotBusy, false},
		{"terminated", &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"}, nil, false},
		{"network", errors.New("read: connection reset by peer"), nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.classify("op", tt.err)
			if got := isFatal(err); got != tt.fatal {
				t.Errorf("isFatal(classify(%v)) = %v; want %v", tt.err, got, tt.fatal)
			}
			if tt.want != nil && !errors.Is(err, tt.want) {
				t.Errorf("classify(%v) = %v; want it to wrap %v", tt.err, err, tt.want)
			}
			if !errors.Is(err, tt.err) {
				t.Errorf("classify(%v) = %v; want it to wrap the cause", tt.err, err)
			}
		})
	}
}

func TestSkippedPublication(t *testing.T) {
	tests := []struct {
		name string
		n    *pgconn.Notice
		want bool
	}{
		{"Postgres 18 warning", &pgconn.Notice{Severity: "WARNING", Code: "55000", Message: `skipped loading publication "pub"`,
			Detail: "The publication does not exist at this point in the WAL."}, true},
		{"other 55000 notice", &pgconn.Notice{Severity: "WARNING", Code: "55000", Message: "replication slot is inactive"}, false},
		{"same words, other code", &pgconn.Notice{Severity: "NOTICE", Code: "00000", Message: `skipped loading publication "pub"`}, false},
		{"nil", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := SkippedPublication(tt.n); got != tt.want {
				t.Errorf("SkippedPublication(%+v) = %v; want %v", tt.n, got, tt.want)
			}
		})
	}
}
