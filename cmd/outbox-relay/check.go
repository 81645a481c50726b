package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/admin"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/sql"
)

func newCheckCmd(wrap wrapFunc) *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "Check that Postgres and Kafka are ready for the relay",
		Long: `check prints one line per preflight check, "ok" or "FAIL" with what to do,
and exits 1 if any failed. It changes nothing.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			ks, closeSinks, err := newSinks(e.cfg.sinkConfig(e.log), 1)
			if err != nil {
				return fmt.Errorf("%w: %w", errConfig, err)
			}
			defer closeSinks()
			if w := configFileWarning(e.cfg.file, e.cfg.fileSecrets); w != "" {
				fmt.Fprintf(e.stdout, "warn  config file: %s\n", ops.Printable(w))
			}
			if admin.Check(cmd.Context(), e.adminConfig(), ks[0], e.stdout) > 0 {
				return errReported
			}
			return nil
		}),
	}
}

// adminConfig names what setup and check work on.
func (e *env) adminConfig() admin.Config {
	c := e.cfg
	// The names were validated with the configuration.
	outbox, _ := sql.ParseTable(c.Table)
	checkpoint, _ := sql.ParseTable(c.CheckpointTable)
	retryTable, _ := sql.ParseTable(c.RetryTable)
	var more []admin.Table
	for i, t := range c.Tables {
		name, _ := sql.ParseTable(t.Table)
		more = append(more, admin.Table{Name: name, Layout: c.TableLayouts[i], Columns: sql.Columns(t.Router.Columns), Router: t.Router})
	}
	return admin.Config{
		Tables:              more,
		DSN:                 c.Replication.DSN,
		ReplicationDSN:      c.Replication.ReplicationDSN,
		Slot:                c.Replication.Slot,
		Publication:         c.Replication.Publication,
		Failover:            c.Failover,
		OutboxTable:         outbox,
		MessagesOnly:        c.Source == relay.SourceMessages,
		Messages:            len(c.Replication.MessagePrefixes) > 0,
		Layout:              c.Layout,
		Columns:             sql.Columns(c.Router.Columns),
		Router:              c.routerConfig(),
		CheckpointTable:     checkpoint,
		RetryTable:          retryTable,
		Kafka:               c.sinkConfig(e.log),
		ExactlyOnce:         c.Delivery == relay.DeliveryExactlyOnce,
		CheckpointTopic:     c.CheckpointTopic,
		TransactionalID:     relay.TransactionalID(c.Replication.Slot),
		Retention:           c.Retention.Retention,
		RetentionPartitions: c.Retention.Partitions,
		MaxRetainedWAL:      c.MaxRetainedWAL,
		RedactedDSN:         redactDSN(c.Replication.DSN),
		Fix:                 hint,
		Text:                operatorText,
	}
}
