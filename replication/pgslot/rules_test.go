package pgslot_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/replication/pgslot"
)

func TestUsable(t *testing.T) {
	ok := pgslot.Slot{Name: "s", Type: "logical", Plugin: "pgoutput", Database: "db", CurrentDatabase: "db"}
	tests := []struct {
		name   string
		change func(*pgslot.Slot)
		want   error // nil: usable
		text   string
	}{
		{"usable", func(*pgslot.Slot) {}, nil, ""},
		{"physical", func(s *pgslot.Slot) { s.Type, s.Plugin, s.Database = "physical", "", "" }, pgslot.ErrPlugin, `"s" is a physical slot`},
		{"plugin", func(s *pgslot.Slot) { s.Plugin = "wal2json" }, pgslot.ErrPlugin, `uses plugin "wal2json", not pgoutput`},
		{"database", func(s *pgslot.Slot) { s.Database = "other" }, pgslot.ErrDatabase, `belongs to database "other", not "db"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := ok
			tt.change(&s)
			err := s.Usable()
			if tt.want == nil {
				if err != nil {
					t.Errorf("Usable() = %v; want nil", err)
				}
				return
			}
			var u *pgslot.UnusableError
			if !errors.Is(err, tt.want) || !errors.As(err, &u) || !strings.Contains(err.Error(), tt.text) {
				t.Errorf("Usable() = %v; want an *UnusableError wrapping %v saying %q", err, tt.want, tt.text)
			}
		})
	}
}

func TestReached(t *testing.T) {
	s := pgslot.Slot{CurrentWALLSN: "0/100"}
	for _, at := range []string{"0/0", "0/FF", "0/100"} {
		if err := s.Reached(lsn(t, at)); err != nil {
			t.Errorf("Reached(%s) at 0/100 = %v; want nil", at, err)
		}
	}
	var b *pgslot.BeyondWALError
	if err := s.Reached(lsn(t, "0/101")); !errors.As(err, &b) || b.Current != lsn(t, "0/100") ||
		!strings.Contains(err.Error(), "0/101 is beyond the server's current WAL position 0/100") {
		t.Errorf("Reached(0/101) at 0/100 = %v; want a *BeyondWALError", err)
	}
	if err := (pgslot.Slot{}).Reached(1); err == nil || errors.As(err, &b) {
		t.Errorf("Reached on a slot read without a WAL position = %v; want a parse error", err)
	}
}
