package main

import (
	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/admin"
)

func newSetupCmd(wrap wrapFunc) *cobra.Command {
	var createOutbox bool
	cmd := &cobra.Command{
		Use:   "setup",
		Short: "Create the checkpoint and retry tables, publication and replication slot if missing",
		Long: `setup creates what the relay needs and is missing, and says what it found:
the checkpoint table, (with --create-outbox-table) the outbox table, the
publication of the outbox table (inserts only) and the logical replication slot
(pgoutput). It is safe to run again. It never alters what exists: a publication
that does not cover the outbox table is reported with the statement to fix it.

The slot retains WAL from the moment it exists until the relay confirms it:
run setup where the relay is about to run.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			return admin.Setup(cmd.Context(), e.adminConfig(), createOutbox, e.stdout)
		}),
	}
	cmd.Flags().BoolVar(&createOutbox, "create-outbox-table", false, "also create the outbox table (Debezium-compatible layout) if missing")
	return cmd
}
