package relay_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestStandbyCouldNotLead: a standby whose role lacks REPLICATION reaches
// Postgres and sees the slot held, but could not take over: it must say so
// (/readyz 503 naming the replication connection, outbox_relay_ready 0), not
// report ready until the leader goes away and then fail (issue 37 item 5).
// A standby of the leader's own role is ready (TestStandbyReadyMetric).
func TestStandbyCouldNotLead(t *testing.T) {
	f := newFixture(t)
	leaderCfg := f.config(t)
	leader := f.start(t, leaderCfg)
	f.insertTx(t, f.makeEvents(3))
	f.waitCount(t, 3, time.Minute) // it leads

	// A role with the leader's table privileges (a member of its role) but
	// not its REPLICATION attribute, which membership does not pass on.
	su := testenv.SuperuserConn(t, f.pg.DSN)
	ctx := context.Background()
	role, password := testenv.UniqueName(t, "norepl"), "pw-norepl"
	u, err := url.Parse(f.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	owner := u.User.Username() // the fixture's tables are its
	for _, s := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN NOREPLICATION PASSWORD %s`, sql.Ident(role), sql.Literal(password)),
		fmt.Sprintf(`GRANT %s TO %s`, sql.Ident(owner), sql.Ident(role)),
	} {
		if _, err := su.Exec(ctx, s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		su.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, role)
		if _, err := su.Exec(ctx, `DROP ROLE `+sql.Ident(role)); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u.User = url.UserPassword(role, password)

	standbyCfg := f.config(t)
	standbyCfg.Replication.DSN = u.String()
	standbyCfg.MetricsListen = testenv.FreeAddr(t)
	standbyCfg.StandbyPoll = 100 * time.Millisecond
	f.start(t, standbyCfg)
	base := "http://" + standbyCfg.MetricsListen
	var code int
	var body, metrics string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		code, body = get(base + "/readyz")
		_, metrics = get(base + "/metrics")
		if code == http.StatusServiceUnavailable && strings.Contains(metrics, "\noutbox_relay_ready 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby without REPLICATION: /readyz = %d %q, ready metric %v; want 503 and 0", code, body, strings.Contains(metrics, "outbox_relay_ready 0"))
		}
	}
	for _, want := range []string{"standby", "could not lead", "replication"} {
		if !strings.Contains(strings.ToLower(body), want) {
			t.Errorf("standby without REPLICATION: /readyz body %q; want it to contain %q", body, want)
		}
	}
	t.Logf("/readyz: %d %s", code, body)
	if !strings.Contains(metrics, "\noutbox_relay_active 0\n") {
		t.Errorf("standby's /metrics lacks outbox_relay_active 0")
	}
	leader.stop(t)
}

func get(u string) (int, string) {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
