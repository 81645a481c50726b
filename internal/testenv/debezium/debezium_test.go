package debezium_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	dbzoffset "github.com/outbox-relay/outbox-relay/internal/debezium"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// The fixture is written on request only: its LSNs differ on every run, and a test
// run must not leave the work tree changed.
var writeOffsets = flag.Bool("write-offsets-fixture", false,
	"copy the offset file of TestStringConverter to internal/debezium/testdata/offsets-real.dat")

const offsetsFixture = "../../debezium/testdata/offsets-real.dat"

// outboxDDL is the table layout of Debezium's outbox router documentation, whose
// column names are the router's defaults.
const outboxDDL = `CREATE TABLE public.outbox (
	id uuid PRIMARY KEY,
	aggregatetype varchar(255) NOT NULL,
	aggregateid varchar(255) NOT NULL,
	type varchar(255) NOT NULL,
	payload jsonb)`

// event is one outbox row: what the test inserts and what Postgres stored.
type event struct {
	aggType, aggID string
	payloadIn      *string // as inserted; nil is SQL NULL
	id             string  // uuid text, as Postgres prints it
	payload        *string // payload::text, as Postgres prints jsonb
	lsnAfter       string  // pg_current_wal_lsn() after the row's commit
}

func ptr(s string) *string { return &s }

// servers are a fresh database holding the outbox table, and Kafka.
func servers(t *testing.T) (*testenv.PG, *testenv.KafkaCluster) {
	t.Helper()
	pg := testenv.Postgres(t)
	k := testenv.Kafka(t)
	pg.Exec(t, outboxDDL)
	return pg, k
}

// orderTopic creates the topic, of one partition, that Debezium's default
// route gives the events of a new aggregate type, and returns both.
func orderTopic(t *testing.T, k *testenv.KafkaCluster) (aggType, topic string) {
	t.Helper()
	aggType = testenv.UniqueName(t, "order")
	topic = "outbox.event." + aggType
	k.CreateTopic(t, topic, 1)
	return aggType, topic
}

