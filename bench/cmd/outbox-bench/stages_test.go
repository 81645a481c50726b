package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestReadStages: a relay's stage trace gives each stage's figures per event
// of the timed phase (chunks committed before it are the warm-up's), and the
// slowest chunk split by stage; the report shows them.
func TestReadStages(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "relay-sustained-100-run1.stages")
	t0 := time.Unix(1_800_000_000, 0)
	ns := func(d time.Duration) string { return itoa(t0.Add(d).UnixNano()) }
	lines := []string{
		// warm-up, before the phase: left out
		"5 " + ns(-time.Second) + " " + ns(-time.Second+time.Millisecond) + " " + ns(-time.Second+2*time.Millisecond) + " " + ns(-time.Second+3*time.Millisecond) + " " + ns(0),
		// 3 events: read 1 ms, route 2 ms, divert 0, kafka 4 ms
		"3 " + ns(0) + " " + ns(time.Millisecond) + " " + ns(3*time.Millisecond) + " " + ns(3*time.Millisecond) + " " + ns(7*time.Millisecond),
		// 1 event: kafka 50 ms, the slowest
		"1 " + ns(time.Second) + " " + ns(time.Second+time.Millisecond) + " " + ns(time.Second+2*time.Millisecond) + " " + ns(time.Second+3*time.Millisecond) + " " + ns(time.Second+53*time.Millisecond),
	}
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := readStages(path, t0)
	if err != nil {
		t.Fatal(err)
	}
	if st == nil || st.Total.Count != 4 {
		t.Fatalf("stages = %+v; want the 4 events of the phase", st)
	}
	if st.Read.P50 != time.Millisecond || st.Route.P50 != 2*time.Millisecond || st.Divert.P50 != 0 || st.Kafka.P50 != 4*time.Millisecond {
		t.Errorf("p50s read %s route %s divert %s kafka %s; want 1ms 2ms 0 4ms (3 of 4 events)", st.Read.P50, st.Route.P50, st.Divert.P50, st.Kafka.P50)
	}
	if st.Kafka.Max != 50*time.Millisecond || st.Total.Max != 53*time.Millisecond {
		t.Errorf("kafka max %s, total max %s; want 50ms, 53ms", st.Kafka.Max, st.Total.Max)
	}
	if w := st.Slowest; w == nil || w.Events != 1 || w.Kafka != 50*time.Millisecond || w.Total != 53*time.Millisecond || w.At != time.Second {
		t.Errorf("slowest = %+v; want the 1-event chunk committed 1s into the phase, kafka 50ms of 53ms", w)
	}

	if st, err := readStages(filepath.Join(dir, "none.stages"), t0); st != nil || err != nil {
		t.Errorf("readStages of a missing file = %+v, %v; want nil, nil (an older relay)", st, err)
	}
	bad := filepath.Join(dir, "bad.stages")
	if err := os.WriteFile(bad, []byte("1 2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readStages(bad, t0); err == nil || !strings.Contains(err.Error(), "bad.stages:1") {
		t.Errorf("readStages of a short line: %v; want an error naming the file and line", err)
	}

	r := &Report{Sustained: []SustainedRun{
		{Run: 1, Sink: "relay", PerTxn: 100, TargetRate: 10000, Events: 4, Stages: st},
		{Run: 1, Sink: "debezium", PerTxn: 100, TargetRate: 10000, Events: 4},
	}}
	r.summarize()
	var b strings.Builder
	r.writeStages(&b)
	md := b.String()
	for _, want := range []string{"| relay, 100 per txn at 10,000 events/s | kafka | 4", "slowest chunk (1 events, committed 1s into the phase)", "| **total** |"} {
		if !strings.Contains(md, want) {
			t.Errorf("stage table lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "debezium") {
		t.Errorf("stage table has Debezium, which writes no trace:\n%s", md)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
