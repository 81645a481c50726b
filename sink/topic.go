package sink

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// What Kafka 3.9.1 was seen to answer, which the code below is built on:
//
//   - A topic that collides with an existing one (X_y when X.y exists; Kafka
//     treats '.' and '_' alike): metadata answers UNKNOWN_TOPIC_OR_PARTITION
//     forever, with or without auto-creation, in milliseconds. Only
//     CreateTopics says why: INVALID_TOPIC_EXCEPTION "Topic 'X_y' collides
//     with existing topic: X.y" (also with ValidateOnly).
//   - An invalid name ("bad name!"): with auto-creation on, metadata answers
//     INVALID_TOPIC_EXCEPTION without a message; with it off,
//     UNKNOWN_TOPIC_OR_PARTITION. The name is therefore checked here, with
//     Kafka's own rules, before anything is sent.
//   - A missing topic with auto-creation off: UNKNOWN_TOPIC_OR_PARTITION.
//   - A topic being auto-created: UNKNOWN_TOPIC_OR_PARTITION for a few hundred
//     milliseconds, then metadata with its partitions.
//   - CreateTopics with ValidateOnly is asked only with a short deadline,
//     when its answer is needed (a client library once waited for the
//     validated topic to appear, which it never does).

// topicPoll is the pause between two looks at a topic being created.
const topicPoll = 200 * time.Millisecond

// missingTTL is how long a topic that was waited for in vain fails at once,
// instead of holding up every later Write for TopicWait again. A topic
// created meanwhile is found by the round's metadata request (franz.go)
// before this is consulted.
const missingTTL = 30 * time.Second

// TopicError is the failure of a message whose topic Kafka will not take: its
// name is invalid or collides with an existing topic, it does not exist (and
// was not created in time), or the relay may not create or write it. It
// belongs to that topic alone: it never holds up other topics and is never
// taken for a broker outage.
type TopicError struct {
	Topic string
	// Reason says in plain words what is wrong and how to fix it, with
	// Kafka's own message when Kafka gave one. It names no config key.
	Reason string
	// Code names the reason (a Failure's Code).
	Code string
	// Err is Kafka's error code (kerr.InvalidTopicException,
	// kerr.UnknownTopicOrPartition, kerr.TopicAuthorizationFailed, …) for
	// errors.Is.
	Err error
	// Permanent tells whether writing again can succeed without changing the
	// event or its routing: true for an invalid or colliding name and for a
	// refused write; false for a missing topic (an operator may create it).
	Permanent bool
}

func (e *TopicError) Error() string { return fmt.Sprintf("topic %q: %s", e.Topic, e.Reason) }
func (e *TopicError) Unwrap() error { return e.Err }

// maxTopicLength is Kafka's limit (Topic.MAX_NAME_LENGTH).
const maxTopicLength = 249

