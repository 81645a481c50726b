package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"
)

// drainWorkload measures one backlog of -events in transactions of per events:
// pg_recvlogical, the relay and Debezium each read it from a slot of their
// own, created before the backlog so that all read the same WAL.
func (b *bench) drainWorkload(ctx context.Context, run, per int) (d DrainRun, err error) {
	d = DrainRun{Run: run, PerTxn: per, RecvFirst: run%2 == 1}
	fail := func(err error) (DrainRun, error) { d.Err = err.Error(); return d, err }
	db, err := b.workloadDB(ctx, fmt.Sprintf("r%d_d%d", run, per), true)
	if err != nil {
		return fail(err)
	}
	defer b.dropDatabase(ctx, db, &err)
	if err := b.drain(ctx, db, &d); err != nil {
		return fail(err)
	}
	return d, nil
}

// drain inserts the backlog, then lets pg_recvlogical, the relay and Debezium
// each read all of it. pg_recvlogical and the relay alternate between runs so
// that neither always gets the warmer page cache.
func (b *bench) drain(ctx context.Context, db *benchDB, d *DrainRun) error {
	run, per := d.Run, d.PerTxn
	prefix := fmt.Sprintf("b%sr%dd%d_", b.stamp, run, per)
	topics := topicsFor(prefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return err
	}
	defer b.deleteTopics(ctx, client, topics)

	p, err := newProducer(ctx, db.DSN, prefix, b.o.Aggregates, b.o.PayloadBytes, 1)
	if err != nil {
		return err
	}
	defer p.close(context.WithoutCancel(ctx))
	startLSN, err := p.walLSN(ctx)
	if err != nil {
		return err
	}
	events := max(b.o.Events/per, 1) * per
	b.log.Info("inserting backlog", "run", run, "events", events, "per_txn", per)
	t0 := time.Now()
	if err := p.insertBacklog(ctx, per, events/per-1); err != nil {
		return err
	}
	lastBefore, err := p.insertLastTxn(ctx, per)
	if err != nil {
		return err
	}
	d.InsertSec = time.Since(t0).Seconds()
	endLSN, err := p.walLSN(ctx)
	if err != nil {
		return err
	}
	d.Events = int64(events)
	d.WALBytes = int64(endLSN - startLSN)
	if d.PayloadBytes, err = p.payloadBytes(ctx); err != nil {
		return err
	}
	b.log.Info("backlog inserted", "run", run, "seconds", d.InsertSec, "wal_bytes", d.WALBytes, "end_lsn", endLSN.String())

	recv := func() error { return b.drainRecvlogical(ctx, db, endLSN, d) }
	relay := func() error { return b.drainRelay(ctx, db, lastBefore, topics, client, d) }
	order := []func() error{recv, relay}
	if !d.RecvFirst {
		order = []func() error{relay, recv}
	}
	if b.o.ExactlyOnce {
		// Right after (or, every other run, before) the at-least-once
		// relay: the two read the page cache alike.
		eos := func() error { return b.drainRelayEOS(ctx, db, lastBefore, prefix, client, d) }
		if d.RecvFirst {
			order = []func() error{recv, relay, eos}
		} else {
			order = []func() error{eos, relay, recv}
		}
	}
	// Debezium goes last: it is the slowest by far, and the page cache is then
	// at its warmest, which favours it rather than the relay.
	if b.debezium() {
		order = append(order, func() error { return b.drainDebezium(ctx, db, prefix, d) })
	}
	return inTurn(ctx, order)
}

func (b *bench) drainRecvlogical(ctx context.Context, db *benchDB, endLSN pglogrepl.LSN, d *DrainRun) error {
	args := []string{"-d", db.DSN, "--slot", db.RecvSlot, "--start", "--endpos", endLSN.String(),
		"-o", "proto_version=1", "-o", "publication_names=" + db.Publication, "-f", "/dev/null", "--no-loop"}
	p, err := startProc(b.o.RecvBin, args, os.Environ(), filepath.Join(b.dir, fmt.Sprintf("pg_recvlogical-%d-run%d.log", d.PerTxn, d.Run)))
	if err != nil {
		return fmt.Errorf("pg_recvlogical: %w", err)
	}
	u, err := p.wait(ctx, b.o.Timeout)
	if err != nil {
		p.stop(5 * time.Second)
		return fmt.Errorf("pg_recvlogical: %w", err)
	}
	if u.ExitError != "" {
		return fmt.Errorf("pg_recvlogical: %s: %s", u.ExitError, p.logTail(5))
	}
	d.RecvSec, d.RecvCPUSec = u.Wall.Seconds(), u.CPU.Seconds()
	b.log.Info("pg_recvlogical drained", "run", d.Run, "per_txn", d.PerTxn, "seconds", d.RecvSec, "events_per_s", int(d.RecvRate()))
	// Its slot has served its purpose: drop it now rather than let it
	// retain WAL through the other systems' turns.
	return b.dropSlot(ctx, db, db.RecvSlot)
}

