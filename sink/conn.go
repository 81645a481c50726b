package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"
)

// This file is the produce path's connection to a broker. kafka-go's
// Transport serves one request per connection at a time and opens another
// connection for each concurrent request, so two produce requests for one
// partition in flight at once could reach the broker in either order, and a
// round of N partitions cost N connections and N requests. A brokerConn
// pipelines instead, as the Java producer does: requests are written in the
// order they are sent, at most MaxInFlight at a time, and the broker handles
// a connection's requests one after the other and answers them in that order.
// That is what lets a partition's batches be in flight together and still be
// appended in sequence order (pipeline.go).
//
// A connection that fails (a write or read error, a request that is not
// answered within WriteTimeout) is closed, and every request still in flight
// on it fails with that error: their outcome is unknown. The next request to
// the broker dials again.

// errConnClosed fails the requests in flight when the sink closes.
var errConnClosed = errors.New("kafka connection closed")

// A call is one request on a brokerConn and, once done is closed, its answer.
type call struct {
	key      protocol.ApiKey
	version  int16
	corr     int32
	deadline time.Time
	res      protocol.Message
	err      error
	written  bool // the request reached the connection: its outcome may be unknown on error
	done     chan struct{}
	onDone   func()                // called once done is closed, from the connection's reader
	observe  func(unanswered bool) // set once written, with an Observer
}

func (c *call) finish(res protocol.Message, err error) {
	c.res, c.err = res, err
	if c.observe != nil {
		c.observe(err != nil)
	}
	close(c.done)
	if c.onDone != nil {
		c.onDone()
	}
}

// A brokerConn is one pipelined connection to one broker.
type brokerConn struct {
	addr     string
	clientID string
	pc       *protocol.Conn
	versions map[protocol.ApiKey]int16
	timeout  time.Duration
	obs      Observer // nil: none

	slots chan struct{} // one per request in flight, MaxInFlight at most
	queue chan *call    // written, not yet answered, in order (to the reader)
	dead  chan struct{} // closed when the connection failed or closed
	read  sync.WaitGroup

	mu   sync.Mutex // serialises writes; guards corr and err
	corr int32
	err  error
}

// dialBroker opens a connection to addr with the sink's TLS and SASL, and
// negotiates API versions, within WriteTimeout.
func (k *Kafka) dialBroker(ctx context.Context, addr string) (*brokerConn, error) {
	ctx, cancel := context.WithTimeout(ctx, k.cfg.WriteTimeout)
	defer cancel()
	dial := k.cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc := k.tls; tc != nil {
		if tc.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			tc = tc.Clone()
			tc.ServerName = host
		}
		nc = tls.Client(nc, tc)
	}
	pc := protocol.NewConn(nc, k.cfg.ClientID)
	deadline, _ := ctx.Deadline()
	pc.SetDeadline(deadline)
	bc, err := handshake(ctx, pc, addr, k.mech)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("connect to kafka broker %s: %w", addr, err)
	}
	pc.SetDeadline(time.Time{})
	bc.timeout, bc.clientID, bc.obs = k.cfg.WriteTimeout, k.cfg.ClientID, k.obs
	bc.slots = make(chan struct{}, k.cfg.MaxInFlight)
	bc.queue = make(chan *call, k.cfg.MaxInFlight)
	bc.dead = make(chan struct{})
	bc.read.Add(1)
	go bc.readLoop()
	return bc, nil
}

// handshake negotiates API versions and authenticates, as kafka-go's
// Transport does on each of its connections.
func handshake(ctx context.Context, pc *protocol.Conn, addr string, mech sasl.Mechanism) (*brokerConn, error) {
	r, err := pc.RoundTrip(new(apiversions.Request))
	if err != nil {
		return nil, err
	}
	res := r.(*apiversions.Response)
	if res.ErrorCode != 0 {
		return nil, fmt.Errorf("negotiate API versions: %w", kafka.Error(res.ErrorCode))
	}
	versions := make(map[protocol.ApiKey]int16, len(res.ApiKeys))
	for _, a := range res.ApiKeys {
		key := protocol.ApiKey(a.ApiKey)
		versions[key] = key.SelectVersion(a.MinVersion, a.MaxVersion)
	}
	pc.SetVersions(versions)
	if mech != nil {
		host, port, _ := net.SplitHostPort(addr)
		var p int
		fmt.Sscan(port, &p)
		if err := authenticate(sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: p}), pc, mech); err != nil {
			return nil, err
		}
	}
	return &brokerConn{addr: addr, pc: pc, versions: versions}, nil
}

