package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proc is a child process (the relay or pg_recvlogical) whose resource usage
// is measured. It runs in its own process group so that a Ctrl-C reaches only
// the bench, which then stops it with SIGTERM in order.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	started time.Time
	done    chan struct{} // closed when the process has exited
	ended   time.Time     // set before done is closed
	waitErr error
}

// usage is what a finished child cost.
type usage struct {
	Wall      time.Duration
	CPU       time.Duration // user + sys
	MaxRSS    int64         // bytes, from rusage (includes shutdown)
	ExitError string
}

func startProc(name string, args, env []string, logPath string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log: %w", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Stdout = logf
	cmd.Stderr = logf
	// Pdeathsig: should the bench itself die (SIGKILL, a runtime fatal error),
	// the child is told to stop instead of holding its slot forever.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	p := &proc{cmd: cmd, logPath: logPath, done: make(chan struct{})}
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		p.ended = time.Now()
		logf.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// peakRSS returns VmHWM of the running process in bytes: the kernel's own
// high-water mark, so one read before stopping covers the whole run.
func (p *proc) peakRSS() (int64, error) { return pidStatus(p.cmd.Process.Pid, "VmHWM:") }

// rss returns VmRSS of the running process in bytes: what it holds now, for
// the soak's per-minute samples (VmHWM only ever grows).
func (p *proc) rss() (int64, error) { return pidStatus(p.cmd.Process.Pid, "VmRSS:") }

// cpu returns the CPU time (user + system) the running process has used so
// far: a reading inside a phase, where rusage only gives the total after exit.
func (p *proc) cpu() (time.Duration, error) { return pidCPU(p.cmd.Process.Pid) }

// pidStatus reads the "<key>  1234 kB" line of /proc/PID/status in bytes.
func pidStatus(pid int, key string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("read status: %w", err)
	}
	defer f.Close()
	return parseStatusKB(f, key)
}

// pidCPU reads the CPU time of a running process from /proc/PID/stat.
func pidCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read stat: %w", err)
	}
	return parseStatCPU(string(b))
}

// parseVmHWM reads the "VmHWM:  1234 kB" line of /proc/PID/status.
func parseVmHWM(f io.Reader) (int64, error) { return parseStatusKB(f, "VmHWM:") }

// parseStatusKB reads the "<key>  1234 kB" line of /proc/PID/status in bytes.
func parseStatusKB(f io.Reader, key string) (int64, error) {
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parse %s %q: %w", key, rest, err)
			}
			return kb * 1024, nil
		}
	}
	return 0, fmt.Errorf("no %s in status", strings.TrimSuffix(key, ":"))
}

// wait blocks until the process exits on its own, ctx is done or timeout.
func (p *proc) wait(ctx context.Context, timeout time.Duration) (usage, error) {
	select {
	case <-p.done:
		return p.usage(), nil
	case <-ctx.Done():
		return usage{}, ctx.Err()
	case <-time.After(timeout):
		return usage{}, fmt.Errorf("still running after %s", timeout)
	}
}

// stop sends SIGTERM and waits for a clean exit, then SIGKILLs after grace.
// It is safe to call after the process has exited.
func (p *proc) stop(grace time.Duration) usage {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	return p.usage()
}

func (p *proc) usage() usage {
	u := usage{Wall: p.ended.Sub(p.started)}
	if st := p.cmd.ProcessState; st != nil {
		u.CPU = st.UserTime() + st.SystemTime()
		if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
			u.MaxRSS = ru.Maxrss * 1024 // kB on Linux
		}
		if !st.Success() {
			u.ExitError = st.String()
		}
	}
	return u
}

// logTail returns the last lines of the process's log, for error messages.
func (p *proc) logTail(n int) string { return fileTail(p.logPath, n) }

// exitErr is how the process ended when that was not a clean exit, else "".
func (p *proc) exitErr() string { return p.usage().ExitError }

// fileTail returns the last n lines of a log file, "" when it cannot be read.
func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's CPU times: 100 on every
// Linux architecture the bench runs on (sysconf would need cgo).
const clockTicks = 100

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/PID/stat
// line. The command name (field 2) may hold spaces and parentheses, so fields
// are counted from its closing parenthesis.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state), so utime (14) is f[11] and stime (15) f[12].
	if len(f) < 13 {
		return 0, fmt.Errorf("stat: %d fields after the name; want at least 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat: parse %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
