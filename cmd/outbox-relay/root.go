package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/ops"
)

// version is set at build time: go build -ldflags "-X main.version=v1.2.3".
var version = "dev"

// errConfig marks configuration errors, for the exit code.
var errConfig = errors.New("configuration")

// usageErrorf reports a bad command line found by a command itself (a flag
// value or argument cobra cannot judge): exit 2, like cobra's own findings.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: %w", errConfig, fmt.Errorf(format, args...))
}

// errReported means the command already printed why it failed.
var errReported = errors.New("failed")

// env is what every command gets once the configuration is loaded.
type env struct {
	cfg    *config
	log    *slog.Logger
	stdout io.Writer
}

// execute runs the command line and returns the exit code. It writes errors to
// stderr as they are: no error carries a secret (secrets.go).
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	// cobra runs persistent pre-run hooks only once the command line parsed:
	// known command, known flags with valid values, argument count accepted.
	// An error before that point is the operator's usage error (exit 2, as
	// docs/commands.md promises), never a runtime failure.
	parsed := false
	root.PersistentPreRun = func(*cobra.Command, []string) { parsed = true }
	cmd, err := root.ExecuteContextC(context.Background())
	switch {
	case err == nil:
		return exitcode.OK
	case errors.Is(err, errReported):
		return exitcode.Failure
	}
	fmt.Fprintf(stderr, "outbox-relay: %s\n", ops.PrintableText(operatorText(err)))
	if fix := hint(err); fix != "" {
		fmt.Fprintf(stderr, "outbox-relay: to fix: %s\n", fix)
	}
	if !parsed {
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitcode.Usage
	}
	// lag's threshold breach has a code of its own (3), so probes can tell
	// "behind" from "set up wrong" (2) and "failed" (1).
	var coded exitcode.Coder
	if !errors.As(err, &coded) && errors.Is(err, errConfig) {
		return exitcode.Usage
	}
	return exitcode.Of(err)
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	var configFile string
	root := &cobra.Command{
		Use:   "outbox-relay",
		Short: "Relay outbox-table inserts from the Postgres WAL to Kafka",
		Long: `outbox-relay reads inserts into an outbox table from a Postgres logical
replication slot (pgoutput) and produces each event to a Kafka topic chosen by
its aggregate type. A WAL position is confirmed to Postgres only after Kafka
acknowledged every event before it.

Configuration: --config FILE (YAML; see config.example.yaml), then RELAY_*
environment variables (postgres.dsn is RELAY_POSTGRES_DSN, lists are
comma-separated), then flags, each overriding the one before.

Passwords stay out of the config file: postgres.password_file (or
RELAY_POSTGRES_PASSWORD, PGPASSWORD, ~/.pgpass) and kafka.sasl.password_file
(or RELAY_KAFKA_SASL_PASSWORD). Nothing prints them.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	pf := root.PersistentFlags()
	pf.StringVar(&configFile, "config", "", "YAML config file")
	// The flags of the common settings (settings.go): flags win over the
	// environment, which wins over the file.
	for _, s := range settings {
		if s.flag == "" {
			continue
		}
		usage := s.usage + " (" + s.key
		if s.def != "" {
			usage += ", default " + s.def
		}
		pf.String(s.flag, "", usage+")")
	}

	// load reads the configuration for a command that needs it; a command
	// that does not (version) never calls it.
	load := func(cmd *cobra.Command) (*env, error) {
		// Commands annotated kafka=optional (read-only Postgres views) work
		// without kafka.brokers.
		cfg, err := loadConfigFor(configFile, cmd.Flags(), cmd.Annotations["kafka"] != "optional")
		if err != nil {
			// Printed as it is: configuration errors name keys and show a
			// DSN only up to its user name, never a password (secrets.go).
			return nil, fmt.Errorf("%w: %w", errConfig, err)
		}
		log, err := newLogger(stderr, cfg.Log.Level, cfg.Log.Format)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errConfig, err)
		}
		cfg.warnIgnored(log)
		return &env{cfg: cfg, log: log, stdout: cmd.OutOrStdout()}, nil
	}
	wrap := func(run func(cmd *cobra.Command, e *env, args []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			e, err := load(cmd)
			if err != nil {
				return err
			}
			return run(cmd, e, args)
		}
	}
	root.AddCommand(
		newRunCmd(wrap),
		newSetupCmd(wrap),
		newCheckCmd(wrap),
		newVersionCmd(),
		newHealthCmd(),
		newLagCmd(wrap),
		newStatusCmd(wrap),
		newRetriesCmd(wrap),
		newMigrateCmd(wrap),
		newReplayCmd(wrap),
		newRecoverCmd(wrap),
		newCheckpointCmd(wrap),
		newPruneCmd(wrap),
	)
	return root
}

type wrapFunc func(run func(cmd *cobra.Command, e *env, args []string) error) func(*cobra.Command, []string) error
