package faults

import (
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// TestPrimaryFastShutdown is a planned restart of the primary (pg_ctl stop -m
// fast, what `systemctl restart postgresql` does) while the relay streams and
// a producer writes. A fast shutdown waits for every walsender to have its
// WAL confirmed by its client; the relay confirms only what its checkpoint
// saved, and the shutting-down server refuses that save. The relay must let
// go of the replication connection then, so the shutdown ends in seconds
// rather than at pg_ctl's timeout, and deliver everything once the server is
// back: lost 0, per-aggregate order kept.
func TestPrimaryFastShutdown(t *testing.T) {
	m := failoverModeOf(t)
	r := newFORun(t, 15, testenv.ClusterOptions{})
	r.logf("%s mode, Postgres 15 primary :%d, standby :%d", m.name, r.c.Primary.Port, r.c.Standby.Port)
	r.setup()
	relay := r.startRelay()
	stop := r.runProducer(m.rate)
	time.Sleep(m.produce)

	began := time.Now()
	if err := r.c.Primary.Stop("fast", time.Minute); err != nil {
		t.Fatalf("planned restart under a streaming relay: %v (after %s)", err, time.Since(began).Round(time.Millisecond))
	}
	took := time.Since(began)
	r.logf("primary stopped (fast) in %s", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("pg_ctl stop -m fast took %s with the relay connected; want it to end in seconds", took.Round(time.Millisecond))
	}
	r.c.Primary.Start(t)
	back := r.currentLSN(r.c.Primary)
	recovered := r.waitConfirmedPast(r.c.Primary, back, 2*time.Minute).Sub(began)
	time.Sleep(m.produce)
	ps := stop()
	r.waitDrained(r.c.Primary)
	r.stopRelay(relay)
	r.assertLedger(r.c.Primary, &ps, window, []time.Duration{recovered})
}
