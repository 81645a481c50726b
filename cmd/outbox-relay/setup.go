package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/admin"
)

func newSetupCmd(wrap wrapFunc) *cobra.Command {
	var (
		createOutbox bool
		printSQL     bool
		role         string
	)
	cmd := &cobra.Command{
		Use:   "setup [--create-outbox-table] [--print-sql [--role NAME]]",
		Short: "Create the checkpoint, retry and replay tables, publication and replication slot if missing",
		Long: `setup first checks what it cannot create: wal_level = logical, room for the
slot and a WAL sender, the role's REPLICATION attribute and a replication
connection. When one fails it prints check's FAIL lines, creates and changes
nothing, and exits 1.

Then it creates what the relay needs and is missing, and says what it found:
the checkpoint table and its history, the retry table, the replay table, (with
--create-outbox-table) the outbox table, the publication of the outbox table
(inserts only), with delivery: exactly-once the Kafka checkpoint topic
(compacted), and the logical replication slot (pgoutput). It is safe to run
again. It never alters what exists: a publication that does not cover the
outbox table is reported with the statement to fix it.

The slot retains WAL from the moment it exists until the relay confirms it:
run setup where the relay is about to run.

--print-sql connects nowhere: it prints the same statements for the
configured names, each idempotent, plus what the relay's role needs (LOGIN
REPLICATION and the GRANTs; the role is the user of postgres.dsn, or --role),
for a DBA to run as the tables' owner or a superuser. The relay then runs
without superuser; "outbox-relay check" names any grant still missing.`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			if role != "" && !printSQL {
				return usageErrorf("--role only applies to --print-sql")
			}
			if printSQL {
				return admin.PrintSQL(e.adminConfig(), role, createOutbox, e.stdout)
			}
			cfg := e.adminConfig()
			if cfg.ExactlyOnce {
				// The checkpoint topic of delivery: exactly-once.
				ks, closeSinks, err := newSinks(e.cfg.sinkConfig(e.log), 1)
				if err != nil {
					return fmt.Errorf("%w: %w", errConfig, err)
				}
				defer closeSinks()
				cfg.Topics = ks[0]
			}
			return admin.Setup(cmd.Context(), cfg, createOutbox, e.stdout)
		}),
	}
	cmd.Flags().BoolVar(&createOutbox, "create-outbox-table", false, "also create the outbox table if missing, in outbox.layout's layout (the relay's own columns by default; debezium for Debezium's)")
	cmd.Flags().BoolVar(&printSQL, "print-sql", false, "print the statements (and the grants of the relay's role) for a DBA instead of running them; connects nowhere")
	cmd.Flags().StringVar(&role, "role", "", "with --print-sql: the role to grant to (default: the user of postgres.dsn)")
	return cmd
}
