package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/relay"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/testenv"
	"github.com/outbox-relay/outbox-relay/router"
)

// headerValues returns every value of header key in m, in order.
func headerValues(m testenv.Message, key string) []string {
	var out []string
	for _, h := range m.Headers {
		if h.Key == key {
			out = append(out, string(h.Value))
		}
	}
	return out
}

// byID indexes records by their (single) id header.
func byID(t *testing.T, ms []testenv.Message) map[string]testenv.Message {
	t.Helper()
	out := map[string]testenv.Message{}
	for _, m := range ms {
		ids := headerValues(m, "id")
		if len(ids) != 1 {
			t.Errorf("record %s has id headers %q; want exactly one", m.Value, ids)
			continue
		}
		out[ids[0]] = m
	}
	return out
}

// blockAggregate makes (Order, aggID) blocked: its first event is too large
// for Kafka and goes dead to the retry table.
func (f *fixture) blockAggregate(t *testing.T, aggID string) string {
	t.Helper()
	e := event{ID: newUUID(), AggregateType: "Order", AggregateID: aggID, EventType: "Big",
		Payload: `{"blob": "` + strings.Repeat("x", 1_500_000) + `"}`}
	f.insertRaw(t, e)
	waitFor(t, 30*time.Second, "the too-large event dead in the retry table", func() (bool, string) {
		r, ok := f.retryRows(t)[e.ID]
		return ok && r.Status == retry.StatusDead, fmt.Sprintf("row %+v", r.Status)
	})
	return e.ID
}

