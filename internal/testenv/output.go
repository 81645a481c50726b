package testenv

import (
	"bytes"
	"sync"
)

// Output is a child process's output that the test reads while the process
// writes it (exec.Cmd's Stdout and Stderr): a bytes.Buffer behind a mutex.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