// TestStringConverter runs Debezium with StringConverter: the key is the aggregate id,
// the value the payload as Postgres prints jsonb, the header id the event id.
func TestStringConverter(t *testing.T) {
	t.Parallel()
	pg, k := servers(t)
	pool := pg.Pool(t)
	ctx := context.Background()

	// A test_decoding slot beside Debezium's records the exact LSNs of the commits
	// (peeked at the end) for checking the offset file's values.
	side := testenv.UniqueName(t, "side")
	pg.Exec(t, "SELECT pg_create_logical_replication_slot($1, 'test_decoding')", side)

	orders, customers := testenv.UniqueName(t, "order"), testenv.UniqueName(t, "customer")
	for _, a := range []string{orders, customers} {
		k.CreateTopic(t, "outbox.event."+a, 1)
	}

	c := debezium.Start(t, debezium.Options{DSN: pg.DSN, Converter: "string"})

	evs := []*event{
		{aggType: orders, aggID: "order-1", payloadIn: ptr(`{"total":  12.50, "items":[1,2]}`)},
		{aggType: customers, aggID: "cust-7", payloadIn: ptr(`{"name":"Zoë <&>","vip":true,"note":null}`)},
		{aggType: orders, aggID: "order-2", payloadIn: ptr(`"just a string"`)},
		{aggType: customers, aggID: "cust-8", payloadIn: nil},
	}
	var before string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&before); err != nil {
		t.Fatal(err)
	}
	insert(t, pg, evs)
	t.Logf("pg_current_wal_lsn before inserts: %s", before)

	got := map[string][]testenv.Message{
		orders:    k.WaitMessages(t, "outbox.event."+orders, 2),
		customers: k.WaitMessages(t, "outbox.event."+customers, 2),
	}
	next := map[string]int{}
	for _, e := range evs {
		m := got[e.aggType][next[e.aggType]]
		next[e.aggType]++
		logMessage(t, "string", e, m)
		if !bytes.Equal(m.Key, []byte(e.aggID)) {
			t.Errorf("key of %s = %q; want %q", e.id, m.Key, e.aggID)
		}
		if e.payload == nil {
			if m.Value != nil {
				t.Errorf("value of %s (NULL payload) = %q; want a null value", e.id, m.Value)
			}
		} else if !bytes.Equal(m.Value, []byte(*e.payload)) {
			t.Errorf("value of %s = %q; want %q", e.id, m.Value, *e.payload)
		}
		if h, ok := header(m, "id"); !ok || string(h) != e.id {
			t.Errorf("header id of %s = %q (present %v); want %q", e.id, h, ok, e.id)
		}
	}

	var flushedBefore string
	if err := pool.QueryRow(ctx, "SELECT coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots WHERE slot_name = $1",
		c.Slot()).Scan(&flushedBefore); err != nil {
		t.Fatal(err)
	}
	c.Stop(t)
	c.Stop(t) // idempotent
	c.Kill(t) // idempotent

	fi, err := os.Stat(c.OffsetFile())
	if err != nil {
		t.Fatalf("offset file after Stop: %v", err)
	}
	if fi.Size() == 0 {
		t.Fatalf("offset file %s is empty after Stop", c.OffsetFile())
	}
	offsets, err := os.ReadFile(c.OffsetFile())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("offset file (%d bytes): %q", len(offsets), offsets)

	var flushed, restart string
	var active bool
	if err := pool.QueryRow(ctx, `SELECT coalesce(confirmed_flush_lsn::text, ''), coalesce(restart_lsn::text, ''), active
		FROM pg_replication_slots WHERE slot_name = $1`, c.Slot()).Scan(&flushed, &restart, &active); err != nil {
		t.Fatal(err)
	}
	t.Logf("slot %s: confirmed_flush_lsn before Stop %s, after Stop %s (restart_lsn %s, active %v)",
		c.Slot(), flushedBefore, flushed, restart, active)
	rows, err := pool.Query(ctx, "SELECT lsn::text, xid::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)", side)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var lsn, xid, data string
		if err := rows.Scan(&lsn, &xid, &data); err != nil {
			t.Fatal(err)
		}
		t.Logf("test_decoding: lsn %s xid %s %s", lsn, xid, data)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	if *writeOffsets {
		if err := os.MkdirAll(filepath.Dir(offsetsFixture), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(offsetsFixture, offsets, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", offsetsFixture)
	}
}

// TestJSONConverter runs Debezium with JsonConverter (schemas disabled): the key is a
// JSON string, the value the payload text as a JSON string, a NULL payload JSON null.
func TestJSONConverter(t *testing.T) {
	t.Parallel()
	pg, k := servers(t)
	orders, topic := orderTopic(t, k)

	c := debezium.Start(t, debezium.Options{DSN: pg.DSN, Converter: "json"})
	evs := []*event{
		{aggType: orders, aggID: "abc", payloadIn: ptr(`{"total":  12.50, "name":"Zoë <&>", "items":[1,2]}`)},
		{aggType: orders, aggID: "abd", payloadIn: nil},
	}
	insert(t, pg, evs)
	got := k.WaitMessages(t, topic, len(evs))
	for i, e := range evs {
		m := got[i]
		logMessage(t, "json", e, m)
		if want := jsonString(t, e.aggID); !bytes.Equal(m.Key, want) {
			t.Errorf("key of %s = %q; want %q", e.id, m.Key, want)
		}
		want := []byte("null")
		if e.payload != nil {
			want = jsonString(t, *e.payload)
		}
		if !bytes.Equal(m.Value, want) {
			t.Errorf("value of %s = %q; want %q", e.id, m.Value, want)
		}
		if h, ok := header(m, "id"); !ok || string(h) != e.id {
			t.Errorf("header id of %s = %q (present %v); want %q", e.id, h, ok, e.id)
		}
	}
	c.Stop(t)
}

// TestDistributed runs Debezium in a distributed worker created through the REST API
// and checks that a graceful Stop stores its last position in the offsets topic:
// with a flush interval longer than the test, only the commit on stop can write it.
func TestDistributed(t *testing.T) {
	t.Parallel()
	pg, k := servers(t)
	orders, topic := orderTopic(t, k)
	prefix := testenv.UniqueName(t, "dbz")

	c := debezium.Start(t, debezium.Options{DSN: pg.DSN, Distributed: true, TopicPrefix: prefix,
		OffsetFlushInterval: 10 * time.Minute})
	if c.OffsetsTopic() == "" || c.OffsetFile() != "" {
		t.Fatalf("OffsetsTopic() = %q, OffsetFile() = %q; want a topic and \"\"", c.OffsetsTopic(), c.OffsetFile())
	}
	if _, err := os.Stat(c.ConnectorFile()); err != nil {
		t.Fatalf("connector file: %v", err)
	}
	evs := []*event{
		{aggType: orders, aggID: "order-1", payloadIn: ptr(`{"n":1}`)},
		{aggType: orders, aggID: "order-2", payloadIn: ptr(`{"n":2}`)},
		{aggType: orders, aggID: "order-3", payloadIn: ptr(`{"n":3}`)},
	}
	insert(t, pg, evs)
	k.WaitMessages(t, topic, len(evs))
	before := len(k.ReadAll(t, c.OffsetsTopic()))
	c.Stop(t)

	recs := k.ReadAll(t, c.OffsetsTopic())
	t.Logf("offsets topic %s: %d records before Stop, %d after", c.OffsetsTopic(), before, len(recs))
	var records []dbzoffset.Record
	for _, m := range recs {
		t.Logf("  %s/%d@%d key=%s value=%s", m.Topic, m.Partition, m.Offset, m.Key, m.Value)
		records = append(records, dbzoffset.Record{Key: m.Key, Value: m.Value})
	}
	offsets, err := dbzoffset.LatestOffsets(records)
	if err != nil {
		t.Fatalf("LatestOffsets: %v", err)
	}
	if len(offsets) != 1 || offsets[0].Connector != "outbox" || offsets[0].Server != prefix {
		t.Fatalf("offsets = %+v; want one of connector \"outbox\", server %q", offsets, prefix)
	}
	// The last record Debezium delivered is the last event's INSERT: its LSN lies
	// after the commit before it and before the end of its own.
	o := offsets[0]
	prev, err := pglogrepl.ParseLSN(evs[len(evs)-2].lsnAfter)
	if err != nil {
		t.Fatal(err)
	}
	last, err := pglogrepl.ParseLSN(evs[len(evs)-1].lsnAfter)
	if err != nil {
		t.Fatal(err)
	}
	if lsn := pglogrepl.LSN(o.LSN); lsn < prev || lsn >= last || o.MessageType != "INSERT" {
		t.Errorf("offset lsn %s (%s); want the last event's INSERT, in [%s, %s)", lsn, o.MessageType, prev, last)
	}
}

// insert commits each event in a transaction of its own and fills in what Postgres
// stored.
func insert(t *testing.T, pg *testenv.PG, evs []*event) {
	t.Helper()
	pool := pg.Pool(t)
	ctx := context.Background()
	for _, e := range evs {
		err := pool.QueryRow(ctx, `INSERT INTO public.outbox (id, aggregatetype, aggregateid, type, payload)
			VALUES (gen_random_uuid(), $1, $2, 'Created', $3::text::jsonb)
			RETURNING id::text, payload::text`, e.aggType, e.aggID, e.payloadIn).Scan(&e.id, &e.payload)
		if err != nil {
			t.Fatalf("insert %s: %v", e.aggID, err)
		}
		if err := pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&e.lsnAfter); err != nil {
			t.Fatal(err)
		}
	}
}

