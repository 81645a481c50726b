package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

// cleanEnv unsets every RELAY_* config variable for the test, so that the
// developer's environment cannot leak into it.
func cleanEnv(t *testing.T) {
	t.Helper()
	for _, s := range settings {
		unsetenv(t, envName(s.key))
	}
}

// minimalEnv is cleanEnv with the two settings a configuration needs set
// to addresses nothing is asked at: a test of config loading only.
func minimalEnv(t *testing.T) {
	t.Helper()
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@127.0.0.1/app")
	t.Setenv("RELAY_KAFKA_BROKERS", "127.0.0.1:9092")
}

func unsetenv(t *testing.T, name string) {
	t.Setenv(name, "") // restores the old value after the test
	os.Unsetenv(name)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// load runs loadConfig as the root command would, with flags parsed from args.
func load(t *testing.T, file string, args ...string) (*config, error) {
	t.Helper()
	root := newRootCmd(&bytes.Buffer{}, &bytes.Buffer{})
	fs := root.PersistentFlags()
	if err := fs.Parse(args); err != nil {
		t.Fatalf("parse flags %q: %v", args, err)
	}
	return loadConfig(file, fs)
}

const minimal = `
postgres:
  dsn: postgres://relay@127.0.0.1:5432/app
kafka:
  brokers: [127.0.0.1:9092]
`

func TestExampleConfig(t *testing.T) {
	cleanEnv(t)
	const path = "../../config.example.yaml"
	c, err := load(t, path)
	if err != nil {
		t.Fatalf("loadConfig(%q): %v", path, err)
	}
	if c.Replication.Slot != "outbox_relay" || c.Sink.BatchSize != 10000 || !c.Sink.AllowAutoTopicCreation || c.Sink.DisableIdempotence {
		t.Errorf("loadConfig(%q) = %+v; want the defaults", path, c)
	}
	if len(c.ignored) > 0 {
		t.Errorf("loadConfig(%q) found ignored keys %q; the example holds none", path, c.ignored)
	}

	// Every key is documented, with its default.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	flatten("", doc, got)
	for _, s := range settings {
		v, ok := got[s.key]
		switch {
		case s.kind == ignored:
			if ok {
				t.Errorf("config.example.yaml has %q, which is ignored", s.key)
			}
		case !ok:
			t.Errorf("config.example.yaml lacks key %q", s.key)
		case s.def != "" && !s.isMap() && v != s.def:
			t.Errorf("config.example.yaml: %s = %q; want the default %q", s.key, v, s.def)
		}
	}
}

func flatten(prefix string, m map[string]any, out map[string]string) {
	for k, v := range m {
		switch v := v.(type) {
		case map[string]any:
			if s := settingOf(prefix + k); s != nil && s.isMap() {
				out[prefix+k] = fmt.Sprint(v)
				continue
			}
			flatten(prefix+k+".", v, out)
		case []any:
			out[prefix+k] = fmt.Sprint(v...)
		default:
			out[prefix+k] = fmt.Sprint(v)
		}
	}
}

func TestPrecedence(t *testing.T) {
	cleanEnv(t)
	file := writeFile(t, "c.yaml", minimal+`
  client_id: from-file
  compression: gzip
postgres_ignored: null
`)
	// postgres_ignored is a typo and must fail; build a clean file instead.
	if _, err := load(t, file); err == nil || !strings.Contains(err.Error(), `unknown key "postgres_ignored"`) {
		t.Fatalf("loadConfig with key postgres_ignored: error = %v; want unknown key", err)
	}
	file = writeFile(t, "c.yaml", `
postgres:
  dsn: postgres://relay@127.0.0.1:5432/app
  slot: file_slot
  publication: file_pub
  status_interval: 3s
log:
  level: warn
kafka:
  brokers: [file:9092]
  client_id: from-file
`)
	t.Setenv("RELAY_POSTGRES_SLOT", "env_slot")
	t.Setenv("RELAY_POSTGRES_PUBLICATION", "env_pub")
	t.Setenv("RELAY_KAFKA_BROKERS", "env1:9092, env2:9092")
	t.Setenv("RELAY_KAFKA_BATCH_SIZE", "500")
	c, err := load(t, file, "--slot", "flag_slot")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ key, got, want string }{
		{"postgres.slot (flag over env over file)", c.Replication.Slot, "flag_slot"},
		{"postgres.publication (env over file)", c.Replication.Publication, "env_pub"},
		{"kafka.brokers (env over file)", strings.Join(c.Sink.Brokers, ","), "env1:9092,env2:9092"},
		{"kafka.batch_size (env over default)", fmt.Sprint(c.Sink.BatchSize), "500"},
		{"kafka.client_id (file)", c.Sink.ClientID, "from-file"},
		{"postgres.status_interval (file)", c.Replication.StatusInterval.String(), "3s"},
		{"log.level (file)", c.Log.Level, "warn"},
		{"kafka.write_timeout (default)", c.Sink.WriteTimeout.String(), "10s"},
		{"metrics.listen (default)", c.MetricsListen, "127.0.0.1:9187"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %q; want %q", tt.key, tt.got, tt.want)
		}
	}
}