// Problem 1 and 4 of the hostile-data issue: a headers-column key "id" once
// replaced the event's identity in the retry table (the second of two such
// events on a blocked aggregate vanished) and duplicated the id header in
// Kafka; requeued events lost the relay's headers. The event's identity comes
// from its row, whatever its headers say, on every path.
func TestHeadersCannotOverrideIdentity(t *testing.T) {
	f := newFixture(t)
	run := f.start(t, f.retryConfig(t))

	// Straight to Kafka: one id header, the row's; the extra header kept.
	direct := event{ID: newUUID(), AggregateType: "Order", AggregateID: "free", EventType: "Created",
		Payload: `{"seq": 1}`, Headers: `{"id": "DUP", "event_type": "Fake", "trace": "t-1"}`}
	// A headers value that is not an object costs the event its extra
	// headers, not its delivery.
	array := event{ID: newUUID(), AggregateType: "Order", AggregateID: "free", EventType: "Created",
		Payload: `{"seq": 2}`, Headers: `[1, 2]`}
	f.insertTx(t, []event{direct, array})

	// Through the retry table: on a blocked aggregate, two events with the
	// same "id" header and one with an empty one all wait, each its own row.
	head := f.blockAggregate(t, "blocked")
	var waiting []event
	for i, h := range []string{`{"id": "DUP", "n": "1"}`, `{"id": "DUP", "n": "2"}`, `{"id": ""}`} {
		e := event{ID: newUUID(), AggregateType: "Order", AggregateID: "blocked", EventType: "Changed",
			Payload: fmt.Sprintf(`{"seq": %d}`, i+1), Headers: h}
		waiting = append(waiting, e)
		f.insertRaw(t, e)
	}
	// An unroutable event with headers, requeued after the routing is fixed.
	unroutable := event{ID: newUUID(), AggregateType: "Bad Type!", AggregateID: "u-1", EventType: "Changed",
		Payload: `{"seq": 1}`, Headers: `{"trace": "t-2"}`}
	f.insertRaw(t, unroutable)
	f.insertTx(t, f.makeEvents(5)) // the stream goes on
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)

	rows := f.retryRows(t)
	for _, e := range waiting {
		r, ok := rows[e.ID]
		if !ok {
			t.Fatalf("event %s (headers %s) is not in the retry table: lost", e.ID, e.Headers)
		}
		if !r.Waiting {
			t.Errorf("event %s: waiting = false; want it waiting behind %s", e.ID, head)
		}
		for _, h := range r.Extra {
			if (router.HeaderSet{}).Reserved(h.Key) {
				t.Errorf("event %s: retry row stores header %q=%q; the relay's own headers come from the row's columns", e.ID, h.Key, h.Value)
			}
		}
	}
	if _, ok := rows[unroutable.ID]; !ok {
		t.Fatalf("unroutable event is not in the retry table")
	}
	run.stop(t)

	topic := f.prefix + ".Order"
	got := byID(t, f.kafka.ReadAll(t, topic))
	if m, ok := got[direct.ID]; !ok {
		t.Errorf("event %s with headers %s not delivered", direct.ID, direct.Headers)
	} else if et, tr := headerValues(m, "event_type"), headerValues(m, "trace"); len(et) != 1 || et[0] != "Created" || len(tr) != 1 || tr[0] != "t-1" {
		t.Errorf("event %s: event_type %q, trace %q; want [Created], [t-1]", direct.ID, et, tr)
	}
	if m, ok := got[array.ID]; !ok {
		t.Errorf("event %s with headers %s not delivered", array.ID, array.Headers)
	} else if len(m.Headers) != 3 {
		t.Errorf("event %s has headers %v; want only id, event_type, aggregate_type", array.ID, m.Headers)
	}

	// The operator fixes the routing (an override) and drops the too-large
	// head, requeues the unroutable event: everything arrives with its
	// headers, in order.
	cfg := f.retryConfig(t)
	cfg.Router.Overrides = map[string]string{"Bad Type!": f.prefix + ".Customer"}
	run = f.start(t, cfg)
	store := f.retryStore(t)
	if _, err := store.Drop(context.Background(), []string{head}); err != nil {
		t.Fatalf("Drop(head): %v", err)
	}
	if _, err := store.Requeue(context.Background(), []string{unroutable.ID}); err != nil {
		t.Fatalf("Requeue(unroutable): %v", err)
	}
	waitFor(t, time.Minute, "the waiting events and the requeued one delivered", func() (bool, string) {
		n := len(f.retryRows(t))
		return n == 0, fmt.Sprintf("%d retry rows left", n)
	})
	run.stop(t)

	var seqs []string
	for _, m := range f.kafka.ReadAll(t, topic) {
		if string(m.Key) == "blocked" {
			seqs = append(seqs, string(m.Value))
		}
	}
	if want := []string{`{"seq": 1}`, `{"seq": 2}`, `{"seq": 3}`}; strings.Join(seqs, ",") != strings.Join(want, ",") {
		t.Errorf("aggregate 'blocked' delivered %q; want %q", seqs, want)
	}
	got = byID(t, f.kafka.ReadAll(t, topic))
	for i, e := range waiting {
		m, ok := got[e.ID]
		if !ok {
			t.Errorf("waiting event %d (%s) not delivered", i+1, e.ID)
			continue
		}
		if n := headerValues(m, "n"); i < 2 && (len(n) != 1 || n[0] != fmt.Sprint(i+1)) {
			t.Errorf("waiting event %d: header n = %q; want [%d]", i+1, n, i+1)
		}
		if et := headerValues(m, "event_type"); len(et) != 1 || et[0] != "Changed" {
			t.Errorf("waiting event %d: event_type %q; want [Changed]", i+1, et)
		}
	}
	req := byID(t, f.kafka.ReadAll(t, f.prefix+".Customer"))[unroutable.ID]
	if want := fmt.Sprintf("id=%s event_type=Changed aggregate_type=Bad Type! trace=t-2", unroutable.ID); headersText(req) != want {
		t.Errorf("requeued event's headers = %q; want %q", headersText(req), want)
	}
}

func headersText(m testenv.Message) string {
	var parts []string
	for _, h := range m.Headers {
		parts = append(parts, h.Key+"="+string(h.Value))
	}
	return strings.Join(parts, " ")
}