func header(m testenv.Message, key string) ([]byte, bool) {
	for _, h := range m.Headers {
		if h.Key == key {
			return h.Value, true
		}
	}
	return nil, false
}

// jsonString is s as a JSON string the way Jackson writes it: '<', '>' and '&' as
// they are, which Go's default encoder would escape.
func jsonString(t *testing.T, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// logMessage records the exact bytes Debezium wrote, for comparing with the relay.
func logMessage(t *testing.T, conv string, e *event, m testenv.Message) {
	t.Helper()
	t.Logf("%s converter: row id=%s aggregateid=%q payload=%s (inserted %s, lsn after commit %s)",
		conv, e.id, e.aggID, fmtPtr(e.payload), fmtPtr(e.payloadIn), e.lsnAfter)
	t.Logf("  kafka %s/%d@%d time=%s key=%q (nil %v) value=%q (nil %v)",
		m.Topic, m.Partition, m.Offset, m.Time.UTC().Format(time.RFC3339Nano), m.Key, m.Key == nil, m.Value, m.Value == nil)
	for _, h := range m.Headers {
		t.Logf("  header %q = %q", h.Key, h.Value)
	}
}

func fmtPtr(s *string) string {
	if s == nil {
		return "NULL"
	}
	return "`" + *s + "`"
}
