package pgslot

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/checkpoint"
)

func TestHosts(t *testing.T) {
	for _, tc := range []struct {
		dsn  string
		want []string
	}{
		{"postgres://u@a:5432,b:5433/db?target_session_attrs=read-write", []string{"a:5432", "b:5433"}},
		{"host=a,b port=5432,5433 dbname=db target_session_attrs=read-write", []string{"a:5432", "b:5433"}},
		// sslmode=prefer gives each host two entries (TLS, then plain): one host each.
		{"host=a,b port=5432 dbname=db sslmode=prefer", []string{"a:5432", "b:5432"}},
		{"postgres://u@a/db", []string{"a:5432"}},
	} {
		hosts, err := Hosts(tc.dsn)
		if err != nil {
			t.Fatalf("Hosts(%q): %v", tc.dsn, err)
		}
		var got []string
		for _, h := range hosts {
			got = append(got, h.Addr)
			if c := h.Config(); c.ValidateConnect != nil || len(c.Fallbacks) > 1 {
				t.Errorf("Hosts(%q): host %s keeps ValidateConnect or other hosts; want it reachable alone, any role", tc.dsn, h.Addr)
			}
		}
		if strings.Join(got, " ") != strings.Join(tc.want, " ") {
			t.Errorf("Hosts(%q) = %v; want %v", tc.dsn, got, tc.want)
		}
	}
}

func TestSuperseded(t *testing.T) {
	srv := Server{Server: checkpoint.Server{SystemID: "7", Timeline: 1}, History: true}
	newer := Server{Server: checkpoint.Server{SystemID: "7", Timeline: 2}, Forks: []Fork{{Timeline: 1, End: 0x3000}}, History: true}
	if err := Superseded("s", 0x2000, srv, newer, "b:5432"); err == nil {
		t.Fatalf("Superseded(timeline 1, other on timeline 2 of the same system) = nil; want a gap")
	} else if gap := err.(*GapError); gap.Cause != CauseSuperseded || gap.Fork != 0x3000 || !errors.Is(err, ErrGap) ||
		!strings.Contains(err.Error(), "old primary") || !strings.Contains(err.Error(), "b:5432") {
		t.Errorf("Superseded: %+v, %q; want cause server_superseded, fork 0/3000, ErrGap, naming the old primary and b:5432", gap, err)
	}
	for _, other := range []Server{
		srv, // the same server, or a standby of it
		{Server: checkpoint.Server{SystemID: "8", Timeline: 2}}, // another system
		{Server: checkpoint.Server{SystemID: "7", Timeline: 1}},
		{}, // not identified
	} {
		if err := Superseded("s", 0x2000, newer, other, "x"); err != nil {
			t.Errorf("Superseded(timeline 2, other %+v) = %v; want nil", other, err)
		}
	}
}

func TestFailoverUnsupported(t *testing.T) {
	err := FailoverUnsupported(150007)
	for _, want := range []string{"Postgres 15.7", "refill a lost slot", "Postgres 17"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("FailoverUnsupported(150007) = %q; want it to contain %q", err, want)
		}
	}
}
