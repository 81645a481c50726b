package sink

import (
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/sinkapi"
)

// What a failure means is decided here, once, from Kafka's error codes as
// franz-go's kerr names them: the
// caller learns from a Failure whether writing the event again can succeed
// and what to tell the operator, and never needs Kafka's error codes.

// The contract's types (package sinkapi), under the names callers of sink
// have always used.
type (
	// A Failure is one event that failed on its own: sinkapi.Failure.
	Failure = sinkapi.Failure
	// WriteError lists the events of a Write that failed on their own:
	// sinkapi.WriteError.
	WriteError = sinkapi.WriteError
	// A Delivery is the outcome to come of a Send: sinkapi.Delivery.
	Delivery = sinkapi.Delivery
)

// ErrBehind is the error of a message that was not written because an
// earlier message with the same topic and key failed: sinkapi.ErrBehind.
var ErrBehind = sinkapi.ErrBehind

// judge fills in what each failure means, for the events Write was given.
func judge(fails []Failure, events []event.Event) {
	for i := range fails {
		f := &fails[i]
		f.Permanent = permanent(f.Err)
		f.Code, f.Reason = reason(f.Err, &events[f.Index])
	}
}

// The codes of a Failure (and a TopicError): what its Reason says, stable
// across versions. The CLI says each with the config keys that bear on it.
const (
	CodeBehind                   = "behind"                      // ErrBehind
	CodeMessageTooLarge          = "message_too_large"           // also the relay's batch limit must admit it
	CodeTopicMissing             = "topic_missing"               // Kafka does not know the topic
	CodeTopicNotCreated          = "topic_not_created"           // missing, and the relay's auto-creation is off
	CodeTopicNotAuthorized       = "topic_not_authorized"        // no WRITE or DESCRIBE
	CodeTopicNotAuthorizedCreate = "topic_not_authorized_create" // …or no CREATE, with auto-creation on
	CodeTopicInvalid             = "topic_invalid"               // an invalid or colliding topic name
	CodeKafkaRefused             = "kafka_refused"               // any other refusal
)

// kerrOf is the Kafka error code err carries, as franz-go's kerr error,
// nil when it carries none. The failure vocabulary is decided on kerr's
// errors, here, once.
func kerrOf(err error) *kerr.Error {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke
	}
	return nil
}

// permanent reports whether err, a Failure's error, will fail the same way
// when the message is written again (see Failure.Permanent). A *TopicError
// says itself.
func permanent(err error) bool {
	var te *TopicError
	if errors.As(err, &te) {
		return te.Permanent
	}
	switch kerrOf(err) {
	case kerr.MessageTooLarge,
		kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed,
		kerr.CorruptMessage,
		kerr.InvalidRecord,
		kerr.InvalidFetchSize,
		kerr.RecordListTooLarge,
		kerr.InvalidTimestamp,
		kerr.UnsupportedForMessageFormat,
		kerr.PolicyViolation:
		return true
	}
	return false
}

// perMessage reports whether err belongs to the messages it was returned for,
// rather than to the broker as a whole. An unknown topic always belongs to its
// topic: with auto-creation on it is also what Kafka answers for a name that
// collides with an existing topic, forever (see topic.go), so it is never
// waited for like an outage; topicFailure waits a bounded time for a topic
// that is being created.
func perMessage(err error) bool {
	return permanent(err) || kerrOf(err) == kerr.UnknownTopicOrPartition
}

// topicLevel reports whether err holds for every message of a topic, so that
// splitting a batch of one topic cannot isolate a culprit.
func topicLevel(err error) bool {
	switch kerrOf(err) {
	case kerr.UnknownTopicOrPartition, kerr.InvalidTopicException, kerr.TopicAuthorizationFailed:
		return true
	}
	return false
}

// reason says in plain words why Kafka refused e with err, a Failure's error,
// and what fixes it, and the code of what it says. It names no config key.
func reason(err error, e *event.Event) (code, text string) {
	// Each case appends err: for a *TopicError its text holds Kafka's own
	// words (a collision's, a policy's).
	if errors.Is(err, ErrBehind) {
		return CodeBehind, fmt.Sprintf("not written to topic %q: an earlier message with the same key failed, and it waits behind it", e.Topic)
	}
	switch kerrOf(err) {
	case kerr.MessageTooLarge, kerr.RecordListTooLarge:
		return CodeMessageTooLarge, fmt.Sprintf("the message (%d bytes) is larger than Kafka accepts for topic %q: raise the topic's max.message.bytes (and the relay's batch limit) and requeue it, or drop it (%v)",
			len(e.Key)+len(e.Value), e.Topic, err)
	case kerr.UnknownTopicOrPartition:
		// The topic check's reason knows whether the relay asked for
		// auto-creation and what the broker did: adding "the relay does
		// not create topics" to it contradicted it when it did.
		var te *TopicError
		if errors.As(err, &te) && te.Reason != "" {
			code := te.Code
			if code == "" {
				code = CodeTopicMissing
			}
			return code, fmt.Sprintf("topic %q %s", e.Topic, te.Reason)
		}
		return CodeTopicMissing, fmt.Sprintf("topic %q does not exist: create it (the relay's topic auto-creation also needs the broker's auto.create.topics.enable); retried with backoff (%v)",
			e.Topic, err)
	case kerr.TopicAuthorizationFailed:
		return CodeTopicNotAuthorized, fmt.Sprintf("the relay's Kafka user may not write to topic %q: grant it and requeue (%v)", e.Topic, err)
	case kerr.InvalidTopicException:
		return CodeTopicInvalid, fmt.Sprintf("%q is not a valid topic name: fix the topic config and requeue (%v)", e.Topic, err)
	}
	return CodeKafkaRefused, fmt.Sprintf("Kafka refused the message for topic %q: %v", e.Topic, err)
}
