package debezium

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// baseConnector is Debezium's documented outbox setup with pgoutput.
func baseConnector() map[string]string {
	return map[string]string{
		"name":                   "outbox-connector",
		"connector.class":        "io.debezium.connector.postgresql.PostgresConnector",
		"tasks.max":              "1",
		"database.hostname":      "db.internal",
		"database.port":          "5432",
		"database.user":          "debezium",
		"database.password":      "s3cret",
		"database.dbname":        "app",
		"topic.prefix":           "dbserver1",
		"plugin.name":            "pgoutput",
		"table.include.list":     "public.outbox",
		"transforms":             "outbox",
		"transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
	}
}

func baseWorker() map[string]string {
	return map[string]string{
		"bootstrap.servers":            "kafka1:9092, kafka2:9092",
		"key.converter":                "org.apache.kafka.connect.storage.StringConverter",
		"value.converter":              "org.apache.kafka.connect.storage.StringConverter",
		"offset.storage.file.filename": "/var/lib/connect/offsets.dat",
		"plugin.path":                  "/opt/connect/plugins",
	}
}

func with(m map[string]string, kv ...string) map[string]string {
	m = maps.Clone(m)
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == "<unset>" {
			delete(m, kv[i])
			continue
		}
		m[kv[i]] = kv[i+1]
	}
	return m
}

// baseSettings are the settings of baseConnector with baseWorker.
var baseSettings = []string{
	"postgres.dsn=postgres://debezium@db.internal:5432/app",
	"postgres.slot=debezium",
	"postgres.publication=dbz_publication",
	"outbox.table=public.outbox",
	"outbox.layout=debezium",
	"message.headers=id",
	"message.converter=string",
	"kafka.brokers=kafka1:9092,kafka2:9092",
}

