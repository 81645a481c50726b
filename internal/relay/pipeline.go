package relay

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"golang.org/x/sync/errgroup"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/eos"
	"github.com/outbox-relay/outbox-relay/internal/leader"
	"github.com/outbox-relay/outbox-relay/internal/placement"
	"github.com/outbox-relay/outbox-relay/internal/retry"
	"github.com/outbox-relay/outbox-relay/internal/source"
	"github.com/outbox-relay/outbox-relay/internal/walbuffer"
	"github.com/outbox-relay/outbox-relay/replication"
	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sink"
)

// The pipeline's stages are types that own their state (routeStage, writer,
// committer, gate), connected by channels of chunks and by the small
// interfaces below and of package leader (Fence, Saver).
// newPipeline wires them, the one way lead runs them; the server-free tests
// hand it fakes at the boundaries.

// A Sink delivers the relay's events to the broker; sink.Kafka is one, and a
// new sink need only keep this contract. Write blocks until every event is
// acknowledged, or returns ctx's error (it blocks through broker-wide
// outages, which are never an event's failure), or a *sink.WriteError
// listing the events that failed on their own, each with what its failure
// means (Permanent, Reason; sink.ErrBehind for an event held behind a failed
// one of its lane); every event it does not list was acknowledged. Send
// starts a write and returns its sink.Delivery, whose Wait returns what Write
// would; Deliveries are waited for in the order of their Sends, and a later
// Send's events of a lane that failed in an earlier one fail with
// sink.ErrBehind. Abandon gives up on every Send not yet waited for (none of
// their events counts as acknowledged). Ping asks the broker now, not a
// cache: nil when it answers. Outage reports the broker-wide failure streak
// Write is in: since when (zero: none) and its latest cause. Write, Send,
// Wait and Abandon are called from one goroutine at a time; Ping and Outage
// from any, also while Write blocks.
type Sink interface {
	Write(ctx context.Context, events []event.Event) error
	Send(ctx context.Context, events []event.Event) sink.Delivery
	Abandon()
	Ping(ctx context.Context) error
	Outage() (since time.Time, cause error)
}

// An eventSink is the part of a Sink the writer uses.
type eventSink interface {
	Send(ctx context.Context, events []event.Event) sink.Delivery
	Abandon()
}

// A retryTable stores the events the pipeline diverts: retry.Store's
// contract. Insert is durable when it returns nil and stores again nothing
// it already holds (same EventKey). Aggregates returns up to limit (0: all)
// of the aggregates with rows, sorted. Safe for concurrent use.
type retryTable interface {
	Insert(ctx context.Context, events []retry.Event) error
	Aggregates(ctx context.Context, limit int) ([]string, error)
	Undelivered(ctx context.Context, aggregates []string) (map[string]bool, error)
}

// An acker takes the chunks the writer finished (every event acknowledged
// or stored), in order, and is closed after the last: the committer, or a
// refill's tally.
type acker interface {
	ack(*chunk)
	close()
}

// A confirmer is the committer's side of the stream (replication.Stream):
// Confirm reports a position as handled to the server; Restart ends the
// current replication connection (the stream reconnects and resumes from the
// confirmed position), for a server that is shutting down and waits for its
// walsender's client. Neither blocks.
type confirmer interface {
	Confirm(lsn pglogrepl.LSN)
	Restart()
}

// A pipeline is the data path of one term, wired as lead runs it:
//
//	batches → route stage ─chunks→ writer ─acks→ committer ─Confirm→ stream
//	                                  └─ gate → retry table
//
// The writer asks the fence before each write and the committer saves
// through the saver (both the term's lease); every chunk is written in order
// by the one writer (several in flight, finished in order), which is what
// keeps the acknowledged prefix contiguous.
type pipeline struct {
	route  *routeStage
	writer *writer
	com    *committer
	gate   *gate
	win    *window
	health *health
	hist   *historian
}

// ends are a pipeline's boundaries: what lead passes from the term, and the
// tests as fakes.
type ends struct {
	// routers and placers: one of each per outbox table, as
	// Config.outboxes. The routers are the term's own: a router is not
	// safe for concurrent use.
	routers []*router.Router
	placers []*placement.Placer
	sink    eventSink
	gate    *gate // loaded from the retry table
	fence   leader.Fence
	saver   leader.Saver
	stream  confirmer
	history historyRecorder
	eos     *eos.Session // nil: at least once
	// buffer, when set, takes the chunks instead of the sink: a
	// buffering term's (walbuffer.go).
	buffer *walbuffer.Store
	// domains reads the database's domains again (a domain created while
	// the term runs); bases is what the routers were told at its start.
	domains func(context.Context) (map[uint32]router.BaseType, error)
	bases   map[uint32]router.BaseType
}

