package router

// Columns names the outbox table's columns. Empty fields take the
// Debezium-compatible defaults: id, aggregate_type, aggregate_id, event_type,
// payload, headers.
type Columns struct {
	ID            string
	AggregateType string
	AggregateID   string
	EventType     string
	Payload       string
	Headers       string
}

// Config configures a Router.
type Config struct {
	Columns   Columns
	Topic     string            // template, default "outbox.event.{aggregate_type}"; placeholders {aggregate_type}, {event_type}
	Overrides map[string]string // exact aggregate_type → topic
}