// TestEnvOnly: every key can be set without a file.
func TestEnvOnly(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "host=db user=relay")
	t.Setenv("RELAY_KAFKA_BROKERS", "k1:9092")
	t.Setenv("RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION", "false")
	t.Setenv("RELAY_METRICS_LISTEN", "") // empty disables
	t.Setenv("RELAY_TOPICS_OVERRIDES", "OrderPlaced=orders, Payment=payments")
	t.Setenv("RELAY_OUTBOX_COLUMNS_PAYLOAD", "body")
	c, err := load(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Sink.AllowAutoTopicCreation {
		t.Errorf("kafka.allow_auto_topic_creation = true; want false from RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION")
	}
	if c.MetricsListen != "" {
		t.Errorf("metrics.listen = %q; want \"\" from an empty RELAY_METRICS_LISTEN", c.MetricsListen)
	}
	if want := map[string]string{"OrderPlaced": "orders", "Payment": "payments"}; !maps.Equal(c.Router.Overrides, want) {
		t.Errorf("topics.overrides = %v; want %v", c.Router.Overrides, want)
	}
	if c.Router.Columns.Payload != "body" {
		t.Errorf("outbox.columns.payload = %q; want %q", c.Router.Columns.Payload, "body")
	}
}

// TestOverridesKeepCase: aggregate types are case-sensitive, viper's keys are not.
func TestOverridesKeepCase(t *testing.T) {
	cleanEnv(t)
	file := writeFile(t, "c.yaml", minimal+`
topics:
  template: "events.{aggregate_type}"
  overrides:
    OrderPlaced: orders
    orderplaced: lower-orders
`)
	c, err := load(t, file)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"OrderPlaced": "orders", "orderplaced": "lower-orders"}
	if !maps.Equal(c.Router.Overrides, want) {
		t.Errorf("topics.overrides = %v; want %v", c.Router.Overrides, want)
	}
	if c.Router.Topic != "events.{aggregate_type}" {
		t.Errorf("topics.template = %q; want %q", c.Router.Topic, "events.{aggregate_type}")
	}
}

func TestBrokerForms(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"list", "kafka:\n  brokers: [a:1, b:2]\n", "a:1,b:2"},
		{"comma string", "kafka:\n  brokers: \"a:1, b:2\"\n", "a:1,b:2"},
		{"block list", "kafka:\n  brokers:\n    - a:1\n", "a:1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay@db/app")
			c, err := load(t, writeFile(t, "c.yaml", tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(c.Sink.Brokers, ","); got != tt.want {
				t.Errorf("kafka.brokers = %q; want %q", got, tt.want)
			}
		})
	}
}

