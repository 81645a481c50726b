package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

// TestHealthCmd: health, docker-compose.yml's relay healthcheck, exits 0
// only on a 200 and prints the answer (a not-ready relay's reason).
func TestHealthCmd(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("not ready: kafka: no broker answers\n"))
		default:
			w.Write([]byte("ok\n"))
		}
	}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/readyz"
	ln.Close()
	for _, tc := range []struct {
		args []string
		want int
		out  string
	}{
		{[]string{"health", "--url", srv.URL + "/healthz"}, exitcode.OK, "200 OK ok"},
		{[]string{"health", "--url", srv.URL + "/readyz"}, exitcode.Failure, "503 Service Unavailable not ready: kafka: no broker answers"},
		{[]string{"health", "--url", closed}, exitcode.Failure, "is the relay running"},
		{[]string{"health", "--url", "127.0.0.1:9187"}, exitcode.Usage, "--url"},
	} {
		code, out, errOut := run(t, tc.args...)
		if code != tc.want || !strings.Contains(out+errOut, tc.out) {
			t.Errorf("outbox-relay %s = exit %d, %q; want exit %d and %q", strings.Join(tc.args, " "), code, out+errOut, tc.want, tc.out)
		}
	}
}
