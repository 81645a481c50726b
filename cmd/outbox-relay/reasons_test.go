package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// TestRetryReasonRendered: a retry row with a known code is shown with the
// config keys that bear on it (the router's and the sink's reasons name
// none: their tests assert the code); a row without a code (an earlier
// version's) or with an unknown code is shown as stored.
func TestRetryReasonRendered(t *testing.T) {
	const stored = `topic "orders" does not exist and the relay's topic auto-creation is off: create the topic; the event is retried`
	tests := []struct {
		code string
		want []string // in the rendered reason, after the stored text
	}{
		{sink.CodeTopicNotCreated, []string{"kafka.allow_auto_topic_creation is off"}},
		{sink.CodeTopicMissing, []string{"kafka.allow_auto_topic_creation"}},
		{sink.CodeTopicNotAuthorizedCreate, []string{"kafka.allow_auto_topic_creation"}},
		{sink.CodeMessageTooLarge, []string{"kafka.batch_bytes"}},
		{sink.CodeTopicInvalid, []string{"topics.template", "topics.overrides"}},
		{router.CodeTopicInvalid, []string{"topics.overrides", "topics.template"}},
		{router.CodeTopicReplacement, []string{"topics.overrides", "topics.replacement"}},
		{router.CodeEventTypeEmpty, []string{"topics.template", "topics.overrides"}},
		{router.CodeMessageFieldKind, []string{"outbox.columns.", "message.fields"}},
	}
	for _, tt := range tests {
		got := lastError(retry.Entry{LastError: stored, ReasonCode: tt.code})
		if !strings.HasPrefix(got, stored) {
			t.Errorf("lastError(code %q) = %q; want it to start with the stored text", tt.code, got)
		}
		for _, w := range tt.want {
			if !strings.Contains(strings.TrimPrefix(got, stored), w) {
				t.Errorf("lastError(code %q) = %q; want it to name %q", tt.code, got, w)
			}
		}
	}
	for _, code := range []string{"", "a_code_of_a_later_version", sink.CodeBehind} {
		if got := lastError(retry.Entry{LastError: stored, ReasonCode: code}); got != stored {
			t.Errorf("lastError(code %q) = %q; want the stored text %q", code, got, stored)
		}
	}
	if got := lastError(retry.Entry{ReasonCode: sink.CodeTopicMissing}); got != "" {
		t.Errorf("lastError(no text, code %q) = %q; want \"\"", sink.CodeTopicMissing, got)
	}
}

// Every key the rendered reasons name is a setting of this version: a key
// renamed in settings.go must be renamed here too.
func TestReasonKeysAreSettings(t *testing.T) {
	known := map[string]bool{}
	for _, s := range settings {
		known[s.key] = true
	}
	keyRe := regexp.MustCompile(`\b[a-z_]+\.[a-z_.<>]*[a-z_>]`)
	for code, text := range reasonKeys {
		keys := keyRe.FindAllString(text, -1)
		if len(keys) == 0 {
			t.Errorf("reasonKeys[%q] = %q names no setting", code, text)
		}
		for _, k := range keys {
			if strings.HasSuffix(k, ".<field>") {
				k = strings.TrimSuffix(k, "<field>") + "id" // outbox.columns.<field>: one of them
			}
			if !known[k] {
				t.Errorf("reasonKeys[%q] names %q, which is no setting", code, k)
			}
		}
	}
}