// authenticate runs a SASL exchange (SaslHandshake, then SaslAuthenticate
// until the mechanism is done), kafka-go's authenticateSASL.
func authenticate(ctx context.Context, pc *protocol.Conn, mech sasl.Mechanism) error {
	m, err := pc.RoundTrip(&saslhandshake.Request{Mechanism: mech.Name()})
	if err != nil {
		return err
	}
	if code := m.(*saslhandshake.Response).ErrorCode; code != 0 {
		return kafka.Error(code)
	}
	sess, state, err := mech.Start(ctx)
	if err != nil {
		return err
	}
	for done := false; !done; {
		m, err := pc.RoundTrip(&saslauthenticate.Request{AuthBytes: state})
		if err != nil {
			if errors.Is(err, io.EOF) {
				// A broker may end a failed exchange by closing the connection.
				return kafka.SASLAuthenticationFailed
			}
			return err
		}
		res := m.(*saslauthenticate.Response)
		if res.ErrorCode != 0 {
			return kafkaError(res.ErrorCode, res.ErrorMessage)
		}
		if done, state, err = sess.Next(ctx, res.AuthBytes); err != nil {
			return err
		}
	}
	return nil
}

// kafkaError is kafka-go's makeError: the code as a kafka.Error, with the
// broker's message when it sent one.
func kafkaError(code int16, msg string) error {
	if code == 0 {
		return nil
	}
	if msg == "" {
		return kafka.Error(code)
	}
	return fmt.Errorf("%w: %s", kafka.Error(code), msg)
}

// send writes req and returns its call at once, or after waiting for a free
// slot (MaxInFlight requests already in flight) or ctx. onDone, when not nil,
// runs once the call is done. A connection that failed fails the call.
func (c *brokerConn) send(ctx context.Context, req protocol.Message, onDone func()) *call {
	cl := &call{key: req.ApiKey(), version: c.versions[req.ApiKey()], done: make(chan struct{}), onDone: onDone}
	select {
	case c.slots <- struct{}{}:
	case <-c.dead:
		cl.finish(nil, c.failure())
		return cl
	case <-ctx.Done():
		cl.finish(nil, ctx.Err())
		return cl
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		<-c.slots
		cl.finish(nil, err)
		return cl
	}
	c.corr++
	cl.corr = c.corr
	cl.deadline = time.Now().Add(c.timeout)
	if p, ok := req.(protocol.PreparedMessage); ok {
		p.Prepare(cl.version)
	}
	c.pc.SetWriteDeadline(cl.deadline)
	cl.written = true
	err := protocol.WriteRequest(c.pc, cl.version, cl.corr, c.clientID, req)
	if err != nil {
		c.failLocked(fmt.Errorf("write to kafka broker %s: %w", c.addr, err))
		c.mu.Unlock()
		<-c.slots
		cl.finish(nil, c.failure())
		return cl
	}
	if c.obs != nil {
		c.observeCall(cl)
	}
	c.queue <- cl // never blocks: a slot is held
	c.mu.Unlock()
	return cl
}

// observeCall tells the Observer of a call written: in flight until its
// answer, or its failure, and how long that took.
func (c *brokerConn) observeCall(cl *call) {
	obs, addr, at := c.obs, c.addr, time.Now()
	obs.ProduceInFlight(addr, 1)
	cl.observe = func(unanswered bool) {
		obs.ProduceInFlight(addr, -1)
		obs.ProduceAnswered(addr, time.Since(at), unanswered)
	}
}

// readLoop reads the answers in the order the requests were written.
func (c *brokerConn) readLoop() {
	defer c.read.Done()
	for {
		var cl *call
		select {
		case cl = <-c.queue:
		case <-c.dead:
			// Calls queued before the connection failed are failed too.
			for {
				select {
				case cl := <-c.queue:
					<-c.slots
					cl.finish(nil, c.failure())
				default:
					return
				}
			}
		}
		c.pc.SetReadDeadline(cl.deadline)
		corr, res, err := protocol.ReadResponse(c.pc, cl.key, cl.version)
		if err == nil && corr != cl.corr {
			err = fmt.Errorf("correlation id %d, want %d", corr, cl.corr)
		}
		if err != nil {
			c.mu.Lock()
			c.failLocked(fmt.Errorf("read from kafka broker %s: %w", c.addr, err))
			c.mu.Unlock()
			<-c.slots
			cl.finish(nil, c.failure())
			continue
		}
		// The slot first: the sender woken by the answer may send at once.
		<-c.slots
		cl.finish(res, nil)
	}
}

func (c *brokerConn) failLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	close(c.dead)
	c.pc.Close()
}

func (c *brokerConn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// broken reports whether the connection failed (a new one is needed).
func (c *brokerConn) broken() bool {
	select {
	case <-c.dead:
		return true
	default:
		return false
	}
}

// close waits for the requests in flight (each within WriteTimeout), then
// closes the connection.
func (c *brokerConn) close() {
	for i := 0; i < cap(c.slots); i++ {
		select {
		case c.slots <- struct{}{}:
		case <-c.dead:
		}
	}
	c.mu.Lock()
	c.failLocked(errConnClosed)
	c.mu.Unlock()
	c.read.Wait()
}