// newPipeline wires a pipeline that starts after start (the position the
// stream starts from, already saved).
func newPipeline(cfg Config, e ends, start pglogrepl.LSN) *pipeline {
	win := newWindow(cfg.MaxInFlightEvents, cfg.MaxInFlightBytes)
	h := newHealth(cfg.StallAfter, cfg.Logger)
	hist := newHistorian(e.history, cfg.Logger, cfg)
	maxMsgs, maxBytes := cfg.Sink.BatchSize, 4*int(cfg.Sink.BatchBytes)
	if e.eos != nil {
		// A chunk that ends a transaction is a Kafka transaction (package eos).
		maxMsgs, maxBytes = min(maxMsgs, cfg.TransactionMaxEvents), min(maxBytes, cfg.TransactionMaxBytes)
	}
	p := &pipeline{
		route: &routeStage{
			shapes: shapes(cfg, e), win: win,
			maxMsgs: maxMsgs, maxBytes: maxBytes,
			log: cfg.Logger, m: cfg.Metrics,
			trace: cfg.StageTrace != nil,
		},
		writer: newWriter(cfg, writerEnds{sink: e.sink, gate: e.gate, fence: e.fence}, win, h,
			writerRole{inFlight: true, traced: true, eos: e.eos}),
		com:  newCommitter(e.saver, e.stream, win, h, hist, cfg.Metrics, cfg.Logger, cfg, start),
		gate: e.gate, win: win, health: h, hist: hist,
	}
	if e.buffer != nil {
		p.writer.buffer = e.buffer
	}
	return p
}

// shapes are the shapes of change the route stage routes, as the config's
// source says: logical decoding messages (routed by the first outbox
// table's router: a message stands for one of its rows), and the inserts of
// the outbox tables, or, reading messages only, the refusal of any insert.
// A new shape of change is a new type in internal/source and its place in
// this list.
func shapes(cfg Config, e ends) []source.Shape {
	var out []source.Shape
	// The messages' series exists whatever the source, as it always has.
	msgM := cfg.Metrics.Table(messagesLabel(cfg.Replication.MessagePrefixes))
	if cfg.readsMessages() {
		out = append(out, source.NewMessages(e.routers[0], msgM))
	}
	if !cfg.readsTable() {
		return append(out, source.RefuseInserts{})
	}
	var tables []source.Table
	for i, o := range cfg.outboxes() {
		tables = append(tables, source.Table{Name: o.name, Router: e.routers[i], Placer: e.placers[i], M: cfg.Metrics.Table(o.name)})
	}
	return append(out, source.NewOutboxes(tables, source.OutboxesConfig{
		Log: cfg.Logger, Metrics: cfg.Metrics, Unreachable: unreachable,
		ReadDomains: e.domains, Bases: e.bases,
	}))
}

// messagesLabel is the table label of events read from logical decoding
// messages: "messages:" and the prefixes.
func messagesLabel(prefixes []string) string {
	return "messages:" + strings.Join(prefixes, ",")
}

// run runs the route stage, the writer and the committer on g. The route
// stage reads in until stop is closed (it stops at a transaction boundary),
// in is closed, or ctx ends; the committer returns once it saved the
// checkpoint of everything read. routed sees the route stage's error before
// g does (lead turns a stop before a schema change into a drain); committed
// runs when the committer returns.
func (p *pipeline) run(ctx context.Context, g *errgroup.Group, stop <-chan struct{}, in <-chan replication.Batch, routed func(error) error, committed func()) {
	// Unbuffered: the route stage grows its chunk while the writer is busy
	// (see routeStage.run).
	chunks := make(chan *chunk)
	g.Go(func() error { return routed(p.route.run(ctx, stop, in, chunks)) })
	g.Go(func() error { return p.writer.run(ctx, chunks, p.com) })
	g.Go(func() error {
		defer committed()
		return p.com.run(ctx)
	})
}

// A chunk is what the route stage hands the writer: events in commit order
// and what their acknowledgement allows to confirm.
type chunk struct {
	evs   []event.Event // routed events, to write
	bytes int           // their rows' bytes (row.Size)
	rows  int           // rows read into the chunk, each charged eventOverhead in the window

	endLSN     pglogrepl.LSN // end of the last transaction completed in this chunk, 0 if none
	commitTime time.Time     // its commit time
	covered    int           // events up to and including that transaction
	trailing   int           // events after it (a transaction still open at the end of the chunk)

	commits []commitRun    // commit of each run of evs: latency histogram
	fails   []routeFailure // events the router refused, in order

	// Stage times, only while Config.StageTrace is set: when the route
	// stage took the batch of the chunk's first event, when the writer took
	// the chunk, and when it handed it to the sink.
	readAt, tookAt, sentAt time.Time
}

// A commitRun is n consecutive events of one transaction.
type commitRun struct {
	at  time.Time
	lsn pglogrepl.LSN
	n   int
}

func (c *chunk) addCommit(lsn pglogrepl.LSN, at time.Time) {
	if n := len(c.commits); n > 0 && c.commits[n-1].lsn == lsn {
		c.commits[n-1].n++
		return
	}
	c.commits = append(c.commits, commitRun{at: at, lsn: lsn, n: 1})
}

// windowBytes is what the chunk holds of the window's bytes.
func (c *chunk) windowBytes() int { return c.bytes + c.rows*eventOverhead }

func (c *chunk) empty() bool {
	return len(c.evs) == 0 && len(c.fails) == 0 && c.endLSN == 0 && c.covered+c.trailing == 0
}

// A routeFailure is an event the router refused, carried in its chunk at its
// place among the routed events.
type routeFailure struct {
	before int // number of c.evs before it
	ev     event.Event
	err    error
}