// Problem 2: an event the retry table refused (an aggregate id too large for
// a btree index, or any data error) was retried forever, stopping every
// aggregate. Now each is stored (as a last resort, whole but dead) and the
// stream goes on.
func TestRetryTableStoresHostileEvents(t *testing.T) {
	f := newFixture(t)
	// Something in the user's database that refuses one row: a data error
	// the relay cannot foresee.
	f.pg.Exec(t, `ALTER TABLE outbox_relay_retry ADD CONSTRAINT refuse_one CHECK (aggregate_id IS DISTINCT FROM 'refuse-me')`)
	run := f.start(t, f.retryConfig(t))

	b := make([]byte, 6000)
	rand.Read(b)
	hugeID := hex.EncodeToString(b) // 12 KB, incompressible
	big := `{"blob": "` + strings.Repeat("x", 1_500_000) + `"}`
	huge := event{ID: newUUID(), AggregateType: "Order", AggregateID: hugeID, EventType: "Big", Payload: big}
	refused := event{ID: newUUID(), AggregateType: "Order", AggregateID: "refuse-me", EventType: "Big", Payload: big}
	behind := event{ID: newUUID(), AggregateType: "Order", AggregateID: hugeID, EventType: "Small", Payload: `{}`}
	f.insertRaw(t, huge)
	f.insertRaw(t, refused)
	f.insertRaw(t, behind)
	good := f.makeEvents(30)
	f.insertTx(t, good)

	f.waitCount(t, 30, time.Minute)
	ends := f.commitEnds(t)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	rows := f.retryRows(t)
	for name, e := range map[string]event{"12 KB aggregate id": huge, "refused by a constraint": refused, "behind the 12 KB one": behind} {
		r, ok := rows[e.ID]
		if !ok {
			// A last-resort row keeps the event in a document, which Get
			// reads back.
			for _, r2 := range rows {
				full, err := f.retryStore(t).Get(context.Background(), fmt.Sprint(r2.Seq))
				if err == nil && full.LastResort && full.EventID == e.ID {
					r, ok = full, true
				}
			}
		}
		if !ok {
			t.Errorf("%s: event %s is neither in Kafka nor in the retry table", name, e.ID)
			continue
		}
		if r.LastError == "" {
			t.Errorf("%s: retry row has no reason", name)
		}
	}
	run.stop(t)
}

