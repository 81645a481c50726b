package faults

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A Proxy forwards TCP connections from a loopback listener to one target address and
// can cut them, as a failed network between a client and its server would: Cut closes
// every forwarded connection and makes new ones close as soon as they are accepted,
// until Restore. Cut and Restore are safe for concurrent use with Serve and each other.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cut      bool // also set for good when Serve returns
	conns    map[net.Conn]struct{}
	released chan struct{} // nil: forwarding; else closed by Release
	drops    int           // Kafka produce replies still to drop (replies.go)
}

// Listen binds addr (use "127.0.0.1:0" for a free port) for a proxy to target. It
// starts nothing: connections are forwarded while Serve runs.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("proxy listen %s: %w", addr, err)
	}
	return &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the address clients dial instead of the target, as host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Serve forwards connections until ctx is cancelled, then closes the listener and every
// connection and returns nil once all of its goroutines have ended. It returns an error
// only when accepting fails for another reason.
func (p *Proxy) Serve(ctx context.Context) error {
	var wg sync.WaitGroup
	stop := context.AfterFunc(ctx, func() { p.ln.Close() })
	defer stop()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			p.cut = true
			p.closeAllLocked()
			p.mu.Unlock()
			wg.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("proxy accept: %w", err)
		}
		wg.Go(func() { p.forward(ctx, c) })
	}
}

// Cut closes every forwarded connection and refuses new ones (accepted, then closed at
// once, so the client sees a reset rather than a hang) until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.closeAllLocked()
}

// Restore forwards new connections again after Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

// Hold stops forwarding bytes on every connection without closing any, and
// leaves new connections unanswered, until Release: a partition in which
// packets are dropped, which neither end notices before its own timeouts
// (for a walsender, wal_sender_timeout). Bytes read meanwhile are forwarded
// after Release.
func (p *Proxy) Hold() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released == nil {
		p.released = make(chan struct{})
	}
}

// Release forwards again after Hold.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released != nil {
		close(p.released)
		p.released = nil
	}
}

// waitReleased blocks while the proxy is held.
func (p *Proxy) waitReleased() {
	p.mu.Lock()
	c := p.released
	p.mu.Unlock()
	if c != nil {
		<-c
	}
}

func (p *Proxy) closeAllLocked() {
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// track registers c so that Cut closes it; it reports false, closing c, while cut.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) forward(ctx context.Context, client net.Conn) {
	if !p.track(client) {
		return
	}
	p.waitReleased()
	d := net.Dialer{Timeout: 5 * time.Second}
	server, err := d.DialContext(ctx, "tcp", p.target)
	if err != nil {
		p.untrack(client)
		return
	}
	if !p.track(server) {
		p.untrack(client)
		return
	}
	// Either side ending ends both: half-open connections would only hide a cut.
	done := make(chan struct{}, 2)
	pipe := func(dst io.Writer, src net.Conn) {
		// A cut and a peer's close end the connection alike: the error says nothing more.
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.waitReleased()
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	// Requests are watched for Kafka produce requests (replies.go).
	var kw kafkaWatch
	go pipe(&requestWatcher{Conn: server, w: &kw}, client)
	go pipe(&replyDropper{Conn: client, p: p, w: &kw}, server)
	<-done
	p.untrack(client, server)
	<-done
}