func TestValidationErrors(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name string
		yaml string            // appended to the minimal valid file
		env  map[string]string // set on top
		want string
	}{
		{"dsn missing", "", map[string]string{"RELAY_POSTGRES_DSN": ""},
			"postgres.dsn: empty; set it in the config file or RELAY_POSTGRES_DSN="},
		{"dsn unparsable", "", map[string]string{"RELAY_POSTGRES_DSN": "postgres://relay:pw@db:notaport/app"},
			"postgres.dsn: `postgres://relay:…` cannot be parsed as a connection URL (invalid port)"},
		{"brokers missing", "", map[string]string{"RELAY_KAFKA_BROKERS": ""},
			"kafka.brokers: empty; set it in the config file or RELAY_KAFKA_BROKERS=localhost:9092"},
		{"broker without port", "", map[string]string{"RELAY_KAFKA_BROKERS": "kafka"},
			`kafka.brokers: "kafka" is not host:port`},
		{"unknown key", "  brokerz: [x:1]\n", nil,
			`unknown key "kafka.brokerz"; did you mean "kafka.brokers"?`},
		{"unknown section", "kafak:\n  brokers: x\n", nil, `unknown key "kafak"`},
		{"unknown nested key", "outbox:\n  columns:\n    payload_col: body\n", nil, `unknown key "outbox.columns.payload_col"`},
		{"map for a value", "log:\n  level:\n    x: y\n", nil, `log.level: want a value, got a map`},
		{"bad duration", "", map[string]string{"RELAY_POSTGRES_STATUS_INTERVAL": "10"},
			`postgres.status_interval: "10" is not a duration; write it like 10s`},
		{"wal_sender_timeout too short", "", map[string]string{"RELAY_POSTGRES_WAL_SENDER_TIMEOUT": "2s"},
			`postgres.wal_sender_timeout: 2s is too short`},
		{"receive_linger too long", "", map[string]string{"RELAY_POSTGRES_RECEIVE_LINGER": "1s"},
			`postgres.receive_linger: 1s is outside 0 to 100ms`},
		{"max_procs too many", "", map[string]string{"RELAY_PIPELINE_MAX_PROCS": "5000"},
			`pipeline.max_procs: 5000 is outside 0 to 1024`},
		{"on_slot_loss", "", map[string]string{"RELAY_POSTGRES_ON_SLOT_LOSS": "resnapshot"},
			`postgres.on_slot_loss: "resnapshot" is not one of fail`},
		{"negative duration", "", map[string]string{"RELAY_KAFKA_WRITE_TIMEOUT": "-1s"},
			`kafka.write_timeout: -1s is negative`},
		{"bad int", "", map[string]string{"RELAY_KAFKA_BATCH_SIZE": "many"},
			`kafka.batch_size: "many" is not a whole number`},
		{"negative int", "", map[string]string{"RELAY_PIPELINE_MAX_IN_FLIGHT_EVENTS": "-5"},
			`pipeline.max_in_flight_events: -5 is negative`},
		{"bad bool", "", map[string]string{"RELAY_KAFKA_TLS_ENABLED": "yes please"},
			`kafka.tls.enabled: "yes please" is not true or false`},
		{"delivery", "", map[string]string{"RELAY_DELIVERY": "exactly-twice"},
			`delivery: "exactly-twice" is not one of at-least-once, exactly-once`},
		{"exactly-once without idempotence", "", map[string]string{"RELAY_DELIVERY": "exactly-once", "RELAY_KAFKA_IDEMPOTENCE": "false"},
			`delivery: exactly-once needs the idempotent producer: enable it (kafka.idempotence), or deliver at-least-once`},
		{"transaction bytes", "", map[string]string{"RELAY_KAFKA_TRANSACTION_MAX_BYTES": "100"},
			`kafka.transaction_max_bytes: 100 is out of range; use at least 65536`},
		{"compression", "", map[string]string{"RELAY_KAFKA_COMPRESSION": "brotli"},
			`kafka.compression: "brotli" is not one of none, gzip, snappy, lz4, zstd`},
		{"sasl mechanism", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "gssapi", "RELAY_KAFKA_SASL_USERNAME": "u"},
			`kafka.sasl.mechanism: "gssapi" is not one of plain, scram-sha-256, scram-sha-512`},
		{"sasl without username", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "plain"},
			`kafka.sasl.username: empty; SASL plain needs a username`},
		{"sasl credentials without mechanism", "", map[string]string{"RELAY_KAFKA_SASL_USERNAME": "u"},
			`kafka.sasl.mechanism: empty, but SASL credentials (a username, password or token) are set`},
		{"oauthbearer without a token", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "oauthbearer"},
			`SASL OAUTHBEARER needs a token: set kafka.sasl.oauth_token_file`},
		{"oauthbearer with two token sources", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "oauthbearer",
			"RELAY_KAFKA_SASL_OAUTH_TOKEN_FILE": missing, "RELAY_KAFKA_SASL_OAUTH_TOKEN_COMMAND": "cat " + missing},
			`kafka.sasl.oauth_token_command: set, and so is kafka.sasl.oauth_token_file: keep one`},
		{"oauthbearer token file unreadable", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "oauthbearer", "RELAY_KAFKA_SASL_OAUTH_TOKEN_FILE": missing},
			`kafka.sasl.oauth_token_file: cannot read it`},
		{"oauthbearer token command not found", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "oauthbearer", "RELAY_KAFKA_SASL_OAUTH_TOKEN_COMMAND": "no-such-token-program --print"},
			`kafka.sasl.oauth_token_command: the token command's program "no-such-token-program" is not found`},
		{"oauthbearer with a password", "", map[string]string{"RELAY_KAFKA_SASL_MECHANISM": "oauthbearer", "RELAY_KAFKA_SASL_PASSWORD": "p", "RELAY_KAFKA_SASL_OAUTH_TOKEN_COMMAND": "echo t"},
			`but SASL OAUTHBEARER takes no user name or password`},
		{"tls file unreadable", "", map[string]string{"RELAY_KAFKA_TLS_ENABLED": "true", "RELAY_KAFKA_TLS_CA_FILE": missing},
			`kafka.tls.ca_file: cannot read it`},
		{"tls file without tls", "", map[string]string{"RELAY_KAFKA_TLS_CA_FILE": notPEM},
			`kafka.tls.ca_file: set, but kafka.tls.enabled is false`},
		{"tls cert without key", "", map[string]string{"RELAY_KAFKA_TLS_ENABLED": "true", "RELAY_KAFKA_TLS_CERT_FILE": notPEM},
			`kafka.tls.cert_file and kafka.tls.key_file go together`},
		{"tls ca not PEM (sink.New)", "", map[string]string{"RELAY_KAFKA_TLS_ENABLED": "true", "RELAY_KAFKA_TLS_CA_FILE": notPEM},
			`holds no PEM certificate`},
		{"slot name", "", map[string]string{"RELAY_POSTGRES_SLOT": "Bad-Slot"},
			`postgres.slot: slot name "Bad-Slot" may contain only lower-case letters, digits and underscores`},
		{"outbox table", "", map[string]string{"RELAY_OUTBOX_TABLE": "a.b.c"},
			`outbox.table: table name "a.b.c": want table or schema.table`},
		{"checkpoint table", "", map[string]string{"RELAY_CHECKPOINT_TABLE": "x."},
			`checkpoint.table: table name "x.": want table or schema.table`},
		{"topic template (router.New)", "topics:\n  template: \"outbox.{aggregate}\"\n", nil,
			`topics.template: "outbox.{aggregate}" has unknown placeholder {aggregate}`},
		{"topic override (router.New)", "topics:\n  overrides:\n    Order: \"bad topic!\"\n", nil,
			`topics.overrides: topic "bad topic!" for aggregate type "Order"`},
		{"overrides env", "", map[string]string{"RELAY_TOPICS_OVERRIDES": "Order"},
			`RELAY_TOPICS_OVERRIDES: "Order" is not aggregate_type=topic`},
		{"duplicate column (router.New)", "", map[string]string{"RELAY_OUTBOX_COLUMNS_PAYLOAD": "id"},
			`outbox.columns.payload: outbox.columns.id and outbox.columns.payload both name column "id"`},
		{"metrics listen", "", map[string]string{"RELAY_METRICS_LISTEN": "nonsense"},
			`metrics.listen: "nonsense" is not host:port`},
		{"otlp endpoint, gRPC", "", map[string]string{"RELAY_TRACING_OTLP_ENDPOINT": "grpc://collector:4317"},
			`tracing.otlp_endpoint: "grpc://collector:4317": the relay exports over OTLP/HTTP, not gRPC: give the collector's OTLP/HTTP receiver as http://host:4318`},
		{"otlp endpoint, no scheme", "", map[string]string{"RELAY_TRACING_OTLP_ENDPOINT": "collector:4318"},
			`tracing.otlp_endpoint: "collector:4318": want the collector's OTLP/HTTP receiver as http://host:port`},
		{"log level", "", map[string]string{"RELAY_LOG_LEVEL": "loud"},
			`log.level: "loud" is not debug, info, warn or error`},
		{"log format", "", map[string]string{"RELAY_LOG_FORMAT": "xml"},
			`log.format: "xml" is not text or json`},
		{"not yaml", "\t- [", nil, `config file`},
		{"misspelt variable", "", map[string]string{"RELAY_KAFKA_COMPRESION": "zstd"},
			`environment variable RELAY_KAFKA_COMPRESION names no setting; did you mean RELAY_KAFKA_COMPRESSION (kafka.compression)?`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cleanEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			body := minimal
			if strings.HasPrefix(tt.yaml, "  ") { // continues the kafka section
				body = strings.TrimRight(minimal, "\n") + "\n" + tt.yaml
			} else {
				body += tt.yaml
			}
			_, err := load(t, writeFile(t, "c.yaml", body))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("loadConfig error = %v; want one containing %q", err, tt.want)
			}
		})
	}
}

