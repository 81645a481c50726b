package faults

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// exit is one end of a relay process.
type exit struct {
	run    int
	err    error  // from Wait: nil for exit status 0
	asked  string // the signal the suite sent, "" when the relay exited by itself
	tail   string // its last log lines
	uptime time.Duration
}

// signalReq asks the supervisor to signal the relay once it has run for minUptime
// and to restart it after delay.
type signalReq struct {
	sig       syscall.Signal
	minUptime time.Duration
	delay     time.Duration
	reply     chan exit
}

// supervisor runs the relay binary and restarts it whenever it ends, as systemd's
// Restart=always would, so that a relay that gives up (for instance when Postgres is
// down while it starts) comes back by itself. Signals go through it, so that it knows
// which exits were asked for.
type supervisor struct {
	bin string
	env []string
	log *os.File // every run's output, in order

	reqs chan signalReq

	mu         sync.Mutex
	runs       int
	unexpected []exit
	lastTail   string
	cur        *relayProc // the running relay, nil between runs
}

// Pid returns the running relay's process id, 0 between runs.
func (s *supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return 0
	}
	return s.cur.cmd.Process.Pid
}

func (s *supervisor) Unexpected() []exit {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]exit(nil), s.unexpected...)
}

func (s *supervisor) Runs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs
}

// Signal sends sig to the running relay once it has run for minUptime, waits for it to
// exit (SIGKILL after 90s) and returns how it ended; the supervisor starts it again
// after delay. If the relay exits by itself first, that exit is returned.
func (s *supervisor) Signal(ctx context.Context, sig syscall.Signal, minUptime, delay time.Duration) (exit, error) {
	r := signalReq{sig: sig, minUptime: minUptime, delay: delay, reply: make(chan exit, 1)}
	select {
	case s.reqs <- r:
	case <-ctx.Done():
		return exit{}, ctx.Err()
	}
	select {
	case e := <-r.reply:
		return e, nil
	case <-ctx.Done():
		return exit{}, ctx.Err()
	}
}

type relayProc struct {
	cmd     *exec.Cmd
	out     *bytes.Buffer
	done    chan error
	started time.Time
}

func (s *supervisor) start() (*relayProc, error) {
	s.mu.Lock()
	s.runs++
	run := s.runs
	s.mu.Unlock()
	cmd := exec.Command(s.bin, "run")
	cmd.Env = s.env
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start outbox-relay: %w", err)
	}
	fmt.Fprintf(s.log, "=== run %d, pid %d, %s\n", run, cmd.Process.Pid, time.Now().Format(time.StampMilli))
	p := &relayProc{cmd: cmd, out: out, done: make(chan error, 1), started: time.Now()}
	go func() { p.done <- cmd.Wait() }()
	return p, nil
}

// finish records how p ended and appends its output to the log.
func (s *supervisor) finish(p *relayProc, err error, asked string) exit {
	s.log.Write(p.out.Bytes())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cur = nil
	e := exit{run: s.runs, err: err, asked: asked, tail: tailLines(p.out.String(), 8), uptime: time.Since(p.started)}
	fmt.Fprintf(s.log, "=== run %d ended after %s: %v (asked: %q)\n", e.run, e.uptime.Round(time.Millisecond), err, asked)
	s.lastTail = tailLines(p.out.String(), 40)
	if asked == "" {
		s.unexpected = append(s.unexpected, e)
	}
	return e
}

// Run keeps a relay running until ctx ends, then kills it and returns nil. It returns
// an error only when the binary cannot be started at all.
func (s *supervisor) Run(ctx context.Context) error {
	for {
		p, err := s.start()
		if err != nil {
			return err
		}
		s.mu.Lock()
		s.cur = p
		s.mu.Unlock()
		var delay time.Duration
		select {
		case err := <-p.done:
			s.finish(p, err, "")
			delay = time.Second // systemd's RestartSec
		case r := <-s.reqs:
			r.reply <- s.signal(p, r)
			delay = r.delay
		case <-ctx.Done():
			p.cmd.Process.Kill()
			s.finish(p, <-p.done, "killed at the end")
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

func (s *supervisor) signal(p *relayProc, r signalReq) exit {
	select {
	case err := <-p.done:
		return s.finish(p, err, "")
	case <-time.After(r.minUptime - time.Since(p.started)):
	}
	p.cmd.Process.Signal(r.sig)
	var err error
	select {
	case err = <-p.done:
	case <-time.After(90 * time.Second):
		p.cmd.Process.Kill()
		err = fmt.Errorf("no exit within 90s of %s, killed: %w", r.sig, <-p.done)
	}
	return s.finish(p, err, r.sig.String())
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exitedCleanly reports whether err is exit status 0.
func exitedCleanly(err error) bool {
	var ee *exec.ExitError
	return err == nil || (errors.As(err, &ee) && ee.ExitCode() == 0)
}
