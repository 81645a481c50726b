package main

import (
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// reasonKeys are the config keys that bear on a retry row's reason, by its
// code (retry.Entry.ReasonCode). The router and the sink store reasons that
// say the fact without naming a key, so that renaming a key changes no
// stored text; the keys are said here, once, as hints.go says the fixes of
// errors. A code without an entry has nothing to add.
var reasonKeys = map[string]string{
	router.CodeEventTypeEmpty:         "the topic template is topics.template, the overrides topics.overrides",
	router.CodeTopicInvalid:           "the overrides are topics.overrides, the topic template topics.template",
	router.CodeTopicReplacement:       "the overrides are topics.overrides, the topic replacement topics.replacement",
	router.CodeMessageFieldKind:       "the fields are the keys outbox.columns.<field> name; an extra field is one of message.fields",
	sink.CodeMessageTooLarge:          "the relay's batch limit is kafka.batch_bytes",
	sink.CodeTopicMissing:             "the relay's topic auto-creation is kafka.allow_auto_topic_creation",
	sink.CodeTopicNotCreated:          "kafka.allow_auto_topic_creation is off",
	sink.CodeTopicNotAuthorizedCreate: "the relay's topic auto-creation is kafka.allow_auto_topic_creation",
	sink.CodeTopicInvalid:             "the routing is topics.template and topics.overrides",
}

// lastError is a retry row's reason as the operator reads it: the stored
// last_error and, for a code that has them, the config keys that bear on
// it. A row without a code (written by an earlier version) or with a code
// this version does not know is shown as stored.
func lastError(en retry.Entry) string {
	keys, ok := reasonKeys[en.ReasonCode]
	if !ok || en.LastError == "" {
		return en.LastError
	}
	return en.LastError + " (" + keys + ")"
}
