package main

import "github.com/outbox-relay/outbox-relay/sink"

// validateSink lets the sink reject what only it knows to be wrong. sink.New
// neither dials nor starts goroutines.
func validateSink(cfg sink.Config) error {
	_, err := sink.New(cfg)
	return err
}
