package deploy

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// corruptProxy forwards TCP connections to a Postgres server and, once armed,
// alters one byte of the next pgoutput Insert it forwards to a client: its
// message type 'I' becomes 'Z', a type pgoutput does not define, as a faulty
// network device or a server bug would deliver it. Plain TCP only (the DSN's
// sslmode=disable): it reads what the server sends as the protocol frames it
// (type byte, int32 length including itself), and alters only XLogData
// ('w') inside CopyData ('d'), which only a replication connection carries.
type corruptProxy struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	altered atomic.Int32
}

func startCorruptProxy(t *testing.T, target string) *corruptProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &corruptProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns = append(conns, c)
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				client.Close()
				continue
			}
			track(client)
			track(server)
			wg.Go(func() {
				io.Copy(server, client)
				server.Close()
				client.Close()
			})
			wg.Go(func() {
				p.forwardServer(client, server)
				server.Close()
				client.Close()
			})
		}
	})
	return p
}

// xlogDataHeader is the length of XLogData's header before the pgoutput
// message: 'w', WAL start, WAL end, send time.
const xlogDataHeader = 1 + 8 + 8 + 8

func (p *corruptProxy) forwardServer(client, server net.Conn) {
	r := bufio.NewReaderSize(server, 64<<10)
	head := make([]byte, 5)
	for {
		if _, err := io.ReadFull(r, head); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(head[1:])) - 4
		if n < 0 {
			return
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if head[0] == 'd' && n > xlogDataHeader && body[0] == 'w' && body[xlogDataHeader] == 'I' && p.armed.CompareAndSwap(true, false) {
			body[xlogDataHeader] = 'Z'
			p.altered.Add(1)
		}
		if _, err := client.Write(append(head, body...)); err != nil {
			return
		}
	}
}

// dsnVia is dsn (a URL) with its host:port replaced by addr.
func dsnVia(t *testing.T, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" || !strings.Contains(u.RawQuery, "sslmode=disable") {
		t.Fatalf("the test needs a URL DSN with sslmode=disable to alter its messages on the way, not %q (%v)", u.Redacted(), err)
	}
	u.Host = addr
	return u.String()
}

// TestAlertsDecodeErrors: a pgoutput message altered between Postgres and the
// relay (a TCP proxy changes one Insert's type byte to one pgoutput does not
// define) makes the relay stop before that transaction with a decode error,
// confirming nothing of it; OutboxRelayDecodeErrors fires. The relay stays up
// not ready for health.stop_linger (it would exit at once otherwise, before
// Prometheus scraped decode_errors_total 1: the rule could never fire).
func TestAlertsDecodeErrors(t *testing.T) {
	t.Parallel()
	rules, names := rulesCopy(t)
	s := newAlertSlot(t)
	u, err := url.Parse(s.pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startCorruptProxy(t, u.Host)
	r := s.newAlertRelay(t, "r", "RELAY_POSTGRES_DSN="+dsnVia(t, s.pg.DSN, proxy.ln.Addr().String()))
	p := startPrometheus(t, rules, len(names), r.addr)
	r.start(t)
	r.waitMetric(t, "outbox_relay_active", "1")
	s.insert(t, "order", 3, 10)
	p.waitSeen(t, `outbox_relay_decode_errors_total`, "0")
	proxy.armed.Store(true)
	s.insert(t, "order", 3, 10)
	altered := time.Now()
	p.waitFiring(t, "OutboxRelayDecodeErrors", r.addr, altered, 2*time.Second)
	if n := proxy.altered.Load(); n != 1 {
		t.Errorf("the proxy altered %d messages; want 1", n)
	}
	code, body, err := httpGet("http://" + r.addr + "/readyz")
	if err != nil || code != 503 || !strings.Contains(body, "unknown type") {
		t.Errorf("/readyz after the decode error = %d %q, %v; want 503 naming it", code, body, err)
	}
}
