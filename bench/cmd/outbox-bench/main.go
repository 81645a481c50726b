// Command outbox-bench measures the real outbox-relay binary on the workloads
// users run (issue 23): backlog drains in transactions of 1,000 and of one
// event, against pg_recvlogical on a slot of its own over the same WAL (the
// ceiling of one slot on this machine) and Debezium (-peers debezium); and the
// latency from COMMIT to Kafka acknowledgement at a fixed rate in transactions
// of 100 and of one event, the relay and Debezium in turn. It writes
// report.json (every figure), report.md (one table, the command and the
// environment) and plots; -soak instead runs the relay for a long time and
// writes its per-minute table as it goes.
//
// Invariants: every database, slot and topic it creates is unique to the
// invocation and dropped before it exits, also on failure and Ctrl-C; no slot
// is left behind inactive (it would retain WAL). It talks only to loopback
// addresses. Targets are printed PASS/FAIL, never asserted by tests. No figure
// is written into a report but from a measurement of the same invocation.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// options are the parsed flags and environment.
type options struct {
	Settings
	RelayBin    string
	RecvBin     string
	OutDir      string
	PostgresDSN string
	CleanupDSN  string // drops what the bench created; "" is PostgresDSN
	Brokers     []string
	Timeout     time.Duration
	RateSet     bool // -rate given: the soak takes it instead of measuring capacity
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("outbox-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.Events, "events", 500000, "backlog events of each drain")
	fs.IntVar(&o.PayloadBytes, "payload-bytes", 300, "approximate JSON payload size")
	drainPer := fs.String("per-txn", "1000,1", "events per transaction of the drains, comma-separated: one drain workload each")
	fs.IntVar(&o.Aggregates, "aggregates", 1000, "distinct aggregate ids (spread over 5 aggregate types)")
	fs.IntVar(&o.Rate, "rate", 10000, "sustained insert rate, events/s (lowered to what the producer holds)")
	fs.DurationVar(&o.Duration, "duration", 60*time.Second, "length of each sustained phase")
	fs.DurationVar(&o.RelayWarmUp, "relay-warm-up", dbzWarmUp, "how long the relay runs at the sustained rate, unmeasured, before "+
		"each timed phase: by default as long as Debezium's JIT warm-up, so both are measured warm (its first half second at a "+
		"rate was its slowest: a start transient, docs/performance.md); 0 measures from its first transaction on")
	sustainedPer := fs.String("sustained-per-txn", "100,1", "events per transaction of the sustained phases, comma-separated")
	fs.IntVar(&o.HighRate, "high-rate", 50000, fmt.Sprintf("events/s of the high-rate sustained workload (transactions of %d events, "+
		"-duration long; relay, exactly-once and the peers, as the other sustained phases); 0 skips it", highRatePerTxn))
	fs.BoolVar(&o.CPUProfile, "cpuprofile", false, "write a CPU profile of every relay process beside its log in the report directory "+
		"(relay-<workload>-run<N>.cpu; `go tool pprof -top bin/outbox-relay <file>`)")
	fs.IntVar(&o.Producers, "producers", 8, "producer connections of the sustained phases and the soak")
	fs.IntVar(&o.Runs, "runs", 3, "runs; medians are reported")
	fs.BoolVar(&o.SkipDrain, "skip-drain", false, "skip the backlog drains")
	fs.BoolVar(&o.SkipSustained, "skip-sustained", false, "skip the sustained-rate phases")
	fs.IntVar(&o.Tables, "tables", 3, "outbox tables of the tables workload: the -events backlog over them, read by one relay on one slot "+
		"against a relay and a slot per table (the first -per-txn size); 0 or 1 skips it")
	fs.BoolVar(&o.ExactlyOnce, "exactly-once", true, "also run the relay with delivery: exactly-once, beside at-least-once, in every drain and sustained phase")
	fs.BoolVar(&o.Quick, "quick", false, "smoke run: 20k events, 5 s at 2k events/s (4k for the high-rate workload), 1 run (explicit flags win)")
	fs.StringVar(&o.RelayBin, "relay", "bin/outbox-relay", "outbox-relay binary")
	fs.StringVar(&o.RecvBin, "pg-recvlogical", "/usr/lib/postgresql/15/bin/pg_recvlogical", "pg_recvlogical binary")
	fs.StringVar(&o.OutDir, "out", "docs/bench", "reports directory: each invocation writes <out>/<time>/ and links <out>/latest")
	fs.DurationVar(&o.Timeout, "timeout", 10*time.Minute, "longest wait for one drain or one process")
	peers := fs.String("peers", "", "comma-separated peers to run beside pg_recvlogical and the relay: debezium "+
		"(Kafka Connect standalone + Debezium "+debezium.Version+"; jars from `make debezium-libs`, Java 17)")
	fs.DurationVar(&o.Soak, "soak", 0, "instead of the runs: measure drain capacity (or take -rate), then run the relay "+
		"at half of it for this long, reporting RSS and p99 per minute as it goes (`make bench-soak`)")
	fs.StringVar(&o.CleanupDSN, "cleanup-dsn", os.Getenv("RELAY_BENCH_CLEANUP_DSN"), "DSN that drops the bench's slots and "+
		"databases, e.g. the dev superuser's (default $RELAY_BENCH_CLEANUP_DSN, else RELAY_POSTGRES_DSN)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var err error
	if o.DrainPerTxn, err = parseInts("-per-txn", *drainPer); err != nil {
		return o, err
	}
	if o.SustainedPerTxn, err = parseInts("-sustained-per-txn", *sustainedPer); err != nil {
		return o, err
	}
	for p := range strings.SplitSeq(*peers, ",") {
		if p = strings.TrimSpace(p); p != "" {
			o.Peers = append(o.Peers, p)
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o.RateSet = set["rate"]
	if o.Soak > 0 {
		o.Runs = 1
	}
	if o.Quick {
		if !set["events"] {
			o.Events = 20000
		}
		if !set["duration"] {
			o.Duration = 5 * time.Second
		}
		if !set["rate"] {
			o.Rate = 2000
		}
		if !set["runs"] {
			o.Runs = 1
		}
		if !set["high-rate"] {
			o.HighRate = 4000
		}
		if !set["relay-warm-up"] {
			o.RelayWarmUp = 2 * time.Second
		}
	}
	o.PostgresDSN = os.Getenv("RELAY_POSTGRES_DSN")
	for b := range strings.SplitSeq(os.Getenv("RELAY_KAFKA_BROKERS"), ",") {
		if b = strings.TrimSpace(b); b != "" {
			o.Brokers = append(o.Brokers, b)
		}
	}
	return o, o.validate()
}

// parseInts reads a comma-separated list of positive integers.
func parseInts(flag, s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%s: %q is not a positive number", flag, f)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: give at least one number", flag)
	}
	return out, nil
}

func (o *options) validate() error {
	switch {
	case o.PostgresDSN == "":
		return errors.New("RELAY_POSTGRES_DSN is empty: set it to a superuser DSN of a wal_level=logical server on 127.0.0.1")
	case len(o.Brokers) == 0:
		return errors.New("RELAY_KAFKA_BROKERS is empty: set it to host:port of a broker on 127.0.0.1")
	case o.Events < 1 || o.Aggregates < 1 || o.Runs < 1 || o.Producers < 1:
		return errors.New("-events, -aggregates, -producers and -runs must be at least 1")
	case o.Rate < slices.Max(o.SustainedPerTxn):
		return fmt.Errorf("-rate %d is below -sustained-per-txn %d: lower -sustained-per-txn", o.Rate, slices.Max(o.SustainedPerTxn))
	case o.HighRate != 0 && o.HighRate < highRatePerTxn:
		return fmt.Errorf("-high-rate %d is below its %d events per transaction: give at least %d, or 0 to skip it", o.HighRate, highRatePerTxn, highRatePerTxn)
	case o.SkipDrain && o.SkipSustained:
		return errors.New("-skip-drain and -skip-sustained together leave nothing to measure")
	case o.Soak < 0 || (o.Soak > 0 && o.Soak < time.Minute):
		return fmt.Errorf("-soak %s: give at least 1m (the soak reports per minute), or 0 for none", o.Soak)
	case o.Soak > 0 && len(o.Peers) > 0:
		return errors.New("-soak runs the relay alone: leave out -peers")
	}
	for _, p := range o.Peers {
		if p != "debezium" {
			return fmt.Errorf("-peers: unknown peer %q: the only peer is debezium", p)
		}
	}
	if err := checkLoopbackDSN(o.PostgresDSN); err != nil {
		return err
	}
	if o.CleanupDSN != "" {
		if err := checkLoopbackDSN(o.CleanupDSN); err != nil {
			return fmt.Errorf("-cleanup-dsn: %w", err)
		}
	}
	for _, b := range o.Brokers {
		host, _, err := net.SplitHostPort(b)
		if err != nil {
			return fmt.Errorf("broker %q: %w", b, err)
		}
		if !isLoopback(host) {
			return fmt.Errorf("broker %q is not on 127.0.0.1: the bench only talks to local servers", b)
		}
	}
	return nil
}

// checkLoopbackDSN refuses a DSN that names a host other than loopback: the
// bench creates and drops databases and must never touch a real server.
func checkLoopbackDSN(dsn string) error {
	var hosts []string
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		for h := range strings.SplitSeq(u.Host, ",") {
			if hh, _, err := net.SplitHostPort(h); err == nil {
				h = hh
			}
			hosts = append(hosts, h)
		}
		if h := u.Query().Get("host"); h != "" {
			hosts = append(hosts, h)
		}
	} else {
		for _, kv := range strings.Fields(dsn) {
			if h, ok := strings.CutPrefix(kv, "host="); ok {
				hosts = append(hosts, h)
			}
		}
	}
	if len(hosts) == 0 {
		return errors.New("RELAY_POSTGRES_DSN names no host: give host 127.0.0.1 explicitly")
	}
	for _, h := range hosts {
		if !isLoopback(h) {
			return fmt.Errorf("RELAY_POSTGRES_DSN host %q is not 127.0.0.1: the bench only talks to local servers", h)
		}
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "outbox-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, nil))

	started := time.Now()
	stamp := started.UTC().Format("20060102t150405z")
	dir := filepath.Join(o.OutDir, started.UTC().Format("20060102T150405Z"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Fprintln(stderr, "outbox-bench:", err)
		return 1
	}
	if _, err := os.Stat(o.RelayBin); err != nil {
		log.Warn("relay binary missing: build it with `go build -o bin/outbox-relay ./cmd/outbox-relay`", "path", o.RelayBin)
	}
	if slots, err := leftoverSlots(ctx, o.PostgresDSN); err != nil {
		fmt.Fprintln(stderr, "outbox-bench:", err)
		return 1
	} else if len(slots) > 0 {
		log.Warn("inactive slots of an earlier bench run retain WAL; drop them with pg_drop_replication_slot and their outbox_bench_* databases",
			"slots", slots)
	}
	if dbs, err := leftoverDatabases(ctx, o.PostgresDSN); err == nil && len(dbs) > 0 {
		log.Warn("databases of an earlier bench run were left behind; drop them as a superuser with DROP DATABASE … WITH (FORCE)",
			"databases", strings.Join(dbs, ", "))
	}
	rep := &Report{
		Started: started,
		Command: commandLine(args),
		Env:     environment(ctx, o),
		Config:  o.Settings,
	}
	b := &bench{o: o, dir: dir, stamp: stamp, log: log, rep: rep, created: &created{}}
	if b.debezium() {
		rep.Debezium = dbzSetup()
	}
	if o.Soak > 0 {
		log.Info("soak", "duration", o.Soak)
		if err := b.soak(ctx); err != nil {
			log.Error("soak failed", "err", err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("soak: %v", err))
		}
	} else if !o.SkipSustained && slices.Contains(o.SustainedPerTxn, 1) {
		if rep.Producer, err = b.probeProducer(ctx); err != nil {
			log.Error("producer probe failed", "err", err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("producer probe: %v", err))
		}
	}
	for i := 1; o.Soak == 0 && i <= o.Runs && ctx.Err() == nil; i++ {
		log.Info("run", "run", i, "of", o.Runs)
		if err := b.runOnce(ctx, i); err != nil {
			log.Error("run failed", "run", i, "err", err)
			rep.Errors = append(rep.Errors, fmt.Sprintf("run %d: %v", i, err))
		}
	}
	if ctx.Err() != nil {
		rep.Errors = append(rep.Errors, "interrupted")
	}
	// Cleanup is best-effort on a shared server: say loudly what it missed.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	left, err := b.created.leftBehind(lctx, o.PostgresDSN, b.kafka())
	cancel()
	if err != nil {
		log.Warn("could not check for left-behind databases, slots and topics", "err", err)
	}
	rep.LeftBehind = left
	if len(left) > 0 {
		log.Warn("WARNING: the bench left these behind; remove them by hand", "left_behind", strings.Join(left, "; "))
	}
	rep.summarize()
	if err := writeResults(rep, dir, o.OutDir); err != nil {
		fmt.Fprintln(stderr, "outbox-bench:", err)
		return 1
	}
	_ = rep.writeSummary(stdout)
	fmt.Fprintf(stdout, "report: %s\n", filepath.Join(dir, "report.md"))
	if len(rep.Errors) > 0 {
		return 1
	}
	return 0
}

// commandLine is the invocation as the report shows it, the value of
// -cleanup-dsn (a superuser's password, often) left out.
func commandLine(args []string) string {
	out := []string{"outbox-bench"}
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == "cleanup-dsn" {
			out = append(out, "-cleanup-dsn=…")
			if !hasValue {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	return strings.Join(out, " ")
}

// environment describes the machine and the servers, best effort.
func environment(ctx context.Context, o options) Env {
	e := Env{Host: runtime.GOOS + "/" + runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			e.Load, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	if conn, err := pgx.Connect(ctx, o.PostgresDSN); err == nil {
		var v string
		if conn.QueryRow(ctx, "SHOW server_version").Scan(&v) == nil {
			e.Postgres = "PostgreSQL " + v
		}
		conn.Close(ctx)
	}
	if out, err := exec.CommandContext(ctx, o.RelayBin, "version").Output(); err == nil {
		e.Relay = strings.TrimSpace(string(out))
	}
	return e
}

// writeResults writes report.json, report.md and the plots into dir and
// points <out>/latest at it. report.json goes first: it is the source of the
// others.
func writeResults(rep *Report, dir, out string) error {
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report.json: %w", err)
	}
	var md strings.Builder
	if err := rep.writeMarkdown(&md); err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	files, err := rep.plots()
	if err != nil {
		return err
	}
	files["report.md"] = []byte(md.String())
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("write %s: %w", name, err)
		}
	}
	latest := filepath.Join(out, "latest")
	_ = os.Remove(latest)
	if err := os.Symlink(filepath.Base(dir), latest); err != nil {
		return fmt.Errorf("link latest: %w", err)
	}
	return nil
}
