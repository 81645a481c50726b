package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	relayOnce sync.Once
	relayPath string
	relayErr  error
	relayOut  []byte
)

// RelayBinary builds cmd/outbox-relay once per test binary and returns its
// path, for tests that must run the relay as a process (SIGKILL, SIGTERM
// handling, configuration by environment). It is built without -race: it is
// the system under test, not the test, and must keep up on two cores.
func RelayBinary(t testing.TB) string {
	t.Helper()
	relayOnce.Do(func() {
		root := repoRoot()
		if root == "" {
			relayErr = os.ErrNotExist
			return
		}
		dir, err := os.MkdirTemp("", "outbox-relay-test-bin")
		if err != nil {
			relayErr = err
			return
		}
		relayPath = filepath.Join(dir, "outbox-relay")
		cmd := exec.Command("go", "build", "-o", relayPath, "./cmd/outbox-relay")
		cmd.Dir = root
		relayOut, relayErr = cmd.CombinedOutput()
	})
	if relayErr != nil {
		t.Fatalf("build outbox-relay: %v\n%s", relayErr, relayOut)
	}
	return relayPath
}
