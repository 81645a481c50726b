package main

import (
	"context"
	"io"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/ops"
)

func newStatusCmd(wrap wrapFunc) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Annotations: map[string]string{"kafka": "optional"},
		Use:         "status [--json]",
		Short:       "Show whether a relay is streaming the slot now, since when, which version",
		Long: `status reads the replication slot, pg_stat_replication and the relay's
checkpoint over an ordinary read-only connection. A relay is streaming when the
slot is active and held by a walsender; its version comes from the
application_name "outbox-relay/<version>" it connects with. Exits 0 whether or
not a relay is streaming (use --json and the "streaming" field in scripts), 1
when the check fails (cannot connect, slot missing and no checkpoint), 4 when
the slot does not continue from the relay's checkpoint (a slot gap: run refuses
to stream it; the report, with its slot_gap, is printed first; see
docs/failover.md).`,
		Args: cobra.NoArgs,
		RunE: wrap(func(cmd *cobra.Command, e *env, _ []string) error {
			return printReport(cmd.Context(), e, "outbox-relay status", asJSON, ops.Status)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (field names in docs/operating.md)")
	return cmd
}

// A report is a read-only view the CLI prints as text or, with --json, JSON.
type report interface{ WriteText(io.Writer) error }

// printReport reads a report over an ordinary read-only connection named
// app and prints it.
func printReport[R report](ctx context.Context, e *env, app string, asJSON bool, read func(context.Context, ops.Querier, ops.Config) (R, error)) error {
	conn, err := newOpsConn(e, app)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	r, err := read(ctx, conn, e.opsConfig())
	if err != nil {
		return err
	}
	if asJSON {
		err = ops.WriteJSON(e.stdout, r)
	} else {
		err = r.WriteText(e.stdout)
	}
	if err != nil {
		return err
	}
	// What the report found that the exit code says (status: a slot gap, 4),
	// printed first.
	if p, ok := any(r).(interface{ Problem() error }); ok {
		return p.Problem()
	}
	return nil
}
