package main

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strconv"
	"sync"
)

// startProfiles starts the profiles that RELAY_CPUPROFILE, RELAY_MEMPROFILE,
// RELAY_TRACE and RELAY_STAGES (the pipeline's stage times, which it
// returns for relay.Config.StageTrace) ask for (file paths; "%p" in a path becomes the process
// id, so that the several relays of one benchmark do not overwrite each
// other's files) and returns what writes and closes them at exit. They are
// for developers profiling the real binary on a backlog (make bench passes
// the environment through); undocumented for operators, off when unset, and
// a profile that cannot be started is logged, never fatal.
func startProfiles(log *slog.Logger) (stages io.Writer, stop func()) {
	var stops []func()
	path := func(env string) string {
		p := os.Getenv(env)
		if p == "" {
			return ""
		}
		out := make([]byte, 0, len(p)+8)
		for i := 0; i < len(p); i++ {
			if p[i] == '%' && i+1 < len(p) && p[i+1] == 'p' {
				out = strconv.AppendInt(out, int64(os.Getpid()), 10)
				i++
				continue
			}
			out = append(out, p[i])
		}
		return string(out)
	}
	create := func(env string) *os.File {
		p := path(env)
		if p == "" {
			return nil
		}
		f, err := os.Create(p)
		if err != nil {
			log.Warn("profile not written", "env", env, "err", err)
			return nil
		}
		log.Info("writing a profile", "env", env, "path", p)
		return f
	}
	// start starts a profile that runs until stop, into env's file.
	start := func(env string, begin func(io.Writer) error, stop func()) {
		f := create(env)
		if f == nil {
			return
		}
		if err := begin(f); err != nil {
			log.Warn("profile not written", "env", env, "err", err)
			f.Close()
			return
		}
		stops = append(stops, func() { stop(); f.Close() })
	}
	if f := create("RELAY_STAGES"); f != nil {
		// The pipeline's stage times, a line per delivered chunk
		// (internal/relay/stages.go), buffered: a write per chunk would
		// cost the pipeline a system call each.
		w := bufio.NewWriterSize(f, 64<<10)
		stages = &lockedWriter{w: w}
		stops = append(stops, func() {
			stages.(*lockedWriter).flush()
			f.Close()
		})
	}
	start("RELAY_CPUPROFILE", pprof.StartCPUProfile, pprof.StopCPUProfile)
	start("RELAY_TRACE", trace.Start, trace.Stop)
	if f := create("RELAY_MEMPROFILE"); f != nil {
		// The allocation profile at exit: every allocation since start
		// (alloc_space, alloc_objects) and what was live at the last GC.
		stops = append(stops, func() {
			if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
				log.Warn("profile not written", "env", "RELAY_MEMPROFILE", "err", fmt.Errorf("write: %w", err))
			}
			f.Close()
		})
	}
	return stages, func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
}

// lockedWriter is a buffered writer that the stage trace's writes and its
// flush at exit share.
type lockedWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (l *lockedWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	_ = l.w.Flush()
}
