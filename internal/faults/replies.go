package faults

import (
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
)

// DropReplies makes the proxy lose the next n replies a Kafka broker sends on
// connections that carry produce requests: the reply is read from the broker
// and discarded, and the connection is closed, as when the network fails
// after the broker appended a batch and before its acknowledgement arrived.
// The producer sees a lost connection and cannot tell whether its batch was
// written. Safe for concurrent use.
func (p *Proxy) DropReplies(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.drops = n
}

// Dropped is how many replies DropReplies has yet to drop.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drops
}

func (p *Proxy) takeDrop() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drops == 0 {
		return false
	}
	p.drops--
	return true
}

// kafkaWatch follows a connection's Kafka request frames (int32 size, then
// int16 API key, …) and notes whether one was a Produce request (API key 0).
type kafkaWatch struct {
	produced atomic.Bool
	head     []byte // the current frame's first bytes, up to size and API key
	left     int    // bytes of the current frame still to come after head
}

func (w *kafkaWatch) observe(b []byte) {
	for len(b) > 0 {
		if w.left > 0 {
			n := min(w.left, len(b))
			w.left -= n
			b = b[n:]
			continue
		}
		n := min(6-len(w.head), len(b))
		w.head = append(w.head, b[:n]...)
		b = b[n:]
		if len(w.head) < 6 {
			return
		}
		size := int(binary.BigEndian.Uint32(w.head))
		if binary.BigEndian.Uint16(w.head[4:]) == 0 {
			w.produced.Store(true)
		}
		w.left = size - 2
		w.head = w.head[:0]
	}
}

// requestWatcher forwards requests to the broker, watching them.
type requestWatcher struct {
	net.Conn
	w *kafkaWatch
}

func (r *requestWatcher) Write(b []byte) (int, error) {
	r.w.observe(b)
	return r.Conn.Write(b)
}

// replyDropper forwards replies to the client, unless one is to be dropped.
type replyDropper struct {
	net.Conn
	p *Proxy
	w *kafkaWatch
}

var errReplyDropped = errors.New("reply dropped")

func (r *replyDropper) Write(b []byte) (int, error) {
	if r.w.produced.Load() && r.p.takeDrop() {
		// The pipe ends both connections on a write error.
		return 0, errReplyDropped
	}
	return r.Conn.Write(b)
}