func TestConvert(t *testing.T) {
	tests := []struct {
		name              string
		connector, worker map[string]string
		settings          []string // key=value, in order
		gaps              []string // Debezium keys, in order
		gapHas            string   // in some gap's Why
		notes             []string // Debezium keys that must be among the notes
	}{
		{
			name: "defaults", connector: baseConnector(), worker: baseWorker(),
			settings: baseSettings,
			gaps:     nil,
			// A password is not a gap (nothing the relay writes differs):
			// a note says where to put it.
			notes: []string{"database.password", "name", "offset.storage.file.filename", "publication.autocreate.mode", "tasks.max", "topic.prefix"},
		},
		{
			name: "renamed columns and routing",
			connector: with(baseConnector(),
				"slot.name", "outbox_slot",
				"publication.name", "outbox_pub",
				"table.include.list", `app\.events`,
				"transforms", "router",
				"transforms.outbox.type", "<unset>",
				"transforms.router.type", "io.debezium.transforms.outbox.EventRouter",
				"transforms.router.table.field.event.id", "event_id",
				"transforms.router.table.field.event.key", "aggregate_id",
				"transforms.router.table.field.event.type", "event_type",
				"transforms.router.table.field.event.payload", "payload", // the default: not repeated
				"transforms.router.table.field.event.timestamp", "created_at",
				"transforms.router.route.by.field", "aggregate_type",
				"transforms.router.route.topic.replacement", "${routedByValue}.events",
				"transforms.router.table.fields.additional.placement", "type:header:eventType, tenant:envelope",
				"transforms.router.route.tombstone.on.empty.payload", "true",
				"status.update.interval.ms", "5000",
			),
			worker: baseWorker(),
			settings: []string{
				"postgres.dsn=postgres://debezium@db.internal:5432/app",
				"postgres.slot=outbox_slot",
				"postgres.publication=outbox_pub",
				"postgres.status_interval=5s",
				"outbox.table=app.events",
				"outbox.layout=debezium",
				"outbox.columns.id=event_id",
				"outbox.columns.aggregate_type=aggregate_type",
				"outbox.columns.aggregate_id=aggregate_id",
				"outbox.columns.event_type=event_type",
				"outbox.columns.timestamp=created_at",
				"topics.regex=(?<routedByValue>.*)",
				"topics.replacement=${routedByValue}.events",
				"message.headers=id",
				"message.fields=type:header:eventType, tenant:envelope",
				"message.tombstone_on_empty_payload=true",
				"message.converter=string",
				"kafka.brokers=kafka1:9092,kafka2:9092",
			},
			gaps: nil,
		},
		{
			// Java's regex syntax is wider than Go's: a lookahead the relay
			// refuses at load is a gap, and no topics.regex is printed.
			name: "java-only regex",
			connector: with(baseConnector(),
				"transforms.outbox.route.topic.regex", `(?<routedByValue>(?!internal).*)`,
				"transforms.outbox.route.topic.replacement", "${routedByValue}.events"),
			worker:   baseWorker(),
			settings: baseSettings,
			gaps:     []string{"transforms.outbox.route.topic.regex"},
			gapHas:   "the relay cannot route with it",
		},
		{
			name: "tls to postgres",
			connector: with(baseConnector(),
				"database.port", "6432",
				"database.user", "dbz user",
				"database.sslmode", "verify-full",
				"database.sslrootcert", "/certs/ca.pem",
				"database.sslkey", "/certs/client.pk8",
				"database.sslcert", "/certs/client.pem",
				"database.sslpassword", "keypass",
			),
			worker: baseWorker(),
			settings: append([]string{
				"postgres.dsn=postgres://dbz%20user@db.internal:6432/app?sslcert=%2Fcerts%2Fclient.pem&sslkey=%2Fcerts%2Fclient.pk8&sslmode=verify-full&sslrootcert=%2Fcerts%2Fca.pem",
			}, baseSettings[1:]...),
			gaps:  nil,
			notes: []string{"database.sslcert", "database.sslkey", "database.sslrootcert"},
		},
		{
			name:      "connector-level json converters without schemas",
			connector: with(baseConnector(), "key.converter", "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable", "false", "value.converter", "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable", "false"),
			worker:    with(baseWorker(), "key.converter.schemas.enable", "true"),
			settings:  replace(baseSettings, "message.converter=json"),
			gaps:      nil,
		},
		{
			name:      "json converters with schemas (Kafka's default)",
			connector: baseConnector(),
			worker: with(baseWorker(), "key.converter", "org.apache.kafka.connect.json.JsonConverter",
				"value.converter", "org.apache.kafka.connect.json.JsonConverter", "key.converter.schemas.enable", "false"),
			settings: replace(baseSettings, "message.converter=json"),
			gaps:     []string{"value.converter.schemas.enable"},
			gapHas:   `{"schema", "payload"} envelope`,
		},
		{
			name:      "binary payload",
			connector: with(baseConnector(), "value.converter", "io.debezium.converters.BinaryDataConverter", "value.converter.delegate.converter.type", "org.apache.kafka.connect.json.JsonConverter"),
			worker:    baseWorker(),
			settings:  baseSettings,
			gaps:      nil,
			notes:     []string{"value.converter"},
		},
		{
			name:      "key and value converters differ",
			connector: with(baseConnector(), "value.converter", "org.apache.kafka.connect.json.JsonConverter", "value.converter.schemas.enable", "false"),
			worker:    baseWorker(),
			settings:  remove(baseSettings, "message.converter"),
			gaps:      []string{"value.converter"},
			gapHas:    "one converter for both",
		},
		{
			name:      "avro",
			connector: with(baseConnector(), "value.converter", "io.confluent.connect.avro.AvroConverter", "value.converter.schema.registry.url", "http://sr:8081"),
			worker:    baseWorker(),
			settings:  remove(baseSettings, "message.converter"),
			gaps:      []string{"value.converter"},
		},
		{
			name:      "no worker",
			connector: baseConnector(),
			settings:  remove(remove(baseSettings, "message.converter"), "kafka.brokers"),
			gaps:      []string{"bootstrap.servers", "key.converter", "value.converter"},
			gapHas:    "worker's configuration, which was not given",
		},
		{
			name:      "decoderbufs by default",
			connector: with(baseConnector(), "plugin.name", "<unset>"),
			worker:    baseWorker(),
			settings:  baseSettings,
			gaps:      []string{"plugin.name"},
			gapHas:    "new pgoutput slot",
		},
		{
			name:      "several tables",
			connector: with(baseConnector(), "table.include.list", "public.outbox,public.orders"),
			worker:    baseWorker(),
			settings:  remove(baseSettings, "outbox.table"),
			gaps:      []string{"table.include.list"},
			gapHas:    "lists 2 tables",
		},
		{
			name:      "table regex",
			connector: with(baseConnector(), "table.include.list", `public\.outbox_.*`),
			worker:    baseWorker(),
			settings:  remove(baseSettings, "outbox.table"),
			gaps:      []string{"table.include.list"},
			gapHas:    "regular expression",
		},
		{
			name:      "no table list",
			connector: with(baseConnector(), "table.include.list", "<unset>"),
			worker:    baseWorker(),
			settings:  remove(baseSettings, "outbox.table"),
			gaps:      []string{"table.include.list"},
		},
		{
			name: "other transforms",
			connector: with(baseConnector(), "transforms", "filter, outbox, insert",
				"transforms.filter.type", "io.debezium.transforms.Filter",
				"transforms.filter.language", "jsr223.groovy",
				"transforms.insert.type", "org.apache.kafka.connect.transforms.InsertHeader",
				"transforms.insert.header", "source"),
			worker:   baseWorker(),
			settings: baseSettings,
			gaps:     []string{"transforms.filter.type", "transforms.insert.type"},
			gapHas:   "runs before the outbox router",
		},
		{
			name: "unsupported router options",
			connector: with(baseConnector(),
				"transforms.outbox.table.expand.json.payload", "true",
				"transforms.outbox.table.json.payload.null.behavior", "optional_bytes",
				"transforms.outbox.table.field.event.schema.version", "version",
				"transforms.outbox.tracing.span.context.field", "tracingspancontext",
				"transforms.outbox.tracing.operation.name", "outbox-write",
				"transforms.outbox.table.op.invalid.behavior", "fatal",
				"transforms.outbox.table.field.additional.missing", "ignore",
				"transforms.outbox.table.fields.additional.placement", "type:header,shard:partition,id:header",
				"transforms.outbox.predicate", "isOutbox",
				"transforms.outbox.made.up", "x",
			),
			worker: baseWorker(),
			settings: []string{baseSettings[0], baseSettings[1], baseSettings[2], baseSettings[3], baseSettings[4], baseSettings[5],
				"message.fields=type:header", "outbox.columns.tracing_span_context=tracingspancontext", baseSettings[6], baseSettings[7]},
			gaps: []string{
				"transforms.outbox.made.up",
				"transforms.outbox.predicate",
				"transforms.outbox.table.expand.json.payload",
				"transforms.outbox.table.field.additional.missing",
				"transforms.outbox.table.field.event.schema.version",
				"transforms.outbox.table.fields.additional.placement",
				"transforms.outbox.table.fields.additional.placement",
				"transforms.outbox.table.json.payload.null.behavior",
				"transforms.outbox.table.op.invalid.behavior",
				"transforms.outbox.tracing.operation.name",
			},
			gapHas: "partition placement is not supported",
		},
		{
			name: "secured kafka",
			connector: with(baseConnector(),
				"producer.override.compression.type", "zstd"),
			worker: with(baseWorker(),
				"producer.bootstrap.servers", "broker:9093",
				"producer.security.protocol", "SASL_SSL",
				"producer.sasl.mechanism", "SCRAM-SHA-512",
				"producer.sasl.jaas.config", `org.apache.kafka.common.security.scram.ScramLoginModule required username="connect" password="kpass";`,
				"producer.ssl.truststore.location", "/etc/kafka/truststore.jks",
				"producer.ssl.truststore.password", "tpass",
			),
			settings: append(remove(baseSettings, "kafka.brokers"),
				"kafka.brokers=broker:9093",
				"kafka.compression=zstd",
				"kafka.tls.enabled=true",
				"kafka.sasl.mechanism=scram-sha-512",
				"kafka.sasl.username=connect"),
			gaps:  []string{"producer.ssl.truststore.location"},
			notes: []string{"producer.sasl.jaas.config"},
		},
		{
			name:      "kerberos",
			connector: baseConnector(),
			worker:    with(baseWorker(), "producer.security.protocol", "SASL_PLAINTEXT"),
			settings:  baseSettings,
			gaps:      []string{"sasl.mechanism"},
			gapHas:    "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 only",
		},
		{
			name:      "config provider",
			connector: with(baseConnector(), "database.hostname", "${file:/opt/secrets.properties:host}"),
			worker:    baseWorker(),
			settings:  baseSettings[1:],
			gaps:      []string{"database.hostname"},
			gapHas:    "config provider",
		},
		{
			name: "debezium keys that matter elsewhere",
			connector: with(baseConnector(),
				"snapshot.mode", "initial",
				"heartbeat.interval.ms", "10000",
				"provide.transaction.metadata", "true",
				"time.precision.mode", "connect",
				"binary.handling.mode", "bytes",
				"topic.creation.default.partitions", "6",
				"column.exclude.list", "public.outbox.secret",
				"some.future.option", "1",
			),
			worker:   baseWorker(),
			settings: baseSettings,
			gaps: []string{"column.exclude.list", "provide.transaction.metadata",
				"time.precision.mode", "topic.creation.default.partitions"},
			notes: []string{"binary.handling.mode", "heartbeat.interval.ms", "snapshot.mode", "some.future.option"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Convert(tt.connector, tt.worker)
			if err != nil {
				t.Fatalf("Convert: %v", err)
			}
			var settings []string
			for _, s := range p.Settings {
				settings = append(settings, s.Key+"="+s.Value)
				if s.FromDebeziumKey == "" {
					t.Errorf("setting %s has no FromDebeziumKey", s.Key)
				}
			}
			if !reflect.DeepEqual(settings, tt.settings) {
				t.Errorf("Settings =\n  %s\nwant\n  %s", strings.Join(settings, "\n  "), strings.Join(tt.settings, "\n  "))
			}
			var gaps []string
			hasWhy := tt.gapHas == ""
			for _, g := range p.Gaps {
				gaps = append(gaps, g.DebeziumKey)
				hasWhy = hasWhy || strings.Contains(g.Why, tt.gapHas)
			}
			if !reflect.DeepEqual(gaps, tt.gaps) {
				t.Errorf("Gaps = %q; want %q\n%s", gaps, tt.gaps, dumpGaps(p))
			}
			if !hasWhy {
				t.Errorf("no gap says %q:\n%s", tt.gapHas, dumpGaps(p))
			}
			notes := make(map[string]bool)
			for _, n := range p.Notes {
				notes[n.DebeziumKey] = true
			}
			for _, k := range tt.notes {
				if !notes[k] {
					t.Errorf("no note for %s; notes: %+v", k, p.Notes)
				}
			}
			// No secret in any value, anywhere.
			all := dumpGaps(p)
			for _, s := range p.Settings {
				all += s.Value + "\n"
			}
			for _, n := range p.Notes {
				all += n.Value + " " + n.Why + "\n"
			}
			for _, secret := range []string{"s3cret", "kpass", "tpass", "keypass"} {
				if strings.Contains(all, secret) {
					t.Errorf("the plan shows the secret %q:\n%s", secret, all)
				}
			}
			// Deterministic.
			again, _ := Convert(tt.connector, tt.worker)
			if !reflect.DeepEqual(p, again) {
				t.Errorf("Convert is not deterministic:\n%+v\n%+v", p, again)
			}
		})
	}
}

