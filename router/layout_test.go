package router_test

import (
	"slices"
	"testing"

	"github.com/outbox-relay/outbox-relay/router"
	"github.com/outbox-relay/outbox-relay/sql"
)

// TestLayoutHeaders: a layout's headers (sql.Layout.Headers, the one
// definition of each layout) are the router's, and the relay layout's are
// the router's default.
func TestLayoutHeaders(t *testing.T) {
	for _, l := range sql.Layouts {
		if _, err := router.NewHeaderSet(l.Headers()); err != nil {
			t.Errorf("NewHeaderSet(%s layout's %q) = %v; want nil", l, l.Headers(), err)
		}
	}
	if got := sql.LayoutRelay.Headers(); !slices.Equal(got, router.DefaultHeaders) {
		t.Errorf("LayoutRelay.Headers() = %q; want router.DefaultHeaders %q", got, router.DefaultHeaders)
	}
}
