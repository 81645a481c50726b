package main

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

// TestColumnsCheckedAtStart: a mapping the table cannot satisfy fails run at
// start, in check's words, never as a column "dropped while the relay ran".
// (check and setup on it: internal/admin's TestColumnsMappedWrong.)
func TestColumnsCheckedAtStart(t *testing.T) {
	dbEnv(t)
	t.Setenv("RELAY_KAFKA_BROKERS", kafkaBrokers(t))
	if code, out, errOut := run(t, "setup", "--create-outbox-table"); code != exitcode.OK {
		t.Fatalf("setup exit = %d\n%s%s", code, out, errOut)
	}
	t.Setenv("RELAY_OUTBOX_COLUMNS_PAYLOAD", "body")
	// The table has a column of that field's name in another layout: the
	// fix maps it.
	const want = `outbox table public.outbox: no column "body" (outbox.columns.payload); map them: set outbox.columns.payload: payload`
	code, _, errOut := run(t, "run")
	if code != exitcode.Failure || !strings.Contains(errOut, want) || strings.Contains(errOut, "while the relay ran") {
		t.Errorf("run = exit %d; want 1 at start with check's words %q\n%s", code, want, errOut)
	}
}

// TestDebeziumTableWithoutEventType: outbox.columns.event_type "-" maps no
// column, so nothing may use it: with the event_type header it is a usage
// error naming both keys. (What setup and check make of a Debezium table
// without "type": internal/admin's TestDebeziumTableWithoutEventType.)
func TestDebeziumTableWithoutEventType(t *testing.T) {
	dbEnv(t)
	t.Setenv("RELAY_OUTBOX_LAYOUT", "debezium")
	t.Setenv("RELAY_MESSAGE_HEADERS", "id,event_type")
	t.Setenv("RELAY_OUTBOX_COLUMNS_EVENT_TYPE", "-")
	code, _, errOut := run(t, "check")
	if code != exitcode.Usage || !strings.Contains(errOut, `outbox.columns.event_type: "-" (no event type column) but message.headers includes event_type`) {
		t.Errorf("check with event_type \"-\" and the event_type header: exit %d; want 2\n%s", code, errOut)
	}
}
