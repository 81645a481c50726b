package sinkapi_test

import (
	"context"
	"errors"
	"testing"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sinkapi"
)

var errRefused = errors.New("refused")

func ev(key, value string) event.Event {
	return event.Event{Topic: "t", Key: []byte(key), Value: []byte(value)}
}

// A refused event fails alone, permanently; later events of its lane fail
// with ErrBehind, in its write and in the writes sent before its Wait
// returned; other lanes are acknowledged; once every Send was waited for,
// the lane is free again.
func TestMemoryKeepsTheLaneRules(t *testing.T) {
	m := &sinkapi.Memory{Refuse: func(e *event.Event) error {
		if string(e.Value) == "a2" {
			return errRefused
		}
		return nil
	}}
	ctx := context.Background()
	d1 := m.Send(ctx, []event.Event{ev("a", "a1"), ev("a", "a2"), ev("b", "b1"), ev("a", "a3")})
	d2 := m.Send(ctx, []event.Event{ev("a", "a4"), ev("b", "b2")})
	var we *sinkapi.WriteError
	if err := d1.Wait(ctx); !errors.As(err, &we) || len(we.Failures) != 2 {
		t.Fatalf("first Wait = %v; want a *WriteError of a2 and a3", err)
	}
	if f := we.Failures[0]; f.Index != 1 || !f.Permanent || !errors.Is(f.Err, errRefused) {
		t.Errorf("failure 0 = %+v; want index 1, permanent, the refusal", f)
	}
	if f := we.Failures[1]; f.Index != 3 || f.Permanent || !errors.Is(f.Err, sinkapi.ErrBehind) {
		t.Errorf("failure 1 = %+v; want index 3, not permanent, ErrBehind", f)
	}
	if err := d2.Wait(ctx); !errors.As(err, &we) || len(we.Failures) != 1 || we.Failures[0].Index != 0 || !errors.Is(we.Failures[0].Err, sinkapi.ErrBehind) {
		t.Fatalf("second Wait = %v; want a4 behind, b2 acknowledged", err)
	}
	if err := m.Write(ctx, []event.Event{ev("a", "a5")}); err != nil {
		t.Fatalf("Write after every Send was waited for = %v; want nil", err)
	}
	var got []string
	for _, e := range m.Acked() {
		got = append(got, string(e.Value))
	}
	want := []string{"a1", "b1", "b2", "a5"}
	if len(got) != len(want) {
		t.Fatalf("acknowledged %q; want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("acknowledged %q; want %q", got, want)
		}
	}
}