// TestAllErrorsAtOnce: one round of edits fixes everything.
func TestAllErrorsAtOnce(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_KAFKA_COMPRESSION", "brotli")
	t.Setenv("RELAY_LOG_FORMAT", "xml")
	_, err := load(t, "")
	for _, want := range []string{"postgres.dsn", "kafka.brokers", "kafka.compression", "log.format"} {
		if err == nil || strings.Count(err.Error(), want+":") != 1 {
			t.Errorf("loadConfig error = %v; want it to name %s once", err, want)
		}
	}
}

// TestConfigErrorHidesPassword runs the whole command: a config error about
// the DSN must not print the password, in any spelling.
func TestConfigErrorHidesPassword(t *testing.T) {
	cleanEnv(t)
	t.Setenv("RELAY_POSTGRES_DSN", "postgres://relay:hunter2@db:notaport/app")
	t.Setenv("RELAY_KAFKA_BROKERS", "k:9092")
	var stdout, stderr bytes.Buffer
	code := execute([]string{"run"}, &stdout, &stderr)
	if code != exitcode.Usage {
		t.Errorf("execute(run) = %d; want %d", code, exitcode.Usage)
	}
	if !strings.Contains(stderr.String(), "postgres.dsn") || strings.Contains(stderr.String(), "hunter2") {
		t.Errorf("stderr = %q; want postgres.dsn named and no password", stderr.String())
	}
}

