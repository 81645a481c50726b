// Package cloudeventstest proves that an off-the-shelf CloudEvents consumer, the
// CloudEvents Go SDK's Kafka binding, reads the events the outbox-relay binary
// writes.
//
// It is a module of its own (go.mod here) because that binding is built on
// sarama (github.com/IBM/sarama): the product's module carries one Kafka client,
// franz-go, and its tests read Kafka with it too. `make test` runs this module's
// tests after the product's, on the same dev servers (internal/testenv, imported
// through the replace directive).
package cloudeventstest
