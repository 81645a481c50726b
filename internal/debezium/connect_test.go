package debezium

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestGetConnectorStatus(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/connectors/ok/status":
			w.Write([]byte(`{"name":"ok","connector":{"state":"RUNNING"},"tasks":[{"id":0,"state":"RUNNING"}]}`))
		case "/connectors/bad/status":
			w.Write([]byte(`{"connector":{"state":"RUNNING"},"tasks":[{"id":0,"state":"FAILED","trace":"org.x.Boom: no slot\n\tat a.b"}]}`))
		default:
			http.Error(w, `{"error_code":404}`, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	ctx := t.Context()

	st, err := GetConnectorStatus(ctx, srv.Client(), srv.URL, "ok")
	if err != nil || !st.Running() || st.Failed(true) != nil || st.String() != "connector RUNNING, task 0 RUNNING" {
		t.Errorf("ok: %v, running %v, failed %v, %q", err, st.Running(), st.Failed(true), st)
	}
	st, err = GetConnectorStatus(ctx, srv.Client(), srv.URL, "bad")
	if err != nil || st.Running() {
		t.Fatalf("bad: %v, running %v", err, st.Running())
	}
	if got := st.Failed(false); got == nil || got.Error() != "task 0 FAILED: org.x.Boom: no slot" {
		t.Errorf("Failed(false) = %v; want the trace's first line", got)
	}
	if got := st.Failed(true); got == nil || !strings.Contains(got.Error(), "at a.b") {
		t.Errorf("Failed(true) = %v; want the whole trace", got)
	}
	if _, err := GetConnectorStatus(ctx, srv.Client(), srv.URL, "missing"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("missing connector: %v; want a 404 error", err)
	}
}
