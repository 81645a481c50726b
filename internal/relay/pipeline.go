package relay

import (
	"context"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/outbox-relay/outbox-relay/event"
	"github.com/outbox-relay/outbox-relay/internal/retry"
)

// The pipeline's stages are types that own their state (routeStage, writer,
// committer, gate), connected by channels of chunks and by the small
// interfaces below, declared here where they are consumed, so that the
// failure logic runs in unit tests with hand-written fakes.

// An eventSink delivers events: sink.Kafka's contract. Write blocks until
// every event is acknowledged, or returns ctx's error (it blocks through
// broker-wide outages), or a *sink.WriteError listing the events that failed
// on their own; every event it does not list was acknowledged. One goroutine
// calls it.
type eventSink interface {
	Write(ctx context.Context, events []event.Event) error
}

// A retryTable stores the events the pipeline diverts: retry.Store's
// contract. Insert is durable when it returns nil and stores again nothing
// it already holds (same EventKey). Safe for concurrent use.
type retryTable interface {
	Insert(ctx context.Context, events []retry.Event) error
	Aggregates(ctx context.Context) ([]string, error)
	Undelivered(ctx context.Context, aggregates []string) (map[string]bool, error)
}

// A checkpointSaver persists the checkpoint: checkpoint.Store's contract.
// Save is durable when it returns nil.
// SaveFenced is Save for the leader of epoch (see lease.go).
type checkpointSaver interface {
	Save(ctx context.Context, slot string, lsn pglogrepl.LSN, commitTime time.Time) error
	SaveFenced(ctx context.Context, slot string, epoch int64, lsn pglogrepl.LSN, commitTime time.Time) error
}

// An acker takes the chunks the writer finished (every event acknowledged
// or stored), in order, and is closed after the last: the committer, or a
// refill's tally.
type acker interface {
	ack(*chunk)
	close()
}

// A confirmer reports a position as handled to the server: the stream's
// Confirm. It does not block.
type confirmer interface {
	Confirm(lsn pglogrepl.LSN)
}

// A chunk is what the route stage hands the writer: events in commit order
// and what their acknowledgement allows to confirm.
type chunk struct {
	evs   []event.Event // routed events, to write
	bytes int           // window bytes held by these events

	endLSN     pglogrepl.LSN // end of the last transaction completed in this chunk, 0 if none
	commitTime time.Time     // its commit time
	covered    int           // events up to and including that transaction
	trailing   int           // events after it (a transaction still open at the end of the chunk)

	commits []commitRun    // commit of each run of evs: latency histogram
	fails   []routeFailure // events the router refused, in order
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
