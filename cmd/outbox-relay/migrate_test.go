package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// A Debezium outbox connector as its documentation shows one, with the
// options users set.
const dbzConnector = `name=outbox-connector
connector.class=io.debezium.connector.postgresql.PostgresConnector
plugin.name=pgoutput
database.hostname=db.internal
database.port=5432
database.user=debezium
database.password=s3cr3t-pw
database.dbname=shop
topic.prefix=shop
slot.name=outbox_slot
publication.name=outbox_pub
table.include.list=public.outbox
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.fields.additional.placement=type:header:eventType,tenant:envelope
transforms.outbox.table.field.event.timestamp=occurred_at
transforms.outbox.route.topic.replacement=events.${routedByValue}
transforms.outbox.route.tombstone.on.empty.payload=true
key.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter=org.apache.kafka.connect.json.JsonConverter
value.converter.schemas.enable=false
`

const dbzWorker = `bootstrap.servers=kafka-1:9092,kafka-2:9092
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=/var/lib/connect/offsets.dat
`

// The printed config is a relay config that loads, means what the Debezium
// config meant, and holds no password.
func TestMigrateDebeziumConfig(t *testing.T) {
	cleanEnv(t)
	conn, worker := writeFile(t, "c.properties", dbzConnector), writeFile(t, "w.properties", dbzWorker)
	code, out, errOut := run(t, "migrate", "debezium", conn, "--worker", worker)
	if code != exitcode.OK {
		t.Fatalf("migrate debezium: exit %d; want 0\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, "s3cr3t-pw") {
		t.Errorf("the password is in migrate's output:\n%s%s", out, errOut)
	}
	if !strings.Contains(errOut, "database.password") || !strings.Contains(errOut, "postgres.password_file") {
		t.Errorf("stderr does not say where the password goes:\n%s", errOut)
	}
	// Without --postgres-dsn it says what it did not check and how to, and
	// it names what the relay does with an empty aggregate id.
	testenv.WantLines(t, "migrate stderr", errOut,
		"note: table.include.list=public.outbox: the outbox table's column types were not checked",
		"run again with --postgres-dsn postgres://USER@HOST:PORT/DB (the password from RELAY_POSTGRES_PASSWORD) to check them",
		"note: transforms.outbox.table.field.event.key=aggregate_id: an event whose aggregate id is NULL or empty: Debezium sends it with an empty key; the relay does not send it: it parks the event in the retry table as dead")
	c, err := load(t, writeFile(t, "relay.yaml", out))
	if err != nil {
		t.Fatalf("the printed config does not load: %v\n%s", err, out)
	}
	if c.Layout != sql.LayoutDebezium || c.Router.Columns.AggregateID != "aggregate_id" || c.Router.Columns.AggregateType != "aggregatetype" ||
		c.Router.Columns.Timestamp != "occurred_at" {
		t.Errorf("outbox = %+v; want the Debezium layout with aggregate_id and occurred_at", c.Router.Columns)
	}
	if got := router.FieldsString(c.Router.Fields); got != "type:header:eventType,tenant:envelope" {
		t.Errorf("message.fields = %q", got)
	}
	if c.Router.Converter != router.ConverterJSON || !c.Router.TombstoneOnEmptyPayload || strings.Join(c.Router.Headers, ",") != "id" {
		t.Errorf("message = %+v; want json (the connector's override), tombstones, id only", c.Router)
	}
	if c.Router.TopicReplacement != "events.${routedByValue}" || c.Router.TopicRegex != "(?<routedByValue>.*)" {
		t.Errorf("topics = %+v", c.Router)
	}
	if c.Replication.Slot != "outbox_slot" || c.Replication.Publication != "outbox_pub" || !strings.HasPrefix(c.Replication.DSN, "postgres://debezium@db.internal:5432/shop") {
		t.Errorf("postgres = %+v", c.Replication)
	}
	if strings.Join(c.Sink.Brokers, ",") != "kafka-1:9092,kafka-2:9092" {
		t.Errorf("kafka.brokers = %v", c.Sink.Brokers)
	}
}

func TestMigrateDebeziumRefuses(t *testing.T) {
	cleanEnv(t)
	worker := writeFile(t, "w.properties", dbzWorker)
	tests := []struct {
		name      string
		connector string
		args      []string
		code      int
		wantInErr string
	}{
		{"schema envelopes", strings.ReplaceAll(dbzConnector, "schemas.enable=false", "schemas.enable=true"), nil,
			exitcode.Failure, "value.converter.schemas.enable"},
		{"not an outbox connector", strings.ReplaceAll(dbzConnector, "transforms=outbox", "transforms="), nil,
			exitcode.Failure, "not an outbox connector"},
		{"takeover without offsets", dbzConnector, []string{"--takeover"}, exitcode.Usage, "--takeover needs the offsets"},
		{"offsets without takeover", dbzConnector, []string{"--offsets", "x.dat"}, exitcode.Usage, "--takeover needs the offsets"},
		{"missing file", "", nil, exitcode.Failure, "no such file"},
	}
	for _, tt := range tests {
		conn := filepath.Join(t.TempDir(), "missing.properties")
		if tt.connector != "" {
			conn = writeFile(t, "c.properties", tt.connector)
		}
		code, _, errOut := run(t, append([]string{"migrate", "debezium", conn, "--worker", worker}, tt.args...)...)
		if code != tt.code || !strings.Contains(errOut, tt.wantInErr) {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant exit %d and %q", tt.name, code, errOut, tt.code, tt.wantInErr)
		}
	}
}

// TestMigrateDebeziumChecksTable: with --postgres-dsn, migrate checks the
// converted config against the table: a timestamptz event timestamp, which
// Debezium's own router rejects, and a header of a type never compared with
// Debezium are gaps (exit 1); a table that fits passes (exit 0).
func TestMigrateDebeziumChecksTable(t *testing.T) {
	dsn, _ := dbEnv(t)
	testenv.ExecAs(t, dsn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
    aggregate_id varchar(255) NOT NULL, type varchar(255), tenant text, payload jsonb,
    occurred_at timestamptz NOT NULL DEFAULT now())`)
	conn, worker := writeFile(t, "c.properties", dbzConnector), writeFile(t, "w.properties", dbzWorker)
	code, _, errOut := run(t, "migrate", "debezium", conn, "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.Failure {
		t.Errorf("migrate --postgres-dsn with a timestamptz event timestamp: exit %d; want 1\n%s", code, errOut)
	}
	testenv.WantLines(t, "migrate stderr", errOut,
		`transforms.outbox.table.field.event.timestamp=occurred_at: column "occurred_at" is timestamp with time zone; Debezium's EventRouter fails its task on it`)

	// A timestamptz header is written as Debezium writes it (measured); an
	// interval was never compared: a gap.
	testenv.ExecAs(t, dsn, `ALTER TABLE outbox ADD COLUMN took interval`)
	placed := strings.Replace(dbzConnector, "type:header:eventType,tenant:envelope", "type:header:eventType,occurred_at:header:when,took:header", 1)
	placed = strings.Replace(placed, "transforms.outbox.table.field.event.timestamp=occurred_at\n", "", 1)
	code, _, errOut = run(t, "migrate", "debezium", writeFile(t, "p.properties", placed), "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.Failure || strings.Contains(errOut, "occurred_at:header:when") {
		t.Errorf("migrate --postgres-dsn with a timestamptz and an interval header: exit %d; want 1 for the interval alone\n%s", code, errOut)
	}
	testenv.WantLines(t, "migrate stderr", errOut,
		`transforms.outbox.table.fields.additional.placement=took:header:took: column "took" is interval: the relay writes Postgres's text of it; Debezium's rendering of this type was not compared`)

	// Debezium 3.1.3 fails on a bigint event timestamp and reads a
	// timestamp one (measured).
	testenv.ExecAs(t, dsn, `ALTER TABLE outbox ADD COLUMN at_ms bigint, ADD COLUMN at_ts timestamp`)
	for col, want := range map[string]int{"at_ms": exitcode.Failure, "at_ts": exitcode.OK} {
		c := strings.Replace(dbzConnector, "table.field.event.timestamp=occurred_at", "table.field.event.timestamp="+col, 1)
		code, _, errOut = run(t, "migrate", "debezium", writeFile(t, col+".properties", c), "--worker", worker, "--postgres-dsn", dsn)
		if code != want {
			t.Errorf("migrate --postgres-dsn with event timestamp %s: exit %d; want %d\n%s", col, code, want, errOut)
		}
		if gap := strings.Contains(errOut, "table.field.event.timestamp="+col+":"); gap != (want != exitcode.OK) {
			t.Errorf("migrate --postgres-dsn with event timestamp %s: gap named %v; want %v\n%s", col, gap, want != exitcode.OK, errOut)
		}
	}
	c := strings.Replace(dbzConnector, "table.field.event.timestamp=occurred_at", "table.field.event.timestamp=at_ms", 1)
	_, _, errOut = run(t, "migrate", "debezium", writeFile(t, "ms.properties", c), "--worker", worker, "--postgres-dsn", dsn)
	testenv.WantLines(t, "migrate stderr", errOut,
		`transforms.outbox.table.field.event.timestamp=at_ms: column "at_ms" is bigint; Debezium's EventRouter fails its task on it`)

	// Domains are their base type, through a domain over a domain: a
	// timestamptz is measured, an interval is not. A float is named for
	// Java 17's longer texts; an unscaled numeric in a StringConverter
	// envelope for its Struct text.
	testenv.ExecAs(t, dsn, `CREATE DOMAIN d_when AS timestamptz; CREATE DOMAIN d_d_when AS d_when; CREATE DOMAIN d_took AS interval;
ALTER TABLE outbox ADD COLUMN w d_d_when, ADD COLUMN dt d_took, ADD COLUMN f double precision, ADD COLUMN n numeric`)
	fits0 := strings.Replace(dbzConnector, "transforms.outbox.table.field.event.timestamp=occurred_at\n", "", 1)
	typed := strings.Replace(fits0, "type:header:eventType,tenant:envelope", "w:header,dt:header,f:header,n:envelope", 1)
	typed = strings.Replace(typed, "org.apache.kafka.connect.json.JsonConverter", "org.apache.kafka.connect.storage.StringConverter", -1)
	code, _, errOut = run(t, "migrate", "debezium", writeFile(t, "typed.properties", typed), "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.Failure || strings.Contains(errOut, "placement=w:header") {
		t.Errorf("migrate --postgres-dsn with domain, float and numeric fields: exit %d; want 1, the domain over a domain over timestamptz not named\n%s", code, errOut)
	}
	testenv.WantLines(t, "migrate stderr", errOut,
		`transforms.outbox.table.fields.additional.placement=dt:header:dt: column "dt" is d_took: the relay writes Postgres's text of it; Debezium's rendering of this type was not compared`,
		`transforms.outbox.table.fields.additional.placement=f:header:f: column "f" is double precision: Debezium writes a float as the Java it runs on prints it, and Java 17 and 18 print some values longer than Java 19 on (1.0E23 as 9.999999999999999E22`,
		`transforms.outbox.table.fields.additional.placement=n:envelope:n: column "n" is numeric: a numeric without a declared scale is Debezium's VariableScaleDecimal`)

	// A bytea payload under StringConverter: Debezium wrote the buffer's
	// toString.
	testenv.ExecAs(t, dsn, `ALTER TABLE outbox ADD COLUMN raw bytea`)
	rawPayload := strings.Replace(typed, "transforms.outbox.table.fields.additional.placement=w:header,dt:header,f:header,n:envelope", "transforms.outbox.table.field.event.payload=raw", 1)
	code, _, errOut = run(t, "migrate", "debezium", writeFile(t, "raw.properties", rawPayload), "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.Failure {
		t.Errorf("migrate --postgres-dsn with a bytea payload under StringConverter: exit %d; want 1\n%s", code, errOut)
	}
	testenv.WantLines(t, "migrate stderr", errOut,
		`transforms.outbox.table.field.event.payload=raw: column "raw" is bytea and the value converter StringConverter: Debezium wrote each value as the text java.nio.HeapByteBuffer[pos=0 lim=N cap=N]`)

	fits := strings.Replace(dbzConnector, "transforms.outbox.table.field.event.timestamp=occurred_at\n", "", 1)
	code, _, errOut = run(t, "migrate", "debezium", writeFile(t, "f.properties", fits), "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.OK {
		t.Errorf("migrate --postgres-dsn with a table that fits: exit %d; want 0\n%s", code, errOut)
	}

	// A column the converted config maps but the table lacks: the relay
	// would refuse it at start.
	testenv.ExecAs(t, dsn, `ALTER TABLE outbox DROP COLUMN tenant`)
	code, _, errOut = run(t, "migrate", "debezium", writeFile(t, "f.properties", fits), "--worker", worker, "--postgres-dsn", dsn)
	if code != exitcode.Failure || !strings.Contains(errOut, `the relay refuses the table at start: outbox table public.outbox: no column "tenant" (message.fields)`) {
		t.Errorf("migrate --postgres-dsn with a missing field column: exit %d; want 1 naming it\n%s", code, errOut)
	}
}

// TestMigrateDebeziumPasswordFromEnv: --postgres-dsn without a password takes
// RELAY_POSTGRES_PASSWORD, as postgres.dsn does (it connected without one).
func TestMigrateDebeziumPasswordFromEnv(t *testing.T) {
	dsn, _ := dbEnv(t)
	testenv.ExecAs(t, dsn, `CREATE TABLE outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
    aggregate_id varchar(255) NOT NULL, type varchar(255), tenant text, payload jsonb)`)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok {
		t.Fatalf("the test DSN %s has no password to move into RELAY_POSTGRES_PASSWORD", redactDSN(dsn))
	}
	u.User = url.User(u.User.Username())
	t.Setenv("PGPASSWORD", "")
	t.Setenv("PGPASSFILE", "/nonexistent")
	t.Setenv("RELAY_POSTGRES_PASSWORD", pw)
	t.Setenv("RELAY_POSTGRES_DSN", u.String())
	fits := strings.Replace(dbzConnector, "transforms.outbox.table.field.event.timestamp=occurred_at\n", "", 1)
	code, _, errOut := run(t, "migrate", "debezium", writeFile(t, "f.properties", fits), "--worker", writeFile(t, "w.properties", dbzWorker), "--postgres-dsn", u.String())
	if code != exitcode.OK {
		t.Errorf("migrate --postgres-dsn without a password, RELAY_POSTGRES_PASSWORD set: exit %d; want 0\n%s", code, errOut)
	}
}

// TestMigrateDebeziumJavaRegex: a route.topic.regex with Java syntax Go
// reads otherwise is a gap naming the construct (exit 1); one the relay
// translates (a POSIX class) is copied as it is, exit 0.
func TestMigrateDebeziumJavaRegex(t *testing.T) {
	cleanEnv(t)
	worker := writeFile(t, "w.properties", dbzWorker)
	for regex, construct := range map[string]string{
		`(?<routedByValue>[a-z&&[^x]]+)`: "&& inside a character class",
		`(?<routedByValue>[[:alpha:]]+)`: "[ inside a character class",
		`(?U)(?<routedByValue>\w+)`:      "the flag U in (?U)",
		`(?<routedByValue>\p{Alpha}+)`:   "",
	} {
		c := dbzConnector + "transforms.outbox.route.topic.regex=" + strings.ReplaceAll(regex, `\`, `\\`) + "\n"
		code, out, errOut := run(t, "migrate", "debezium", writeFile(t, "c.properties", c), "--worker", worker)
		if construct == "" {
			if code != exitcode.OK || !strings.Contains(out, `regex: "(?<routedByValue>\\p{Alpha}+)"`) {
				t.Errorf("migrate with route.topic.regex=%s: exit %d; want 0 and topics.regex copied\nstdout:\n%s\nstderr:\n%s", regex, code, out, errOut)
			}
			continue
		}
		if code != exitcode.Failure {
			t.Errorf("migrate with route.topic.regex=%s: exit %d; want 1\n%s", regex, code, errOut)
		}
		testenv.WantLines(t, "migrate stderr", errOut, "transforms.outbox.route.topic.regex="+regex+": the relay cannot route with it", construct+" is Java syntax that Go reads otherwise or not at all")
	}
}
