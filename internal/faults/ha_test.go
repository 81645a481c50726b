package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pglogrepl"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/internal/testenv"
)

// haFault is one way a leader goes away.
type haFault string

const (
	haKill haFault = "leader SIGKILL"
	haStop haFault = "leader SIGSTOP, later SIGCONT"
	haHold haFault = "leader's network to Postgres held, later healed"
)

// haRun is the size of one high-availability run.
type haRun struct {
	relays int
	faults map[haFault]int
	eos    bool // delivery: exactly-once, read read_committed
}

// takeoverMax bounds a takeover after SIGKILL (the requirement: the
// new leader delivers within 5s) and, after a freeze or a partition, the
// relay's wal_sender_timeout (10s) plus the same 5s.
const (
	takeoverKillMax   = 5 * time.Second
	takeoverFrozenMax = 10*time.Second + 5*time.Second
)

// TestHighAvailability runs two and three relay processes on one slot while a
// producer writes per-aggregate sequence numbers, and takes the leader away
// again and again: SIGKILL, SIGSTOP past the takeover and then SIGCONT, its
// network to Postgres held (packets dropped, nothing closed) past the
// takeover and then healed. Each relay reaches Postgres through its own
// Proxy. One aggregate type's topic exists only from the middle of the run on
// (auto-creation off), so its events wait in the retry table and the retry
// worker delivers them across the failovers.
//
// It checks what docs/high-availability.md promises: a standby takes over within
// takeoverKillMax of a SIGKILL and within takeoverFrozenMax of a freeze or a
// partition; a former leader that wakes up steps down; every event is
// delivered once at least, in order per aggregate, with duplicates within
// (takeovers + freezes and partitions) × max_in_flight_events; checkpoint
// saves of all processes, ordered by when they began, never go back in epoch
// or LSN (no two leaders save at once); retry rows only for the late topic's
// events and the poison ones.
//
// Reduced in `make test`; RELAY_FAULTS=full (make test-faults) runs 10
// SIGKILLs and 2 of each other fault per relay count.
func TestHighAvailability(t *testing.T) {
	runs := map[string]haRun{
		"2 relays": {relays: 2, faults: map[haFault]int{haKill: 3, haStop: 1}},
		"3 relays": {relays: 3, faults: map[haFault]int{haKill: 2, haHold: 1}},
	}
	if os.Getenv("RELAY_FAULTS") == "full" {
		runs = map[string]haRun{
			"2 relays": {relays: 2, faults: map[haFault]int{haKill: 10, haStop: 2, haHold: 2}},
			"3 relays": {relays: 3, faults: map[haFault]int{haKill: 10, haStop: 2, haHold: 2}},
		}
	}
	bin := testenv.RelayBinary(t)
	for _, name := range []string{"2 relays", "3 relays"} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) { runHA(t, bin, runs[name]) })
	}
}

// TestHighAvailabilityExactlyOnce is TestHighAvailability with delivery:
// exactly-once, read read_committed: each takeover also takes the slot's
// transactional id, fencing the former leader in Kafka itself, and the
// stream's duplicates are 0 (the late topic's events, sent by the retry
// worker, are marked at least once and counted apart). Reduced: one run of
// each fault over 2 and 3 relays; RELAY_FAULTS=full runs
// TestHighAvailability's full runs.
func TestHighAvailabilityExactlyOnce(t *testing.T) {
	runs := map[string]haRun{
		"2 relays": {relays: 2, faults: map[haFault]int{haKill: 2, haStop: 1}, eos: true},
		"3 relays": {relays: 3, faults: map[haFault]int{haKill: 2, haHold: 1}, eos: true},
	}
	if os.Getenv("RELAY_FAULTS") == "full" {
		runs = map[string]haRun{
			"2 relays": {relays: 2, faults: map[haFault]int{haKill: 10, haStop: 2, haHold: 2}, eos: true},
			"3 relays": {relays: 3, faults: map[haFault]int{haKill: 10, haStop: 2, haHold: 2}, eos: true},
		}
	}
	bin := testenv.RelayBinary(t)
	for _, name := range []string{"2 relays", "3 relays"} {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) { runHA(t, bin, runs[name]) })
	}
}

// haRelay is one relay process, restarted by its supervisor when it ends.
type haRelay struct {
	n       int
	sup     *supervisor
	proxy   *Proxy
	metrics string // host:port
	logPath string
}