func TestEditDistanceSuggestions(t *testing.T) {
	tests := []struct{ in, want string }{
		{"kafka.broker", "kafka.brokers"},
		{"postgres.slott", "postgres.slot"},
		{"Log.Level", "log.level"},
		{"completely.different", ""},
	}
	for _, tt := range tests {
		if got := nearestKey(tt.in); got != tt.want {
			t.Errorf("nearestKey(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
	if settingOf("kafka.sasl.password") == nil {
		t.Error("settings lacks kafka.sasl.password")
	}
}

func TestDurationText(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{2 * time.Millisecond, "2ms"}, {10 * time.Second, "10s"}, {5 * time.Minute, "5m"},
		{24 * time.Hour, "24h"}, {90 * time.Minute, "1h30m"}, {61 * time.Second, "1m1s"},
	}
	for _, tt := range tests {
		if got := durationText(tt.d); got != tt.want {
			t.Errorf("durationText(%s) = %q; want %q", tt.d, got, tt.want)
		}
	}
}

// TestUnknownEnvironment: a RELAY_* variable far from every setting's is
// warned about and ignored; the tooling's own (RELAY_TEST_*, …) and the
// password variable are neither.
func TestUnknownEnvironment(t *testing.T) {
	unknown, err := checkEnv([]string{
		"RELAY_KAFKA_BROKERS=k:9092", "RELAY_POSTGRES_PASSWORD=pw", "RELAY_TEST_KAFKA_BROKERS=k:9092",
		"RELAY_FAULTS=full", "RELAY_CPUPROFILE=/tmp/p", "RELAY_SOMETHING_ELSE_ENTIRELY=1", "PATH=/bin", "RELAY_=x",
	})
	if err != nil {
		t.Fatalf("checkEnv: %v", err)
	}
	if want := []string{"RELAY_", "RELAY_SOMETHING_ELSE_ENTIRELY"}; !slices.Equal(unknown, want) {
		t.Errorf("checkEnv unknown = %q; want %q", unknown, want)
	}
	var buf bytes.Buffer
	(&config{unknownEnv: unknown}).warnIgnored(slog.New(slog.NewTextHandler(&buf, nil)))
	if !strings.Contains(buf.String(), "variable=RELAY_SOMETHING_ELSE_ENTIRELY") {
		t.Errorf("warnIgnored logged %q; want a line naming RELAY_SOMETHING_ELSE_ENTIRELY", buf.String())
	}
}
