package relay_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/relay"
)

// TestStageTrace: with Config.StageTrace set, every chunk the relay
// delivered whole is one line of its stage times, which add up to the
// events delivered and follow each other: commit, read by the route stage,
// taken by the writer, sent, acknowledged (the bench's breakdown of
// commit→ack reads them).
func TestStageTrace(t *testing.T) {
	t.Run("at least once", func(t *testing.T) {
		f := newFixture(t)
		testStageTrace(t, f, f.config(t))
	})
	t.Run("exactly once", func(t *testing.T) {
		f := newFixture(t)
		testStageTrace(t, f, f.eosConfig(t))
	})
}

func testStageTrace(t *testing.T, f *fixture, cfg relay.Config) {
	trace := &logBuffer{t: t}
	cfg.StageTrace = trace
	r := f.start(t, cfg)
	for range 5 {
		f.insertTx(t, f.makeEvents(20))
	}
	f.waitCount(t, 100, time.Minute)
	r.stop(t)

	trace.mu.Lock()
	text := trace.b.String()
	trace.mu.Unlock()
	events := 0
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		fields := strings.Fields(line)
		if len(fields) != 6 {
			t.Fatalf("stage trace line %q: want 6 fields (events commit read took sent acked)", line)
		}
		var v [6]int64
		for i, s := range fields {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n <= 0 {
				t.Fatalf("stage trace line %q: field %d is not a positive integer", line, i+1)
			}
			v[i] = n
		}
		events += int(v[0])
		for i := 2; i < 6; i++ {
			if v[i] < v[i-1] {
				t.Errorf("stage trace line %q: field %d (%d) before field %d (%d); want commit <= read <= took <= sent <= acked", line, i+1, v[i], i, v[i-1])
			}
		}
		if age := time.Since(time.Unix(0, v[1])); age < 0 || age > 5*time.Minute {
			t.Errorf("stage trace line %q: commit time %s ago; want this test's", line, age)
		}
	}
	if events != 100 {
		t.Errorf("stage trace counts %d events; want the 100 delivered:\n%s", events, text)
	}
}
