package exitcode_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/outbox-relay/outbox-relay/internal/exitcode"
)

type coded struct{ code int }

func (c coded) Error() string { return fmt.Sprint("code ", c.code) }
func (c coded) ExitCode() int { return c.code }

func TestOf(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, exitcode.OK},
		{errors.New("plain"), exitcode.Failure},
		{coded{exitcode.Threshold}, exitcode.Threshold},
		{fmt.Errorf("wrapped: %w", coded{exitcode.Usage}), exitcode.Usage},
	}
	for _, tt := range tests {
		if got := exitcode.Of(tt.err); got != tt.want {
			t.Errorf("Of(%v) = %d; want %d", tt.err, got, tt.want)
		}
	}
}