func runHA(t *testing.T, bin string, run haRun) {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("RELAY_FAULTS_SEED"); v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("RELAY_FAULTS_SEED=%q: %v", v, err)
		}
	}
	t.Logf("high availability: %d relays, %s, seed %d", run.relays, delivery(run.eos), seed)
	s := &suite{t: t, m: reduced, rng: mrand.New(mrand.NewPCG(seed, 2)), began: time.Now(), count: map[faultKind]int{}, eos: run.eos}
	s.prepare("ha")
	late := aggregateTypes[len(aggregateTypes)-1].name
	for _, at := range aggregateTypes[:len(aggregateTypes)-1] {
		s.kafka.CreateTopic(t, s.topic(at.name), 4)
	}
	target, err := hostPort(s.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}

	deliveryEnv := s.deliveryEnv()
	svcCtx, stopSvc := context.WithCancel(context.Background())
	services, _ := errgroup.WithContext(svcCtx)
	relays := make([]*haRelay, run.relays)
	for i := range relays {
		px, err := Listen("127.0.0.1:0", target)
		if err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		f, err := os.CreateTemp("", fmt.Sprintf("outbox-relay-ha-%d-*.log", i))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r := &haRelay{n: i, proxy: px, metrics: "127.0.0.1:" + port, logPath: f.Name()}
		r.sup = &supervisor{bin: bin, log: f, reqs: make(chan signalReq),
			env: append(s.relayEnv(withHostPort(s.pg.DSN, px.Addr()), r.metrics), "RELAY_LOG_LEVEL=debug")}
		r.sup.env = append(r.sup.env, deliveryEnv...)
		relays[i] = r
		t.Logf("relay %d: metrics %s, output %s", i, r.metrics, r.logPath)
		services.Go(func() error { return px.Serve(svcCtx) })
		services.Go(func() error { return r.sup.Run(svcCtx) })
	}
	// Whatever happens, no relay stays frozen or cut off: a stopped process
	// would outlive the test.
	healAll := func() {
		for _, r := range relays {
			r.proxy.Release()
			if pid := r.sup.Pid(); pid != 0 {
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
	}
	prod := newProducer(s.pg.DSN, seed, 400)
	stopProducer := prod.start(t)
	defer func() {
		healAll()
		stopProducer()
		stopSvc()
		if err := services.Wait(); err != nil {
			t.Errorf("proxy or relay supervisor: %v", err)
		}
	}()

	// A relay that does not answer says why in its output (one that cannot
	// start exits and is restarted, again and again).
	outputs := func() string {
		var b strings.Builder
		for _, r := range relays {
			out, _ := os.ReadFile(r.logPath)
			fmt.Fprintf(&b, "relay %d (%s), last lines:\n%s\n", r.n, r.logPath, lastLines(string(out), 15))
		}
		return b.String()
	}
	first, err := waitLeader(relays, -1, 60*time.Second)
	if err != nil {
		t.Fatalf("no relay leads within 60s of the start: %v\n%s", err, outputs())
	}
	// A standby is healthy and ready: probes must not have it restarted.
	for _, r := range relays {
		if r.n == first {
			continue
		}
		if err := waitActive(r, false, 30*time.Second); err != nil {
			t.Fatalf("standby: %v\n%s", err, outputs())
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + r.metrics + path)
			if err != nil {
				t.Fatalf("standby relay %d %s: %v", r.n, path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("standby relay %d %s = %d %q; want 200", r.n, path, resp.StatusCode, body)
			}
		}
	}
	var plan []haFault
	for _, k := range []haFault{haKill, haStop, haHold} {
		for range run.faults[k] {
			plan = append(plan, k)
		}
	}
	s.rng.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	takeovers := map[haFault][]time.Duration{}
	var stepDowns []time.Duration
	for i, k := range plan {
		if i == len(plan)/2 {
			s.kafka.CreateTopic(t, s.topic(late), 4)
			s.logf("created the late topic %s: its events wait in the retry table until now", s.topic(late))
		}
		leader, err := waitLeader(relays, -1, 60*time.Second)
		if err != nil {
			t.Fatalf("fault %d (%s): no leader: %v\n%s", i+1, k, err, outputs())
		}
		l := relays[leader]
		pid := l.sup.Pid()
		began := time.Now()
		switch k {
		case haKill:
			if _, err := l.sup.Signal(context.Background(), syscall.SIGKILL, 0, time.Second); err != nil {
				t.Fatal(err)
			}
		case haStop:
			syscall.Kill(pid, syscall.SIGSTOP)
		case haHold:
			l.proxy.Hold()
		}
		next, err := waitLeader(relays, leader, takeoverFrozenMax+30*time.Second)
		took := time.Since(began)
		if err != nil {
			healAll()
			t.Fatalf("fault %d (%s on relay %d, pid %d): no other relay took over: %v\n%s", i+1, k, leader, pid, err, outputs())
		}
		takeovers[k] = append(takeovers[k], took)
		s.logf("fault %d: %s on relay %d (pid %d): relay %d leads after %s", i+1, k, leader, pid, next, took.Round(time.Millisecond))
		if k != haKill {
			// The former leader wakes up (or is reachable again) after the
			// takeover, with events in flight: it must step down.
			time.Sleep(2 * time.Second)
			woke := time.Now()
			if k == haStop {
				syscall.Kill(pid, syscall.SIGCONT)
			} else {
				l.proxy.Release()
			}
			if err := waitActive(l, false, 60*time.Second); err != nil {
				t.Errorf("fault %d: relay %d still says it leads 60s after it woke up: %v", i+1, leader, err)
			} else {
				stepDowns = append(stepDowns, time.Since(woke))
			}
		}
		time.Sleep(s.m.between(s.rng, [2]time.Duration{time.Second, 3 * time.Second}))
	}
	if run.faults[haKill]+run.faults[haStop]+run.faults[haHold] < 2 {
		s.kafka.CreateTopic(t, s.topic(late), 4)
	}

	stopProducer()
	ps := prod.Stats()
	s.logf("producer stopped: %d transactions, %d events, %d poison", ps.Transactions, ps.Events, ps.Poison)
	if _, err := waitLeader(relays, -1, 60*time.Second); err != nil {
		t.Fatalf("no leader to drain: %v\n%s", err, outputs())
	}
	last := s.lastOutboxCommit()
	s.m.drainMax = 5 * time.Minute
	s.waitDrained(last)
	s.logf("drained to %s", last)

	in := s.collect()
	_, lateRetried := takeLate(&in, late)
	rep := Check(in)

	// Stop every relay, so that their output is in their log files.
	healAll()
	stopSvc()
	if err := services.Wait(); err != nil {
		t.Errorf("proxy or relay supervisor: %v", err)
	}
	saves, err := readSaves(relays)
	if err != nil {
		t.Fatal(err)
	}
	overlaps := checkSaves(saves)
	// A takeover continues from the checkpoint the group shares: no relay
	// may have taken the slot for one that does not (DESIGN invariant 14).
	for _, r := range relays {
		if b, err := os.ReadFile(r.logPath); err == nil && strings.Contains(string(b), "does not continue from the checkpoint") {
			t.Errorf("relay %d refused the slot after a takeover (see %s): the HA group's own confirmations must explain it", r.n, r.logPath)
		}
	}

	nTake := 0
	for _, d := range takeovers {
		nTake += len(d)
	}
	bound := (nTake + run.faults[haStop] + run.faults[haHold]) * window
	if run.eos {
		bound = 0
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "high availability report\t\t%d relays, %s, seed %d, %s\n", run.relays, delivery(run.eos), seed, time.Since(s.began).Round(time.Second))
	for _, k := range []haFault{haKill, haStop, haHold} {
		if d := takeovers[k]; len(d) > 0 {
			fmt.Fprintf(w, "takeover after %s\t%d\tmedian %s, max %s\n", k, len(d), median(d).Round(time.Millisecond), slices.Max(d).Round(time.Millisecond))
		}
	}
	if len(stepDowns) > 0 {
		fmt.Fprintf(w, "former leader stepped down after waking\t%d\tmedian %s, max %s\n", len(stepDowns), median(stepDowns).Round(time.Millisecond), slices.Max(stepDowns).Round(time.Millisecond))
	}
	fmt.Fprintf(w, "producer events\t%d\t(%d poison)\n", ps.Events+ps.Poison, ps.Poison)
	fmt.Fprintf(w, "late-topic events through the retry table\t%d\t\n", lateRetried)
	fmt.Fprintf(w, "checkpoint saves logged\t%d\t(%d epochs)\n", len(saves), epochs(saves))
	fmt.Fprintf(w, "LOST\t%d\twant 0\n", rep.Lost)
	fmt.Fprintf(w, "DUPLICATES\t%d\twant <= %d\n", rep.Duplicates, bound)
	fmt.Fprintf(w, "duplicates marked at least once\t%d\t(sent by the retry worker)\n", rep.MarkedDuplicates)
	fmt.Fprintf(w, "ORDER violations\t%d\twant 0\n", rep.OrderViolations)
	fmt.Fprintf(w, "saves out of epoch or LSN order\t%d\twant 0\n", len(overlaps))
	w.Flush()
	t.Logf("\n%s", b.String())

	if rep.Lost != 0 {
		t.Errorf("LOST %d events; want 0", rep.Lost)
	}
	if rep.OrderViolations != 0 {
		t.Errorf("%d ORDER violations; want 0", rep.OrderViolations)
	}
	switch {
	case run.eos && rep.Duplicates > 0:
		t.Errorf("%d DUPLICATES read_committed with delivery: exactly-once; want 0", rep.Duplicates)
	case rep.Duplicates > bound:
		t.Errorf("%d DUPLICATES; want at most %d = (%d takeovers + %d freezes and partitions) × %d", rep.Duplicates, bound, nTake, run.faults[haStop]+run.faults[haHold], window)
	}
	if rep.Mismatches != 0 || rep.PoisonWrong != 0 || rep.NonPoisonRetries != 0 {
		t.Errorf("%d content mismatches, %d poison handled wrong, %d retry rows for events neither poison nor of the late topic; want 0 each",
			rep.Mismatches, rep.PoisonWrong, rep.NonPoisonRetries)
	}
	if lateRetried == 0 {
		t.Errorf("no event of the late topic went through the retry table; the retry worker was not exercised across failovers")
	}
	if len(rep.Problems) > 0 {
		t.Errorf("first problems:\n  %s", strings.Join(rep.Problems, "\n  "))
	}
	if len(overlaps) > 0 {
		t.Errorf("checkpoint saves out of order across leaders (two leaders saving at once):\n  %s", strings.Join(overlaps[:min(len(overlaps), 10)], "\n  "))
	}
	if epochs(saves) < 2 {
		t.Errorf("saves logged with %d epochs; want at least 2 (%d takeovers)", epochs(saves), nTake)
	}
	for _, d := range takeovers[haKill] {
		if d > takeoverKillMax {
			t.Errorf("a takeover after SIGKILL took %s; want at most %s", d.Round(time.Millisecond), takeoverKillMax)
		}
	}
	for _, k := range []haFault{haStop, haHold} {
		for _, d := range takeovers[k] {
			if d > takeoverFrozenMax {
				t.Errorf("a takeover after %s took %s; want at most %s (wal_sender_timeout + 5s)", k, d.Round(time.Millisecond), takeoverFrozenMax)
			}
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(testenv.FreeAddr(t))
	return port
}

var metricsClient = &http.Client{Timeout: 300 * time.Millisecond}

// active reads the relay's outbox_relay_active gauge; ok is false when it
// does not answer (frozen, restarting, cut off).
func (r *haRelay) active() (leading, ok bool) {
	resp, err := metricsClient.Get("http://" + r.metrics + "/metrics")
	if err != nil {
		return false, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, false
	}
	for line := range strings.Lines(string(body)) {
		if v, found := strings.CutPrefix(strings.TrimSpace(line), "outbox_relay_active "); found {
			return v == "1", true
		}
	}
	return false, false
}

// waitLeader returns the relay, other than except, that says it leads.
func waitLeader(relays []*haRelay, except int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, r := range relays {
			if r.n == except {
				continue
			}
			if leading, _ := r.active(); leading {
				return r.n, nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return -1, fmt.Errorf("none within %s", within)
}

// waitActive waits until r answers with the given role.
func waitActive(r *haRelay, leading bool, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if l, ok := r.active(); ok && l == leading {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("relay %d never answered active=%v", r.n, leading)
}

// save is one "checkpoint saved" log line of a relay.
type save struct {
	relay  int
	began  time.Time
	epoch  int64
	lsn    pglogrepl.LSN
	source string
}

func readSaves(relays []*haRelay) ([]save, error) {
	var out []save
	for _, r := range relays {
		f, err := os.Open(r.logPath)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			if !strings.Contains(string(line), `"checkpoint saved"`) {
				continue
			}
			var rec struct {
				Msg, LSN, Began string
				Epoch           int64
			}
			if err := json.Unmarshal(line, &rec); err != nil || rec.Msg != "checkpoint saved" {
				continue
			}
			began, err := time.Parse(time.RFC3339Nano, rec.Began)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("relay %d: began %q: %v", r.n, rec.Began, err)
			}
			lsn, err := pglogrepl.ParseLSN(rec.LSN)
			if err != nil {
				f.Close()
				return nil, fmt.Errorf("relay %d: lsn %q: %v", r.n, rec.LSN, err)
			}
			out = append(out, save{relay: r.n, began: began, epoch: rec.Epoch, lsn: lsn, source: string(line)})
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// checkSaves orders the saves of every process by when they began and
// reports each one whose epoch or LSN is below an earlier one's: a save by a
// former leader that began after a newer leader's (fencing let it through),
// or a checkpoint moving backwards.
func checkSaves(saves []save) []string {
	slices.SortFunc(saves, func(a, b save) int { return a.began.Compare(b.began) })
	var bad []string
	var maxEpoch int64
	var maxLSN pglogrepl.LSN
	for _, s := range saves {
		if s.epoch < maxEpoch || s.lsn < maxLSN {
			bad = append(bad, fmt.Sprintf("relay %d saved %s in epoch %d at %s, after a save of epoch %d / LSN %s",
				s.relay, s.lsn, s.epoch, s.began.Format(time.StampMicro), maxEpoch, maxLSN))
		}
		maxEpoch, maxLSN = max(maxEpoch, s.epoch), max(maxLSN, s.lsn)
	}
	return bad
}

func epochs(saves []save) int {
	seen := map[int64]bool{}
	for _, s := range saves {
		seen[s.epoch] = true
	}
	return len(seen)
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
