package event_test

import (
	"testing"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
)

func TestPositionKey(t *testing.T) {
	tests := []struct {
		lsn  pglogrepl.LSN
		n    int
		want string
	}{
		{0x16B3748, 3, "lsn:0/16B3748:3"},
		{0x1_0000_0000, 0, "lsn:1/0:0"},
		{0xFFFFFFFF_FFFFFFFF, 1<<31 - 1, "lsn:FFFFFFFF/FFFFFFFF:2147483647"},
	}
	for _, tt := range tests {
		if got := event.PositionKey(tt.lsn, tt.n); got != tt.want {
			t.Errorf("PositionKey(%s, %d) = %q; want %q", tt.lsn, tt.n, got, tt.want)
		}
	}
}

func TestLane(t *testing.T) {
	tests := []struct {
		e    event.Event
		want string
	}{
		{event.Event{Topic: "orders", Key: []byte("A-1")}, "orders/A-1"},
		{event.Event{Topic: "orders", Key: []byte("x/y")}, "orders/x/y"},
		{event.Event{Topic: "orders", Key: []byte{0xff, 0x00}}, "orders#ff00"},
		{event.Event{Topic: "", AggregateType: "Or der", AggregateID: "7", Key: []byte("7")}, "unroutable:Or der/7"},
		{event.Event{Topic: "orders", AggregateType: "Order"}, "unroutable:Order/"},
		{event.Event{AggregateType: "A\x00B", AggregateID: "\xff"}, "unroutable:A\uFFFDB/\uFFFD"},
	}
	for _, tt := range tests {
		if got := tt.e.Lane().String(); got != tt.want {
			t.Errorf("Lane(topic %q, key %q).String() = %q; want %q", tt.e.Topic, tt.e.Key, got, tt.want)
		}
	}
	// A lane is a map key: equal topic and key, equal lane.
	a := event.Event{Topic: "t", Key: []byte("k")}
	b := event.Event{Topic: "t", Key: []byte("k"), ID: "other"}
	if a.Lane() != b.Lane() {
		t.Errorf("lanes of the same topic and key differ: %v, %v", a.Lane(), b.Lane())
	}
}