// checkTopicName applies Kafka's rules for topic names
// (org.apache.kafka.common.internals.Topic.validate), so that an invalid name
// fails on its own whether or not auto-creation is on.
func checkTopicName(topic string) error {
	why := ""
	switch {
	case topic == "." || topic == "..":
		why = "'.' and '..' are not allowed"
	case len(topic) > maxTopicLength:
		why = fmt.Sprintf("it is %d characters long, the limit is %d", len(topic), maxTopicLength)
	default:
		for _, c := range []byte(topic) {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
				why = fmt.Sprintf("it contains %q; only ASCII letters, digits, '.', '_' and '-' are allowed", rune(c))
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return &TopicError{Topic: topic, Err: kerr.InvalidTopicException, Permanent: true, Code: CodeTopicInvalid,
		Reason: "invalid topic name: " + why + "; fix the routing or the aggregate type"}
}

// missing records a topic that was waited for in vain and its error.
type missing struct {
	err error
	at  time.Time
}

// topicFailure decides what to do with the messages of topic after Kafka
// answered cause (UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION or
// TOPIC_AUTHORIZATION_FAILED) for it: wait (true) because the topic is being
// created and this Write's wait for it has not run out, or fail them with the
// returned error. It returns ctx's error when ctx is done.
func (k *Kafka) topicFailure(ctx context.Context, st *writeState, topic string, cause error) (error, bool) {
	switch {
	case errors.Is(cause, kerr.TopicAuthorizationFailed):
		reason, code := "not authorized: grant the relay's principal WRITE and DESCRIBE on the topic", CodeTopicNotAuthorized
		if k.cfg.AllowAutoTopicCreation {
			// Kafka answers the same for a missing topic the principal may
			// describe but not create (auto-creation asks for CREATE).
			reason += ", and CREATE if the topic does not exist yet (or create it, or turn the relay's topic auto-creation off)"
			code = CodeTopicNotAuthorizedCreate
		}
		return &TopicError{Topic: topic, Err: cause, Permanent: true, Code: code, Reason: reason}, false
	case errors.Is(cause, kerr.InvalidTopicException):
		reason := "Kafka refuses the topic name as invalid"
		if msg, code := k.ValidateCreate(ctx, topic); code == kerr.InvalidTopicException && msg != "" {
			reason += ": " + msg
		}
		return &TopicError{Topic: topic, Err: cause, Permanent: true, Code: CodeTopicInvalid, Reason: reason}, false
	}
	if ctx.Err() != nil {
		return ctx.Err(), false
	}

	if m, ok := k.missing[topic]; ok {
		if time.Since(m.at) < missingTTL {
			return m.err, false
		}
		delete(k.missing, topic)
	}
	known, other := k.LookTopic(ctx, topic)
	if other != "" {
		// Kafka will never create it: say so in its own words if it answers.
		reason := fmt.Sprintf("the name collides with existing topic %q (Kafka treats '.' and '_' alike, so it refuses to create it)", other)
		if msg, code := k.ValidateCreate(ctx, topic); code == kerr.InvalidTopicException && msg != "" {
			reason = "the name collides with an existing topic (Kafka treats '.' and '_' alike): " + msg
		}
		return &TopicError{Topic: topic, Err: kerr.InvalidTopicException, Permanent: true, Code: CodeTopicInvalid,
			Reason: reason + "; fix the routing or rename a topic"}, false
	}
	if !known && !k.cfg.AllowAutoTopicCreation {
		// Remembered like a topic waited for in vain: LookTopic reads the
		// whole cluster's metadata, and a retry table of 100,000
		// aggregates waiting for this topic asked it once per write.
		err := &TopicError{Topic: topic, Err: cause, Code: CodeTopicNotCreated,
			Reason: "does not exist and the relay's topic auto-creation is off: create the topic; the event is retried"}
		k.rememberMissing(topic, err)
		return err, false
	}

	// Being created: by the broker (auto-creation) or, when the metadata
	// already lists it, just created and not yet served by its leaders.
	if st.since == nil {
		st.since = make(map[string]time.Time)
	}
	since, ok := st.since[topic]
	if !ok {
		since = time.Now()
		st.since[topic] = since
	}
	if time.Since(since) < k.cfg.TopicWait {
		return nil, true
	}

	reason := fmt.Sprintf("does not exist and was not created within %s: check the broker's auto.create.topics.enable and the relay's CREATE permission, or create the topic; the event is retried", k.cfg.TopicWait)
	msg, code := k.ValidateCreate(ctx, topic)
	switch {
	case ctx.Err() != nil:
		return ctx.Err(), false
	case code == kerr.TopicAlreadyExists && !known:
		// It appeared just now, after the cache was read: one more second
		// (the cache then knows it, so this is not repeated).
		st.since[topic] = time.Now().Add(time.Second - k.cfg.TopicWait)
		return nil, true
	case code == kerr.TopicAlreadyExists:
		reason = fmt.Sprintf("exists, but its partition leaders did not serve it within %s (UNKNOWN_TOPIC_OR_PARTITION): check the brokers' logs; the event is retried", k.cfg.TopicWait)
	case code == kerr.InvalidTopicException:
		return &TopicError{Topic: topic, Err: code, Permanent: true, Code: CodeTopicInvalid,
			Reason: "Kafka refuses to create it: " + msg + "; fix the routing"}, false
	case code != nil:
		if msg == "" {
			msg = code.Message
		}
		reason = fmt.Sprintf("does not exist and Kafka refuses to create it (%s): create it with settings the cluster accepts, or allow the relay to; the event is retried", msg)
	}
	err := &TopicError{Topic: topic, Err: kerr.UnknownTopicOrPartition, Code: CodeTopicMissing, Reason: reason}
	k.rememberMissing(topic, err)
	k.log.Warn("kafka topic missing", "topic", topic, "err", err)
	return err, false
}

// maxMissing bounds the topics remembered as missing: past it, those
// remembered longer than missingTTL ago are forgotten first.
const maxMissing = 1024

// rememberMissing makes topic fail with err for missingTTL without asking
// Kafka again (a topic created meanwhile is found by the metadata cache
// before this is consulted).
func (k *Kafka) rememberMissing(topic string, err error) {
	if k.missing == nil {
		k.missing = make(map[string]missing)
	}
	if len(k.missing) >= maxMissing {
		for t, m := range k.missing {
			if time.Since(m.at) >= missingTTL {
				delete(k.missing, t)
			}
		}
		if len(k.missing) >= maxMissing {
			clear(k.missing)
		}
	}
	k.missing[topic] = missing{err: err, at: time.Now()}
}
