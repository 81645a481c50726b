package main

import "testing"

func TestScrubberTokens(t *testing.T) {
	s := newScrubber("relay")
	tests := []struct{ in, want string }{
		{"slot outbox_relay", "slot outbox_relay"},
		{"run `outbox-relay setup`", "run `outbox-relay setup`"},
		{"relayed 3 events", "relayed 3 events"},
		{"postgres://app:relay@db:5432/x", "postgres://app:xxxxx@db:5432/x"},
		{"password=relay host=db", "password=xxxxx host=db"},
		{"relay", "xxxxx"},
		{"'relay'", "'xxxxx'"},
	}
	for _, tt := range tests {
		if got := s.String(tt.in); got != tt.want {
			t.Errorf("scrub(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	s = newScrubber("p@ss word")
	if got, want := s.String("postgres://u:p%40ss%20word@h/x and p@ss word"), "postgres://u:xxxxx@h/x and xxxxx"; got != want {
		t.Errorf("scrub of escaped forms = %q; want %q", got, want)
	}
}
