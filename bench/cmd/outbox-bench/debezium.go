package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/outbox-relay/outbox-relay/internal/testenv/debezium"
)

// Debezium runs through the test harness's runner (internal/testenv/debezium:
// Launch), the same Kafka Connect 3.9.1 + Debezium 3.1.3.Final jars the
// compatibility tests use; what is the bench's own is the tuning below, which
// goes into the report as it ran (Report.Debezium).

const (
	dbzTopicPrefix = "outbox.dbz." // route.topic.replacement: Debezium's topics never mix with the relay's
	// dbzWarmUp is how long Debezium runs at the sustained rate before its
	// latency is measured, so that the JIT has compiled its hot paths (the
	// relay is compiled ahead of time and gets none).
	dbzWarmUp = 15 * time.Second
)

// dbzTuning is Debezium as a throughput-minded operator runs it. JVM: Kafka's
// own launch script's performance options (G1, 20 ms pause goal), full tiered
// compilation, a 1 GiB heap limit (a 65,536-record queue of ~0.5 KiB events needs
// a few tens of MiB, so it never limits throughput) and a small initial heap, so
// that peak RSS is what Debezium uses rather than a heap it was handed. Worker:
// producer batches of up to 1 MiB lingering at most 5 ms, acks=all as the relay,
// offsets flushed every second (Debezium confirms the slot only after a flush).
// Connector: batches of 8192 from a 65,536-record queue polled every 10 ms, the
// EventRouter on the relay's table layout with the relay's headers, so both
// write the same messages.
var dbzTuning = debezium.Options{
	JVMFlags: []string{
		"-Xms64m", "-Xmx1g",
		"-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
		"-Djava.awt.headless=true",
	},
	Converter:           "string",
	OffsetFlushInterval: time.Second,
	WorkerProps: map[string]string{
		"offset.flush.timeout.ms":           "10000",
		"task.shutdown.graceful.timeout.ms": "10000",
		"producer.acks":                     "all",
		"producer.linger.ms":                "5",
		"producer.batch.size":               "1048576",
		"producer.buffer.memory":            "67108864",
		"producer.max.request.size":         "1048576",
		"producer.compression.type":         "none",
	},
	Props: map[string]string{
		"publication.autocreate.mode":                         "disabled",
		"max.batch.size":                                      "8192",
		"max.queue.size":                                      "65536",
		"poll.interval.ms":                                    "10",
		"status.update.interval.ms":                           "1000",
		"transforms.outbox.table.field.event.id":              "id",
		"transforms.outbox.table.field.event.key":             "aggregate_id",
		"transforms.outbox.table.field.event.payload":         "payload",
		"transforms.outbox.route.by.field":                    "aggregate_type",
		"transforms.outbox.route.topic.replacement":           dbzTopicPrefix + "${routedByValue}",
		"transforms.outbox.table.fields.additional.placement": "event_type:header:event_type,aggregate_type:header:aggregate_type",
	},
}

// DebeziumSetup is the tuning as it ran, for the report: what is the same in
// every run (no names, ports or password).
type DebeziumSetup struct {
	Version     string            `json:"version"`
	JVMFlags    []string          `json:"jvm_flags"`
	WorkerProps map[string]string `json:"worker_properties"`
	Props       map[string]string `json:"connector_properties"`
	WarmUp      time.Duration     `json:"sustained_warm_up_ns"`
}

func dbzSetup() *DebeziumSetup {
	return &DebeziumSetup{Version: debezium.Version, JVMFlags: dbzTuning.JVMFlags,
		WorkerProps: dbzTuning.WorkerProps, Props: dbzTuning.Props, WarmUp: dbzWarmUp}
}

// dbzTopicsFor returns the topics the router sends the prefixed aggregate types to.
func dbzTopicsFor(typePrefix string) []string {
	ts := make([]string, len(aggregateTypes))
	for i, t := range aggregateTypes {
		ts[i] = dbzTopicPrefix + typePrefix + t
	}
	return ts
}

// dbzWorker is one Kafka Connect standalone JVM running the connector, seen
// as a proc for its CPU and memory.
type dbzWorker struct {
	*debezium.Connect
	dir      string    // its properties (with the password) and log, removed by stop
	logCopy  string    // where stop copies the log: beside the reports
	launched time.Time // before the JVM started
}

// startDebezium launches Debezium on slot and returns once it streams; the
// time from launch to then is its start-up.
func (b *bench) startDebezium(ctx context.Context, db *benchDB, slot, label string) (*dbzWorker, error) {
	dir, err := os.MkdirTemp("", "outbox-bench-"+label+"-")
	if err != nil {
		return nil, err
	}
	o := dbzTuning
	o.DSN, o.Slot, o.Publication, o.TopicPrefix = db.DSN, slot, db.DbzPublication, db.Name
	w := &dbzWorker{dir: dir, logCopy: filepath.Join(b.dir, label+".log"), launched: time.Now()}
	w.Connect, err = debezium.Launch(ctx, o, b.o.Brokers, dir)
	if err != nil {
		copyFile(filepath.Join(dir, "connect.log"), w.logCopy)
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return w, nil
}

// stop ends the JVM and returns what it cost, keeping its log.
func (w *dbzWorker) stop() usage {
	_ = w.Close()
	copyFile(w.LogFile(), w.logCopy)
	_ = os.RemoveAll(w.dir)
	u := usage{}
	if st := w.ProcessState(); st != nil {
		u.CPU = st.UserTime() + st.SystemTime()
		if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
			u.MaxRSS = ru.Maxrss * 1024
		}
	}
	return u
}

// exited reports whether the JVM has ended.
func (w *dbzWorker) exited() bool {
	select {
	case <-w.Exited():
		return true
	default:
		return false
	}
}

func (w *dbzWorker) cpu() (time.Duration, error) { return pidCPU(w.Pid()) }
func (w *dbzWorker) peakRSS() (int64, error)     { return pidStatus(w.Pid(), "VmHWM:") }
func (w *dbzWorker) logTail(n int) string        { return fileTail(w.LogFile(), n) }

func (w *dbzWorker) exitErr() string {
	if st := w.ProcessState(); st != nil && !st.Success() {
		return st.String()
	}
	return ""
}

// copyFile copies src to dst, best effort: a log that cannot be kept is no
// reason to fail a measurement.
func copyFile(src, dst string) {
	in, err := os.Open(src)
	if err != nil {
		return
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return
	}
	defer out.Close()
	_, _ = io.Copy(out, in)
}

// dbzSink runs Debezium on a slot of its own, created now: the relay's phase
// came before and its rows are not Debezium's to deliver.
func (b *bench) dbzSink(db *benchDB, run int, w workload) sustainedSink {
	return sustainedSink{
		name: "debezium", typePrefix: fmt.Sprintf("b%sr%dz%d%s_", b.stamp, run, w.Per, w.tag()), topics: dbzTopicsFor, warmUp: dbzWarmUp,
		start: func(ctx context.Context) (runningSink, error) {
			if err := db.ensureObjects(ctx, []string{db.DbzPublication}, []string{db.DbzSlot}); err != nil {
				return nil, err
			}
			return b.startDebezium(ctx, db, db.DbzSlot, fmt.Sprintf("debezium-sustained-%d%s-run%d", w.Per, w.tag(), run))
		},
	}
}
