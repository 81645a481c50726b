package main

import (
	"context"

	"github.com/outbox-relay/outbox-relay/sink"
)

// validateSink lets the sink reject what only it knows to be wrong. sink.New
// neither dials nor starts goroutines.
func validateSink(cfg sink.Config) error {
	_, err := sink.New(cfg)
	return err
}

// pingKafka asks the brokers for metadata.
func pingKafka(ctx context.Context, cfg sink.Config) error {
	k, err := sink.New(cfg)
	if err != nil {
		return err
	}
	defer k.Close()
	return k.Ping(ctx)
}