// Problem 3: a mapped column dropped while running turned every later event
// into an empty dead row while the slot moved on. Now the relay stops before
// confirming the first affected event, naming the column, and after the
// config is fixed it delivers everything, in order.
func TestSchemaDriftStops(t *testing.T) {
	f := newFixture(t)
	cfg := f.retryConfig(t)
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()

	before := f.makeEvents(20)
	f.insertTx(t, before)
	f.waitCount(t, 20, time.Minute)
	confirmedBefore := f.slotConfirmed(t)

	f.pg.Exec(t, `ALTER TABLE outbox DROP COLUMN headers`)
	after := f.makeEvents(20)
	b := &pgx.Batch{}
	for _, e := range after {
		b.Queue(`INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) VALUES ($1, $2, $3, $4, $5)`,
			e.ID, e.AggregateType, e.AggregateID, e.EventType, e.Payload)
	}
	f.commitBatch(t, b)
	select {
	case err := <-done:
		var se *router.SchemaError
		if !errors.As(err, &se) || se.Column != "headers" || !strings.Contains(err.Error(), "outbox.columns.headers") {
			t.Fatalf("Run = %v; want a *router.SchemaError naming column headers and outbox.columns.headers", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the relay did not stop after a mapped column was dropped")
	}
	ends := f.commitEnds(t)
	if got := f.checkpointLSN(t); got >= ends[len(ends)-1] {
		t.Errorf("checkpoint %s passed the transaction with the incomplete events (ends %s)", got, ends[len(ends)-1])
	}
	if got := f.slotConfirmed(t); got >= ends[len(ends)-1] {
		t.Errorf("slot confirmed %s past the transaction with the incomplete events (ends %s; before %s)", got, ends[len(ends)-1], confirmedBefore)
	}
	if n := len(f.retryRows(t)); n != 0 {
		t.Errorf("retry table holds %d rows; want none (nothing incomplete stored)", n)
	}

	// The operator follows the error: no headers column.
	cfg = f.retryConfig(t)
	cfg.Router.Columns.Headers = router.NoHeaders
	run := f.start(t, cfg)
	f.waitCount(t, 40, time.Minute)
	f.waitConfirmed(t, ends[len(ends)-1], time.Minute)
	f.pg.Exec(t, `ALTER TABLE outbox ADD COLUMN headers jsonb`) // for the checker, which reads it
	if rep := f.checkDelivered(t); rep.orderViolations != 0 || rep.mismatches != 0 {
		t.Errorf("after the fix: order violations %d, mismatches %d: %s", rep.orderViolations, rep.mismatches, rep.firstProblem)
	}
	run.stop(t)
}

// Problem 7: a --start-lsn beyond the current WAL was accepted and skipped
// every event until the WAL got there.
func TestStartLSNBeyondWALRefused(t *testing.T) {
	f := newFixture(t)
	cfg := f.config(t)
	cfg.StartLSN = pglogrepl.LSN(1 << 40)
	r, err := newRelay(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = r.Run(ctx)
	var fe *relay.FutureStartError
	// The command line's hint names --start-lsn and --force (cmd/outbox-relay TestHints).
	if !errors.As(err, &fe) || fe.Requested != cfg.StartLSN || !strings.Contains(err.Error(), "force it") {
		t.Fatalf("Run(start LSN %s) = %v; want a *relay.FutureStartError saying to give an earlier position or force it", cfg.StartLSN, err)
	}
	if got := f.slotConfirmed(t); got >= cfg.StartLSN {
		t.Errorf("slot moved to %s", got)
	}
}

// startReady starts a relay of cfg serving /readyz on an address of its
// own, delivers 10 events and waits 20s for it to be ready; it returns the
// relay and the address.
func (f *fixture) startReady(t *testing.T, cfg relay.Config) (*running, string) {
	t.Helper()
	cfg.MetricsListen = testenv.FreeAddr(t)
	run := f.start(t, cfg)
	f.insertTx(t, f.makeEvents(10))
	f.waitCount(t, 10, time.Minute)
	waitReady(t, cfg.MetricsListen, 20*time.Second, "ready")
	return run, cfg.MetricsListen
}

// waitReady waits up to timeout for /readyz at addr to answer 200.
func waitReady(t *testing.T, addr string, timeout time.Duration, what string) {
	t.Helper()
	waitFor(t, timeout, what, func() (bool, string) {
		body, code := httpBody(t, "http://"+addr+"/readyz")
		return code == 200, body
	})
}

// Problem 6, and the health issue's stalled pipeline: /readyz says what is
// wrong while the retry table refuses writes (the pipeline then must wait),
// and is ready again once it accepts them, with nothing lost.
func TestReadyWhileRetryTableRefuses(t *testing.T) {
	f := newFixture(t)
	cfg := f.retryConfig(t)
	cfg.StallAfter = 3 * time.Second
	// Not the data's fault: the table refuses every insert.
	f.pg.Exec(t, `CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'retry table offline for maintenance'; END $$`)
	f.pg.Exec(t, `CREATE TRIGGER refuse BEFORE INSERT ON outbox_relay_retry FOR EACH ROW EXECUTE FUNCTION refuse()`)
	run, addr := f.startReady(t, cfg)

	bad := event{ID: newUUID(), AggregateType: "Bad Type!", AggregateID: "b-1", EventType: "X", Payload: `{}`}
	f.insertRaw(t, bad)
	f.insertTx(t, f.makeEvents(10))
	waitFor(t, 30*time.Second, "/readyz 503 naming the retry table and the stall", func() (bool, string) {
		body, code := httpBody(t, "http://"+addr+"/readyz")
		return code == 503 && strings.Contains(body, "retry table") && strings.Contains(body, "stalled"), fmt.Sprintf("%d %s", code, body)
	})
	metricsBody, _ := httpBody(t, "http://"+addr+"/metrics")
	if sumMetric(metricsBody, `outbox_relay_health_failing{check="retry_table"}`) != 1 || sumMetric(metricsBody, "outbox_relay_ready") != 0 {
		t.Errorf("metrics do not show the failing retry table:\n%s", grepLines(metricsBody, "outbox_relay_health_failing", "outbox_relay_ready"))
	}

	f.pg.Exec(t, `DROP TRIGGER refuse ON outbox_relay_retry`)
	waitReady(t, addr, 30*time.Second, "ready again")
	f.waitCount(t, 20, time.Minute)
	if _, ok := f.retryRows(t)[bad.ID]; !ok {
		t.Errorf("the unroutable event is not in the retry table")
	}
	run.stop(t)
}

// Problem 6: /readyz said "ready" through a broker outage under load (its ping
// was answered from a metadata cache).
func TestReadyDuringKafkaOutage(t *testing.T) {
	testenv.Exclusive(t)
	f := newFixture(t)
	run, addr := f.startReady(t, f.config(t))

	testenv.PauseKafka(t)
	paused := true
	defer func() {
		if paused {
			testenv.ResumeKafka(t)
		}
	}()
	f.insertTx(t, f.makeEvents(10))
	waitFor(t, 30*time.Second, "/readyz 503 naming kafka", func() (bool, string) {
		body, code := httpBody(t, "http://"+addr+"/readyz")
		return code == 503 && strings.Contains(strings.ToLower(body), "kafka"), fmt.Sprintf("%d %s", code, body)
	})
	testenv.ResumeKafka(t)
	paused = false
	waitReady(t, addr, time.Minute, "ready again")
	f.waitCount(t, 20, time.Minute)
	run.stop(t)
}

func grepLines(body string, prefixes ...string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				out = append(out, l)
			}
		}
	}
	return strings.Join(out, "\n")
}

// httpBody GETs url and returns its body and status; 0 when the server does
// not answer (yet).
func httpBody(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}
