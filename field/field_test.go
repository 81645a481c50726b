package field_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/field"
)

func TestWithinAndText(t *testing.T) {
	err := field.Within("Sink", errors.Join(
		field.Errorf("RetryMax", "1ms is below {RetryMin} 1s"),
		field.Required("Brokers", "give one"),
		errors.New("not a field"),
	))
	fes, others := field.All(fmt.Errorf("relay: %w", err))
	if len(fes) != 2 || len(others) != 1 {
		t.Fatalf("All = %v, %v; want 2 field errors and 1 other", fes, others)
	}
	if fes[0].Field != "Sink.RetryMax" || fes[0].Error() != "Sink.RetryMax: 1ms is below Sink.RetryMin 1s" {
		t.Errorf("Within(Sink, RetryMax) = %q (field %s); want Sink.RetryMax naming Sink.RetryMin", fes[0], fes[0].Field)
	}
	if got := fes[0].Text(func(f string) string { return "<" + f + ">" }); got != "1ms is below <Sink.RetryMin> 1s" {
		t.Errorf("Text = %q; want the reference renamed", got)
	}
	if !errors.Is(fes[1], field.ErrRequired) || fes[1].Field != "Sink.Brokers" {
		t.Errorf("Within(Sink, Required(Brokers)) = %v; want Sink.Brokers, ErrRequired", fes[1])
	}
	var fe *field.Error
	if !errors.As(err, &fe) {
		t.Errorf("errors.As(%v, *field.Error) = false", err)
	}
}

func TestChecker(t *testing.T) {
	var v field.Checker
	d, n, s := time.Duration(0), -1, ""
	field.Positive(&v, "Interval", &d, time.Second)
	field.Positive(&v, "BatchSize", &n, 10)
	field.OneOf(&v, "Mode", &s, "a", "a", "b")
	if d != time.Second || s != "a" {
		t.Errorf("defaults: Interval %s, Mode %q; want 1s, a", d, s)
	}
	s = "c"
	field.OneOf(&v, "Mode", &s, "a", "a", "b")
	fes, _ := field.All(v.Err())
	if len(fes) != 2 || fes[0].Error() != "BatchSize: -1 is negative; use a positive value such as 10, or leave it unset for the default" ||
		fes[1].Error() != `Mode: "c" is not one of a, b` {
		t.Errorf("Checker.Err() = %v; want BatchSize negative and Mode not one of a, b", v.Err())
	}
}

// A regex's \p{Alpha} quoted in a reason is not a field reference.
func TestTextLeavesUnicodeProperties(t *testing.T) {
	e := field.Errorf("TopicRegex", `%q: see {TopicReplacement}`, `\p{Alpha}+\P{Upper}`)
	if got, want := e.Text(nil), `"\\p{Alpha}+\\P{Upper}": see TopicReplacement`; got != want {
		t.Errorf("Text = %s; want %s", got, want)
	}
}
