package metrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadyTimeout bounds one call of the ready func behind /readyz, shorter than
// the usual probe timeouts so that a hung check answers 503 instead of
// timing the probe out.
const ReadyTimeout = 3 * time.Second

// Handler serves:
//
//	/metrics  the registry in the Prometheus exposition format
//	/healthz  200 "ok" while the process serves HTTP (liveness)
//	/readyz   200 "ready" when ready returns nil (followed by the role,
//	          "leader" or "standby: …", once SetRole was called), else 503
//	          with the error in the body (readiness); a nil ready is always
//	          ready
func (m *Metrics) Handler(ready func(ctx context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), ReadyTimeout)
			defer cancel()
			if err := ready(ctx); err != nil {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		if role := m.role.Load(); role != nil {
			// Which role is ready: a standby is ready to take over, which
			// is not the same as delivering.
			fmt.Fprintf(w, "ready: %s\n", (*role)())
			return
		}
		io.WriteString(w, "ready\n")
	})
	return mux
}

// Serve serves Handler(ready) on addr (host:port) until ctx is done, then shuts
// down, giving requests in progress up to 5 s, and returns nil. An empty addr
// disables the server: Serve returns nil at once. It returns an error when it
// cannot listen or the server fails.
func (m *Metrics) Serve(ctx context.Context, addr string, ready func(ctx context.Context) error) error {
	if addr == "" {
		return nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics listen: %w", err)
	}
	return m.serve(ctx, ln, ready)
}

func (m *Metrics) serve(ctx context.Context, ln net.Listener, ready func(ctx context.Context) error) error {
	srv := &http.Server{
		Handler:           m.Handler(ready),
		ReadHeaderTimeout: 5 * time.Second,
		// Its messages are about malformed requests from scrapers, not
		// about the relay; the default would write to the global logger.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("metrics serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if err != nil {
		return fmt.Errorf("metrics shutdown: %w", err)
	}
	return nil
}

// SetRole makes /readyz say which role is ready (role is called per request).
func (m *Metrics) SetRole(role func() string) {
	if m != nil {
		m.role.Store(&role)
	}
}
