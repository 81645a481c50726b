package compat_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// A typedColumn is a column of one type that both sides place as a header and
// as an envelope field (alias env_<name>), with the values its events hold.
type typedColumn struct {
	name, typ string
	values    []string // SQL literals
}

// typedSides are Debezium and the relay reading one outbox table with typed
// columns, each side writing to a topic of one partition, and a connection
// to insert the events.
type typedSides struct {
	k                           *testenv.KafkaCluster
	db                          *pgx.Conn
	aggType, dbzTopic, rlyTopic string
	relay                       *relayProc
	connect                     *debezium.Connect
}

// startTyped creates the outbox table with columns on a fresh database (after
// ddl, such as the domains the columns use, unless empty) and starts both
// sides on it under converter, with every column placed; names start with
// prefix.
func startTyped(t *testing.T, converter, prefix, ddl string, columns []typedColumn) *typedSides {
	pg := testenv.Postgres(t)
	s := &typedSides{k: testenv.Kafka(t)}
	var cols, fields []string
	for _, c := range columns {
		cols = append(cols, c.name+" "+c.typ)
		fields = append(fields, c.name+":header", c.name+":envelope:env_"+c.name)
	}
	if ddl != "" {
		pg.Exec(t, ddl)
	}
	pg.Exec(t, `CREATE TABLE public.outbox (id uuid PRIMARY KEY, aggregatetype varchar(255) NOT NULL,
    aggregateid varchar(255) NOT NULL, type varchar(255) NOT NULL, payload jsonb, `+strings.Join(cols, ", ")+`)`)
	name := testenv.UniqueName(t, prefix)
	s.aggType = name + "_T"
	s.dbzTopic, s.rlyTopic = "dbz."+name+"."+s.aggType, "rly."+name+"."+s.aggType
	s.k.CreateTopic(t, s.dbzTopic, 1)
	s.k.CreateTopic(t, s.rlyTopic, 1)
	placement := strings.Join(fields, ",")
	s.connect = debezium.Start(t, debezium.Options{DSN: pg.DSN, Converter: converter, Props: map[string]string{
		"transforms.outbox.route.topic.replacement":           "dbz." + name + ".${routedByValue}",
		"transforms.outbox.table.fields.additional.placement": placement,
	}})
	slot, pub := testenv.UniqueName(t, "rs"), testenv.UniqueName(t, "rp")
	env := append(os.Environ(),
		"RELAY_POSTGRES_DSN="+pg.DSN, "RELAY_POSTGRES_SLOT="+slot, "RELAY_POSTGRES_PUBLICATION="+pub,
		"RELAY_KAFKA_BROKERS="+strings.Join(s.k.Brokers, ","), "RELAY_KAFKA_ALLOW_AUTO_TOPIC_CREATION=false",
		"RELAY_OUTBOX_LAYOUT=debezium", "RELAY_TOPICS_TEMPLATE=rly."+name+".{aggregate_type}",
		"RELAY_MESSAGE_CONVERTER="+converter, "RELAY_METRICS_LISTEN=", "RELAY_MESSAGE_FIELDS="+placement)
	runRelay(t, env, "setup")
	s.relay = startRelay(t, env)

	ctx := context.Background()
	db, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close(ctx) })
	s.db = db
	return s
}

// collectAndStop reads want messages from each side's topic, keyed by event
// id, then stops both sides.
func (s *typedSides) collectAndStop(t *testing.T, want int) (dbz, rly map[string]message) {
	t.Helper()
	dbz = collect(t, s.k, []string{s.dbzTopic}, want, "Debezium")
	rly = collect(t, s.k, []string{s.rlyTopic}, want, "relay")
	s.relay.stop(t)
	s.connect.Stop(t)
	return dbz, rly
}
