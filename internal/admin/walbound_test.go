package admin

import (
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestCheckWALBound: check reports postgres.max_retained_wal against the
// server's max_slot_wal_keep_size as docs/wal-buffer.md says, recommending a
// max_slot_wal_keep_size of the bound plus 2 GB (at least 2 x the bound and
// 2 x max_wal_size), and names vacuum's full-page-image bursts when data
// checksums or wal_log_hints make them, and whether the relay can log
// running-xacts records itself, and how (Postgres 16+ with the grant, else
// a temporary slot). The dev server (4GB, no checksums)
// for the good case and the bound off; a private server for the settings
// the shared one must not be given.
func TestCheckWALBound(t *testing.T) {
	const burst = "info  max_retained_wal: data checksums or wal_log_hints are on: vacuum writes full-page images in bursts"
	const bound = 1 << 30 // postgres.max_retained_wal's default, 1GB
	check := func(t *testing.T, cfg Config) string {
		t.Helper()
		// Kafka is not asked for these lines; nothing listens there.
		_, out := runCheck(t, cfg, kafkaAt(t, &cfg, "127.0.0.1:9"))
		return out
	}
	t.Run("dev server", func(t *testing.T) {
		pg, cfg := testDB(t)
		dsn := pg.DSN
		cfg.MaxRetainedWAL = bound
		out := check(t, cfg)
		testenv.WantLines(t, "check", out, "ok    max_retained_wal: 1024MB, below max_slot_wal_keep_size = 4096MB: a running relay buffers in Postgres long before its slot could be lost")
		// Whether the relay can log running-xacts records itself
		// (walbuffer.CanLogSnapshots), said as the role's grant stands.
		switch testenv.QueryString(t, dsn, `SELECT CASE WHEN to_regprocedure('pg_log_standby_snapshot()') IS NULL THEN 'old'
	WHEN has_function_privilege(to_regprocedure('pg_log_standby_snapshot()'), 'EXECUTE') THEN 'can' ELSE 'cannot' END`) {
		case "old":
			testenv.WantLines(t, "check", out, "info  max_retained_wal: before Postgres 16 the relay near the bound logs running-xacts records by creating and dropping a temporary slot, so that its slot follows what it confirms within seconds: it needs one free entry of max_replication_slots for a moment")
		case "can":
			testenv.WantLines(t, "check", out, "may run pg_log_standby_snapshot(): near the bound the relay logs running-xacts records itself")
		default:
			testenv.WantLines(t, "check", out, "may not run pg_log_standby_snapshot(): near the bound the relay logs running-xacts records by creating and dropping a temporary slot", "GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO ")
		}
		// initdb turns data checksums on by default from Postgres 18.
		if testenv.QueryString(t, dsn, `SELECT (current_setting('data_checksums') = 'on' OR current_setting('wal_log_hints') = 'on')::text`) == "true" {
			testenv.WantLines(t, "check", out, burst)
		} else if strings.Contains(out, burst) {
			t.Errorf("check names vacuum's bursts on a server without checksums or wal_log_hints:\n%s", out)
		}
		cfg.MaxRetainedWAL = 0 // off
		testenv.WantLines(t, "check", check(t, cfg), "warn  max_retained_wal: off: while Kafka is away the slot keeps WAL up to max_slot_wal_keep_size = 4096MB, then it is invalidated and needs a refill")
	})
	t.Run("private server", func(t *testing.T) {
		srv := testenv.NewServer(t, 15, testenv.ServerOptions{Conf: "max_slot_wal_keep_size = 1GB\nmax_wal_size = 2GB\nwal_log_hints = on\n"})
		cfg := defaultConfig(t, srv.DSN(""), testenv.UniqueName(t, "relay_admin"))
		cfg.MaxRetainedWAL = bound
		out := check(t, cfg)
		// 2 x max_wal_size (4GB) is the largest of the three.
		testenv.WantLines(t, "check", out,
			"warn  max_retained_wal: 1024MB, but max_slot_wal_keep_size = 1024MB may invalidate the slot of a running relay before it buffers",
			"raise max_slot_wal_keep_size to at least '4096MB' or lower postgres.max_retained_wal",
			burst)
		srv.Exec(t, "", `ALTER SYSTEM SET max_slot_wal_keep_size = -1`)
		srv.Exec(t, "", `SELECT pg_reload_conf()`)
		testenv.WantLines(t, "check", check(t, cfg),
			"warn  max_retained_wal: 1024MB while the relay runs; max_slot_wal_keep_size is unlimited, so a STOPPED relay's slot keeps WAL until the disk is full: set max_slot_wal_keep_size = '4096MB'")
		cfg.MaxRetainedWAL = 0
		out = check(t, cfg)
		testenv.WantLines(t, "check", out, "warn  max_retained_wal: off, and max_slot_wal_keep_size is unlimited")
		if strings.Contains(out, burst) {
			t.Errorf("check names vacuum's bursts with the bound off:\n%s", out)
		}
	})
}
