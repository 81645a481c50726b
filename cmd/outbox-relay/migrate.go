package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/admin"
	"github.com/outbox-relay/outbox-relay/internal/debezium"
	"github.com/outbox-relay/outbox-relay/internal/ops"
	"github.com/outbox-relay/outbox-relay/internal/sqlconn"
	outboxsql "github.com/outbox-relay/outbox-relay/sql"
)

func newMigrateCmd(wrap wrapFunc) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move from another outbox relay (Debezium) to this one",
	}
	cmd.AddCommand(newMigrateDebeziumCmd(wrap))
	return cmd
}

func newMigrateDebeziumCmd(wrap wrapFunc) *cobra.Command {
	var (
		workerFile, offsetsFile, offsetsTopic string
		postgresDSN                           string
		takeover                              bool
	)
	cmd := &cobra.Command{
		Use:   "debezium CONNECTOR.properties [--worker WORKER.properties] [--offsets FILE | --offsets-topic TOPIC --takeover]",
		Short: "Print the relay config equivalent to a Debezium outbox connector, and take over its slot",
		Long: `migrate debezium reads a Debezium PostgreSQL connector's properties (with
the Outbox Event Router as a transform) and, with --worker, the Kafka Connect
worker's (for bootstrap.servers and the converters). It prints the equivalent
relay config as YAML on stdout, and on stderr every Debezium setting that has no
equivalent, with what to do about it. It exits 1 when there is such a gap: the
relay would not write what Debezium wrote.

With --postgres-dsn it also checks the converted config against the outbox
table in that database: columns the relay would refuse at start, values it
renders differently from Debezium (a float on Java 17, a type never
compared), and options Debezium itself rejects (an event timestamp column that
is not timestamp). Each is a gap. Without it, a note says the column types
were not checked.

With --takeover (Debezium stopped first) it reads Debezium's last committed
position from its offsets: the standalone worker's offset file (--offsets, its
offset.storage.file.filename) or a distributed cluster's offsets topic
(--offsets-topic, its offset.storage.topic, read with kafka.* of the relay's
config). It creates the relay's checkpoint and retry tables (as setup does) and
sets the relay's checkpoint for Debezium's slot to that position, so that
"outbox-relay run" with the printed config starts where Debezium stopped: no event
lost, and only the transaction Debezium was in when it stopped is sent again.
--takeover needs the relay's config (--config, RELAY_POSTGRES_DSN with the
password).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if takeover != (offsetsFile != "" || offsetsTopic != "") {
				return usageErrorf("--takeover needs the offsets (--offsets FILE or --offsets-topic TOPIC), and they are read only for --takeover")
			}
			if offsetsFile != "" && offsetsTopic != "" {
				return usageErrorf("--offsets and --offsets-topic: give one")
			}
			connector, err := readProperties(args[0])
			if err != nil {
				return err
			}
			var worker map[string]string
			if workerFile != "" {
				if worker, err = readProperties(workerFile); err != nil {
					return err
				}
			}
			plan, err := debezium.Convert(connector, worker)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if postgresDSN != "" {
				if err := checkPlanTable(cmd.Context(), postgresDSN, args[0], plan, connector); err != nil {
					return err
				}
			}
			if postgresDSN == "" {
				plan.Notes = append(plan.Notes, debezium.Note{DebeziumKey: "table.include.list", Value: connector["table.include.list"],
					Why: "the outbox table's column types were not checked, so values the relay writes otherwise than Debezium (a float on Java 17, a numeric without a scale in a StringConverter envelope, a type never compared), a missing mapped column, and an event timestamp column Debezium fails on are not named here: run again with --postgres-dsn postgres://USER@HOST:PORT/DB (the password from RELAY_POSTGRES_PASSWORD) to check them"})
			}
			if !takeover {
				return printPlan(cmd.OutOrStdout(), cmd.ErrOrStderr(), args[0], plan)
			}
			return wrap(func(cmd *cobra.Command, e *env, _ []string) error {
				return takeOver(cmd.Context(), e, cmd.ErrOrStderr(), connector, offsetsFile, offsetsTopic)
			})(cmd, args)
		},
	}
	f := cmd.Flags()
	f.StringVar(&workerFile, "worker", "", "the Kafka Connect worker's properties (bootstrap.servers, converters)")
	f.StringVar(&offsetsFile, "offsets", "", "with --takeover: the standalone worker's offset file (offset.storage.file.filename)")
	f.StringVar(&offsetsTopic, "offsets-topic", "", "with --takeover: a distributed cluster's offsets topic (offset.storage.topic)")
	f.StringVar(&postgresDSN, "postgres-dsn", "", "also check the converted config against the outbox table in this database (columns, types, what Debezium itself would reject)")
	f.BoolVar(&takeover, "takeover", false, "set the relay's checkpoint of Debezium's slot to Debezium's last committed position (stop Debezium first)")
	return cmd
}

func readProperties(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	props, err := debezium.ParseProperties(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return props, nil
}

// checkPlanTable adds to the plan's gaps what the outbox table in the
// database of dsn shows: columns the relay would refuse at start, values it
// renders differently from Debezium, options Debezium itself rejects. The
// plan's settings are loaded as the relay would load them.
func checkPlanTable(ctx context.Context, dsn, source string, plan *debezium.Plan, connector map[string]string) error {
	doc, err := planYAML(source, plan)
	if err != nil {
		return err
	}
	file := filepath.Join(os.TempDir(), fmt.Sprintf("outbox-relay-migrate-%d.yaml", os.Getpid()))
	if err := os.WriteFile(file, doc, 0o600); err != nil {
		return err
	}
	defer os.Remove(file)
	cfg, err := loadConfigFor(file, pflag.NewFlagSet("migrate", pflag.ContinueOnError), false)
	if err != nil {
		plan.Gaps = append(plan.Gaps, debezium.Gap{DebeziumKey: "transforms", Why: fmt.Sprintf("the relay refuses the converted config: %v", err)})
		return nil
	}
	table, err := outboxsql.ParseTable(cfg.Table)
	if err != nil {
		return err
	}
	connDSN, err := withEnvPassword(dsn)
	if err != nil {
		return fmt.Errorf("--postgres-dsn %s: %w", redactDSN(dsn), err)
	}
	conn, err := sqlconn.Connect(ctx, connDSN)
	if err != nil {
		return fmt.Errorf("--postgres-dsn %s: %w", redactDSN(dsn), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	gaps, err := debezium.CheckTable(ctx, conn, table, cfg.routerConfig(), connector)
	if err != nil {
		return err
	}
	plan.Gaps = append(plan.Gaps, gaps...)
	return nil
}

// planYAML renders the plan's settings as a relay config file, commented
// with the Debezium keys they come from.
func planYAML(source string, plan *debezium.Plan) ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	doc := &yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{root},
		HeadComment: "outbox-relay config from the Debezium connector " + source + "\n(outbox-relay migrate debezium). The password is not copied: set\nRELAY_POSTGRES_DSN with it, or add it here."}
	for _, s := range plan.Settings {
		parent := root
		parts := strings.Split(s.Key, ".")
		for _, p := range parts[:len(parts)-1] {
			parent = child(parent, p)
		}
		k := &yaml.Node{Kind: yaml.ScalarNode, Value: parts[len(parts)-1]}
		v := &yaml.Node{Kind: yaml.ScalarNode, Value: s.Value, Style: yaml.DoubleQuotedStyle}
		if s.FromDebeziumKey != "" {
			v.LineComment = "from " + s.FromDebeziumKey
		}
		parent.Content = append(parent.Content, k, v)
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// printPlan writes the plan's settings as a relay config file on stdout, and
// its gaps on stderr.
func printPlan(stdout, stderr io.Writer, source string, plan *debezium.Plan) error {
	doc, err := planYAML(source, plan)
	if err != nil {
		return err
	}
	if _, err := stdout.Write(doc); err != nil {
		return err
	}
	for _, n := range plan.Notes {
		fmt.Fprintf(stderr, "note: %s=%s: %s\n", ops.Printable(n.DebeziumKey), ops.Printable(n.Value), ops.Printable(n.Why))
	}
	if len(plan.Gaps) == 0 {
		return nil
	}
	fmt.Fprintf(stderr, "%d Debezium setting(s) with no relay equivalent:\n", len(plan.Gaps))
	for _, g := range plan.Gaps {
		fmt.Fprintf(stderr, "  %s=%s: %s\n", ops.Printable(g.DebeziumKey), ops.Printable(g.Value), ops.Printable(g.Why))
	}
	return errReported
}

// child returns the mapping under key in parent, adding it when missing.
func child(parent *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(parent.Content); i += 2 {
		if parent.Content[i].Value == key {
			return parent.Content[i+1]
		}
	}
	m := &yaml.Node{Kind: yaml.MappingNode}
	parent.Content = append(parent.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, m)
	return m
}

// takeOver reads Debezium's offsets and hands its last committed position to
// admin.TakeOver.
func takeOver(ctx context.Context, e *env, w io.Writer, connector map[string]string, offsetsFile, offsetsTopic string) error {
	var offsets []debezium.Offset
	var err error
	from := offsetsFile
	if offsetsFile != "" {
		offsets, err = debezium.ReadOffsetFile(offsetsFile)
	} else {
		from = "topic " + offsetsTopic
		offsets, err = debezium.ReadOffsets(ctx, e.cfg.sinkConfig(e.log), offsetsTopic)
	}
	if err != nil {
		return err
	}
	off, err := debezium.FindOffset(offsets, connector, from)
	if err != nil {
		return err
	}
	lsn, why, err := off.ResumeLSN()
	if err != nil {
		return err
	}
	origin := fmt.Sprintf("Debezium's offset (connector %q, %s): %s", off.Connector, from, ops.Printable(why))
	return admin.TakeOver(ctx, e.adminConfig(), pglogrepl.LSN(lsn), origin, w)
}
