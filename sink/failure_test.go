package sink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outbox-relay/outbox-relay/event"
)

// What a Kafka error means for the event: the one place that knows.
func TestPermanent(t *testing.T) {
	tests := []struct {
		err  error
		want bool
	}{
		{kerr.MessageTooLarge, true},
		{fmt.Errorf("%w (uncompressed_bytes=3145800, compressed_bytes=3145800)", kerr.MessageTooLarge), true}, // as kgo wraps it
		{kerr.CorruptMessage, true},
		{fmt.Errorf("topic %q: %w", "x", kerr.InvalidTopicException), true},
		{kerr.LeaderNotAvailable, false},
		{kerr.NetworkException, false},
		{kgo.ErrRecordTimeout, false},
		{context.DeadlineExceeded, false},
		{errors.New("dial tcp 127.0.0.1:1: connection refused"), false},
		{kerr.RecordListTooLarge, true},
		{kerr.InvalidTopicException, true},
		{fmt.Errorf("produce: %w", kerr.TopicAuthorizationFailed), true},
		{kerr.InvalidRecord, true},
		{kerr.PolicyViolation, true},
		{kerr.UnknownTopicOrPartition, false},
		{kerr.NotEnoughReplicas, false},
		{kerr.NotLeaderForPartition, false},
		{kerr.RequestTimedOut, false},
	}
	for _, tt := range tests {
		if got := permanent(tt.err); got != tt.want {
			t.Errorf("permanent(%q) = %t; want %t", tt.err, got, tt.want)
		}
	}
}

func TestJudge(t *testing.T) {
	events := []event.Event{{Topic: "orders", Key: []byte("k"), Value: make([]byte, 10)}, {Topic: "orders", Key: []byte("k")}, {Topic: "x"}}
	fails := []Failure{
		{Index: 0, Err: fmt.Errorf("%w (uncompressed_bytes=40, compressed_bytes=40)", kerr.MessageTooLarge)},
		{Index: 1, Err: ErrBehind},
		{Index: 2, Err: kerr.UnknownTopicOrPartition},
		{Index: 0, Err: kerr.MessageTooLarge},
		{Index: 2, Err: fmt.Errorf("produce: %w", kerr.TopicAuthorizationFailed)},
	}
	judge(fails, events)
	want := []struct {
		permanent bool
		reason    string
	}{
		{true, `the message (11 bytes) is larger than Kafka accepts for topic "orders"`},
		{false, "an earlier message with the same key failed"},
		{false, `topic "x" does not exist`},
		{true, `the message (11 bytes) is larger than Kafka accepts for topic "orders"`},
		{true, `may not write to topic "x"`},
	}
	for i, f := range fails {
		if f.Permanent != want[i].permanent || !strings.Contains(f.Reason, want[i].reason) {
			t.Errorf("failure %d (%v): Permanent %t, Reason %q; want %t and a reason containing %q", i, f.Err, f.Permanent, f.Reason, want[i].permanent, want[i].reason)
		}
	}
}