func TestConvertErrors(t *testing.T) {
	tests := []struct {
		name      string
		connector map[string]string
		want      string
		is        error
	}{
		{"no transforms", with(baseConnector(), "transforms", "<unset>", "transforms.outbox.type", "<unset>"), "no transform", ErrNotOutbox},
		{"other transforms only", with(baseConnector(), "transforms.outbox.type", "io.debezium.transforms.ExtractNewRecordState"), "io.debezium.transforms.outbox.EventRouter", ErrNotOutbox},
		{"mysql", with(baseConnector(), "connector.class", "io.debezium.connector.mysql.MySqlConnector"), "not Debezium's PostgreSQL connector", nil},
		{"two routers", with(baseConnector(), "transforms", "outbox,second", "transforms.second.type", "io.debezium.transforms.outbox.EventRouter"), "all outbox EventRouters", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Convert(tt.connector, baseWorker())
			if err == nil || !strings.Contains(err.Error(), tt.want) || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Errorf("Convert = %v; want an error containing %q (wrapping %v)", err, tt.want, tt.is)
			}
		})
	}
}

func replace(settings []string, kv string) []string {
	key, _, _ := strings.Cut(kv, "=")
	out := make([]string, len(settings))
	for i, s := range settings {
		if strings.HasPrefix(s, key+"=") {
			s = kv
		}
		out[i] = s
	}
	return out
}

func remove(settings []string, key string) []string {
	var out []string
	for _, s := range settings {
		if !strings.HasPrefix(s, key+"=") {
			out = append(out, s)
		}
	}
	return out
}

func dumpGaps(p *Plan) string {
	var b strings.Builder
	for _, g := range p.Gaps {
		b.WriteString(g.DebeziumKey + " = " + g.Value + ": " + g.Why + "\n")
	}
	return b.String()
}
