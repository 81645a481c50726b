package router_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/field"
	"github.com/outbox-relay/outbox-relay/router"
)

// TestEventTypeOptional: the event type column is needed only when the
// event_type header or an {event_type} template reads it; "-" maps none,
// and then nothing may read it.
func TestEventTypeOptional(t *testing.T) {
	dbz := router.Columns{ID: "id", AggregateType: "aggregatetype", AggregateID: "aggregateid", EventType: "type", Payload: "payload", Headers: "-"}
	tests := []struct {
		name    string
		cfg     router.Config
		uses    bool
		wantErr string
	}{
		{"debezium headers", router.Config{Columns: dbz, Headers: []string{"id"}}, false, ""},
		{"event_type header", router.Config{Columns: dbz, Headers: []string{"id", "event_type"}}, true, ""},
		{"template", router.Config{Columns: dbz, Headers: []string{"id"}, Topic: "t.{event_type}"}, true, ""},
		{"dash", router.Config{Columns: withEventType(dbz, "-"), Headers: []string{"id"}}, false, ""},
		{"dash with header", router.Config{Columns: withEventType(dbz, "-"), Headers: []string{"id", "event_type"}}, false,
			`Columns.EventType: "-" (no event type column) but Headers includes event_type`},
		{"dash with template", router.Config{Columns: withEventType(dbz, "-"), Headers: []string{"id"}, Topic: "t.{event_type}"}, false,
			`uses {event_type}`},
		{"dash for payload", router.Config{Columns: router.Columns{Payload: "-"}}, false, `only the headers and event type columns may be disabled`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := router.New(tt.cfg)
			cfg := tt.cfg
			verr := cfg.Validate()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New = %v; want an error with %q", err, tt.wantErr)
				}
				var fe *field.Error
				if !errors.As(verr, &fe) || !strings.Contains(fe.Error(), tt.wantErr) {
					t.Errorf("Validate = %v; want the *field.Error New reports, with %q", verr, tt.wantErr)
				}
				return
			}
			if verr != nil {
				t.Errorf("Validate = %v; want nil, as New", verr)
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := r.UsesEventType(); got != tt.uses {
				t.Errorf("UsesEventType() = %v; want %v", got, tt.uses)
			}
			needsType := false
			for _, n := range r.Needs() {
				needsType = needsType || n.Key == "outbox.columns.event_type"
			}
			if needsType != tt.uses {
				t.Errorf("Needs() includes the event type column = %v; want %v", needsType, tt.uses)
			}
		})
	}
}

func withEventType(c router.Columns, name string) router.Columns {
	c.EventType = name
	return c
}
