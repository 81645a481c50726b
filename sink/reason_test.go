package sink

import (
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/event"
)

// A missing topic's reason says what the topic check found, once, and never
// that the relay does not create topics when it asked for auto-creation
// (issue 37 item 10: with the broker's auto-creation off the reason said both
// "the relay does not create topics: set kafka.allow_auto_topic_creation" and,
// nested, that it was on and the broker did not create the topic).
func TestMissingTopicReason(t *testing.T) {
	e := &event.Event{Topic: "orders"}
	tests := []struct {
		name    string
		err     error
		want    []string
		notWant []string
		code    string
	}{
		{"auto-creation on, broker did not create it",
			fmt.Errorf("write: %w", &TopicError{Topic: "orders", Err: kerr.UnknownTopicOrPartition,
				Reason: "does not exist and was not created within 5s: check the broker's auto.create.topics.enable and the relay's CREATE permission, or create the topic; the event is retried"}),
			[]string{`topic "orders" does not exist and was not created within 5s`, "auto.create.topics.enable"},
			[]string{"does not create topics", "set kafka.allow_auto_topic_creation", `topic "orders": `}, ""},
		{"auto-creation off",
			&TopicError{Topic: "orders", Err: kerr.UnknownTopicOrPartition, Code: CodeTopicNotCreated,
				Reason: "does not exist and the relay's topic auto-creation is off: create the topic; the event is retried"},
			[]string{`topic "orders" does not exist and the relay's topic auto-creation is off`},
			[]string{"does not create topics"}, CodeTopicNotCreated},
		{"bare Kafka error",
			kerr.UnknownTopicOrPartition,
			[]string{`topic "orders" does not exist: create it`, "auto.create.topics.enable"},
			[]string{"does not create topics"}, CodeTopicMissing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, got := reason(tt.err, e)
			if want := tt.code; want == "" {
				// A TopicError without a code is a missing topic's.
				if code != CodeTopicMissing {
					t.Errorf("reason code = %q; want %q", code, CodeTopicMissing)
				}
			} else if code != want {
				t.Errorf("reason code = %q; want %q", code, want)
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("reason = %q; want it to contain %q", got, w)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(got, w) {
					t.Errorf("reason = %q; want it without %q", got, w)
				}
			}
		})
	}
}