// drainRelay starts the relay and measures until every event is in Kafka and
// the slot confirmed the last commit; then stops it with SIGTERM.
func (b *bench) drainRelay(ctx context.Context, db *benchDB, lastBefore pglogrepl.LSN, topics []string, client *kafka.Client, d *DrainRun) error {
	conn, err := pgx.Connect(ctx, db.AdminDSN)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	log := filepath.Join(b.dir, fmt.Sprintf("relay-drain-%d-run%d.log", d.PerTxn, d.Run))
	p, err := startProc(b.o.RelayBin, []string{"run"}, b.profiled(b.relayEnv(db), log), log)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	defer p.stop(30 * time.Second) // on the error paths
	var kafkaAt, confirmedAt time.Time
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; kafkaAt.IsZero() || confirmedAt.IsZero(); i++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("relay: not drained after %s (kafka %v, confirmed %v): %s", b.o.Timeout, !kafkaAt.IsZero(), !confirmedAt.IsZero(), p.logTail(5))
		case <-tick.C:
		}
		if p.exited() {
			return fmt.Errorf("relay exited while draining: %s: %s", p.exitErr(), p.logTail(10))
		}
		if confirmedAt.IsZero() {
			lsn, err := confirmedFlushLSN(ctx, conn, db.RelaySlot)
			if err != nil {
				return err
			}
			if lsn > lastBefore {
				confirmedAt = time.Now()
			}
		}
		// Kafka every 60 ms: ListOffsets over 40 partitions is not free on
		// two cores, and the slot check bounds the resolution anyway.
		if kafkaAt.IsZero() && i%3 == 0 {
			n, err := endOffsets(ctx, client, topics)
			if err != nil {
				return err
			}
			if n >= d.Events {
				kafkaAt = time.Now()
			}
		}
	}
	rss, rssErr := p.peakRSS()
	u := p.stop(30 * time.Second)
	if rssErr != nil {
		rss = u.MaxRSS
	}
	d.RelayKafkaSec = kafkaAt.Sub(p.started).Seconds()
	d.RelayConfirmedSec = confirmedAt.Sub(p.started).Seconds()
	d.RelaySec = max(d.RelayKafkaSec, d.RelayConfirmedSec)
	d.RelayCPUSec, d.PeakRSS, d.MaxRSS = u.CPU.Seconds(), rss, u.MaxRSS
	if d.KafkaRecords, err = endOffsets(ctx, client, topics); err != nil {
		return err
	}
	if u.ExitError != "" {
		b.log.Warn("relay did not exit cleanly on SIGTERM", "run", d.Run, "exit", u.ExitError)
	}
	b.log.Info("relay drained", "run", d.Run, "per_txn", d.PerTxn, "seconds", d.RelaySec, "events_per_s", int(d.RelayRate()), "peak_rss_bytes", d.PeakRSS)
	return nil
}

// drainDebezium starts a Kafka Connect worker with Debezium on its own slot of
// the backlog and measures until every event is in its topics. The clock
// starts when the JVM is launched; start-up (until its slot is active) is
// reported apart, and rate and CPU are taken over the streaming part alone:
// a long-running Debezium pays its start-up once. The slot's confirmation is
// not waited for (Debezium confirms only after an offset flush), which again
// favours Debezium over the relay.
func (b *bench) drainDebezium(ctx context.Context, db *benchDB, typePrefix string, d *DrainRun) error {
	pd := &PeerDrain{}
	d.Debezium = pd
	fail := func(err error) error { pd.Err = err.Error(); return err }
	topics := dbzTopicsFor(typePrefix)
	client := b.kafka()
	if err := b.createTopics(ctx, client, topics); err != nil {
		return fail(fmt.Errorf("debezium: %w", err))
	}
	defer b.deleteTopics(ctx, client, topics)
	w, err := b.startDebezium(ctx, db, db.DbzSlot, fmt.Sprintf("debezium-drain-%d-run%d", d.PerTxn, d.Run))
	if err != nil {
		return fail(err)
	}
	defer w.stop()
	streamAt := time.Now()
	cpu0, err := w.cpu()
	if err != nil {
		return fail(err)
	}
	pd.StartSec = streamAt.Sub(w.launched).Seconds()
	b.log.Info("debezium streaming", "run", d.Run, "start_up_seconds", pd.StartSec)
	deadline := time.After(b.o.Timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var doneAt time.Time
	for i := 0; doneAt.IsZero(); i++ {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline:
			n, _ := endOffsets(ctx, client, topics)
			return fail(fmt.Errorf("debezium: %d of %d events in Kafka after %s: %s", n, d.Events, b.o.Timeout, w.logTail(5)))
		case <-tick.C:
		}
		if w.exited() {
			return fail(fmt.Errorf("debezium exited while draining: %s: %s", w.exitErr(), w.logTail(10)))
		}
		if i%40 == 39 {
			if err := w.Failed(ctx); err != nil {
				return fail(fmt.Errorf("debezium: %w", err))
			}
		}
		n, err := endOffsets(ctx, client, topics)
		if err != nil {
			return fail(err)
		}
		if n >= d.Events {
			doneAt = time.Now()
		}
	}
	cpu1, cpuErr := w.cpu()
	rss, rssErr := w.peakRSS()
	u := w.stop()
	if rssErr != nil {
		rss = u.MaxRSS
	}
	if cpuErr != nil {
		cpu1 = u.CPU
	}
	pd.Sec = doneAt.Sub(w.launched).Seconds()
	pd.StreamSec = doneAt.Sub(streamAt).Seconds()
	pd.CPUSec, pd.TotalCPUSec, pd.StartCPUSec = (cpu1 - cpu0).Seconds(), u.CPU.Seconds(), cpu0.Seconds()
	pd.PeakRSS = rss
	if pd.Records, err = endOffsets(ctx, client, topics); err != nil {
		return fail(err)
	}
	b.log.Info("debezium drained", "run", d.Run, "per_txn", d.PerTxn, "seconds", pd.Sec, "streaming_seconds", pd.StreamSec,
		"events_per_s", int(d.DbzRate()), "peak_rss_bytes", pd.PeakRSS)
	return b.dropSlot(ctx, db, db.DbzSlot)
}

// dropSlot drops a slot that has served its purpose, even after ctx ends.
func (b *bench) dropSlot(ctx context.Context, db *benchDB, slot string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return db.dropSlot(cctx, slot)
}
