package replication

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// fixtureSQL is what testdata/stream.hex captures, one transaction per entry.
// Tests in decode_test.go assert on these values: change both together.
var fixtureSQL = []string{
	// 1: two outbox rows (NULL headers, unicode jsonb, empty string) and a row of
	// a table outside the publication, in one transaction.
	`BEGIN;
	 INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) VALUES
	   ('6f1c1c0e-0000-4000-8000-000000000001', 'Order', 'o-1', 'Created', '{"name": "Zoë ✓ 日本", "n": 1}', NULL),
	   ('6f1c1c0e-0000-4000-8000-000000000002', 'Order', 'o-1', '', '[1, 2]', '{"trace": "abc"}');
	 INSERT INTO other (id) VALUES (1);
	 COMMIT`,
	// 2: only ignored changes.
	`BEGIN;
	 UPDATE outbox SET event_type = 'Updated' WHERE aggregate_id = 'o-1' AND event_type = 'Created';
	 DELETE FROM outbox WHERE event_type = '';
	 COMMIT`,
	// 3: truncate.
	`TRUNCATE outbox`,
	// 4: bytea payload.
	`INSERT INTO outbox_bytes (id, payload) VALUES (7, '\x00ff10'::bytea)`,
	// 5: after ALTER TABLE ADD COLUMN the Relation is sent again.
	`ALTER TABLE outbox ADD COLUMN trace_id text;
	 INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, trace_id) VALUES
	   ('6f1c1c0e-0000-4000-8000-000000000003', 'Payment', 'p-9', 'Paid', '{}', 't-1')`,
}

const fixtureDDL = `
CREATE TABLE outbox (
  id uuid PRIMARY KEY, aggregate_type text NOT NULL, aggregate_id text NOT NULL,
  event_type text NOT NULL, payload jsonb, headers jsonb, created_at timestamptz DEFAULT '2026-01-02 03:04:05+00');
CREATE TABLE outbox_bytes (id int PRIMARY KEY, payload bytea);
CREATE TABLE other (id int PRIMARY KEY);
CREATE PUBLICATION fixture_pub FOR TABLE outbox, outbox_bytes;`

// TestGenerateFixtures regenerates testdata/stream.hex from a real server:
//
//	RELAY_REGEN_FIXTURES=1 go test ./replication -run TestGenerateFixtures
func TestGenerateFixtures(t *testing.T) {
	if os.Getenv("RELAY_REGEN_FIXTURES") == "" {
		t.Skip("set RELAY_REGEN_FIXTURES=1 to regenerate testdata/stream.hex")
	}
	db := testDB(t)
	db.exec(fixtureDDL)
	db.exec("SELECT pg_create_logical_replication_slot('fixture_slot', 'pgoutput')")
	for _, q := range fixtureSQL {
		db.exec(q)
	}
	msgs := captureRaw(t, db.dsn, "fixture_slot", "fixture_pub", len(fixtureSQL))
	var b strings.Builder
	b.WriteString("# pgoutput proto_version 1 messages captured by TestGenerateFixtures (fixture_gen_test.go).\n")
	b.WriteString("# One XLogData payload a line: WALStart, then the message in hex.\n")
	for _, m := range msgs {
		fmt.Fprintf(&b, "%s %s\n", m.LSN, hex.EncodeToString(m.Data))
	}
	if err := os.WriteFile(filepath.Join("testdata", "stream.hex"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// captureRaw streams the slot with plain pglogrepl until it has seen commits
// Commit messages, and returns every XLogData payload.
func captureRaw(t *testing.T, dsn, slot, pub string, commits int) []walMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	err = pglogrepl.StartReplication(ctx, conn, slot, 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names " + quoteLiteral(pub)},
	})
	if err != nil {
		t.Fatal(err)
	}
	var msgs []walMessage
	for commits > 0 {
		msg, err := conn.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("receive: %v", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		xld, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, walMessage{LSN: xld.WALStart, Data: append([]byte(nil), xld.WALData...)})
		if xld.WALData[0] == 'C' {
			commits--
		}
	}
	return msgs
}
