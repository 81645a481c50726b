package faults

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"
)

// echoServer answers each line with the same line.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					c.Write([]byte(line))
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip dials addr and sends one line; it reports whether the echo came back.
func roundTrip(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "ping\n"
}

func TestProxyCutRestore(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx) }()

	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
		if err != nil {
			t.Fatalf("dial %s: %v", p.Addr(), err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	open := dial()
	if !roundTrip(t, open) {
		t.Fatalf("round trip through the proxy failed before Cut")
	}
	p.Cut()
	if roundTrip(t, open) {
		t.Errorf("round trip on a connection opened before Cut succeeded; want it closed")
	}
	if roundTrip(t, dial()) {
		t.Errorf("round trip on a connection opened during Cut succeeded; want it refused")
	}
	p.Restore()
	if !roundTrip(t, dial()) {
		t.Errorf("round trip after Restore failed; want it forwarded")
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after cancel = %v; want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Serve did not return within 10s of cancel")
	}
}

// Hold drops nothing and closes nothing: bytes wait, and arrive after Release.
func TestProxyHoldRelease(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go p.Serve(ctx)
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !roundTrip(t, c) {
		t.Fatalf("round trip before Hold failed")
	}
	p.Hold()
	c.SetDeadline(time.Now().Add(500 * time.Millisecond))
	c.Write([]byte("held\n"))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err == nil {
		t.Fatalf("read %q while held; want nothing to come through", line)
	}
	p.Release()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	if line, err := r.ReadString('\n'); err != nil || line != "held\n" {
		t.Errorf("after Release read %q, %v; want the held line, on the same connection", line, err)
	}
}
