package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// faultLock keeps fault tests (which stop servers) apart from every other test that
// uses the servers, in this process and in the other test binaries of `go test ./...`.
//
// Across processes it is an flock(2) on two files: lock (shared by users, exclusive by
// a fault test) and intent, which a fault test holds exclusive while it waits so that
// new users queue behind it instead of starving it. Within the process the flock is
// taken once for all users (flock is per open file), and a condition variable orders
// users and fault tests. Holds are named by test name so that a test, and its subtests,
// may take the shared lock again without waiting (no self-deadlock behind a waiting
// fault test), and a fault test may use the servers it has stopped and restarted.
type faultLock struct {
	path string // lock file; intent is path + ".intent"

	mu            sync.Mutex
	cond          *sync.Cond
	lockFile      *os.File
	intentFile    *os.File
	readers       int            // shared holds in this process
	holders       map[string]int // shared holds by test name
	writer        string         // test holding the exclusive lock, "" if none
	writerWaiting int
	readersQueued int // shared calls waiting behind a fault test (TestFaultLock waits for it)
}

func newFaultLock(path string) *faultLock {
	l := &faultLock{path: path, holders: map[string]int{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// within reports whether test name is test holder or one of its subtests.
func within(name, holder string) bool {
	return name == holder || strings.HasPrefix(name, holder+"/")
}

func (l *faultLock) open() error {
	if l.lockFile != nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(l.path), 0o755); err != nil {
		return fmt.Errorf("create lock dir: %w", err)
	}
	lf, err := os.OpenFile(l.path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return fmt.Errorf("open fault lock: %w", err)
	}
	inf, err := os.OpenFile(l.path+".intent", os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		lf.Close()
		return fmt.Errorf("open fault lock: %w", err)
	}
	l.lockFile, l.intentFile = lf, inf
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}

// shared takes a shared hold for test name and returns its release. It waits while a
// fault test runs or waits, here or in another process, unless name already holds the
// lock (or is the fault test).
func (l *faultLock) shared(name string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.writer != "" && within(name, l.writer) {
		return func() {}, nil
	}
	reentrant := false
	for h := range l.holders {
		if within(name, h) {
			reentrant = true
			break
		}
	}
	queued := false
	queue := func() {
		if !queued {
			queued = true
			l.readersQueued++
		}
	}
	defer func() { // runs before the deferred Unlock
		if queued {
			l.readersQueued--
		}
	}()
	for !reentrant {
		if l.writer != "" || l.writerWaiting > 0 {
			queue()
			l.cond.Wait()
			continue
		}
		if err := l.open(); err != nil {
			return nil, err
		}
		// A fault test of another process holds intent while it waits: queue behind
		// it, polling so that this process's holders can still release meanwhile.
		err := flock(l.intentFile, syscall.LOCK_SH|syscall.LOCK_NB)
		if err == syscall.EWOULDBLOCK {
			queue()
			l.mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			l.mu.Lock()
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", l.path, err)
		}
		if l.readers == 0 {
			err = flock(l.lockFile, syscall.LOCK_SH)
		}
		flock(l.intentFile, syscall.LOCK_UN)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", l.path, err)
		}
		break
	}
	l.readers++
	l.holders[name]++
	var once sync.Once
	return func() { once.Do(func() { l.releaseShared(name) }) }, nil
}

func (l *faultLock) releaseShared(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.readers--
	if l.holders[name]--; l.holders[name] == 0 {
		delete(l.holders, name)
	}
	if l.readers == 0 {
		flock(l.lockFile, syscall.LOCK_UN)
	}
	l.cond.Broadcast()
}

// exclusive takes the lock for fault test name once no other test holds it, here or
// in another process, and returns its release.
func (l *faultLock) exclusive(name string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for h := range l.holders {
		if within(name, h) || within(h, name) {
			return nil, fmt.Errorf("%s already uses the servers (test %s called Postgres or Kafka): call Exclusive first", name, h)
		}
	}
	if within(name, l.writer) && l.writer != "" {
		return nil, fmt.Errorf("%s: Exclusive called twice", name)
	}
	l.writerWaiting++
	for l.readers > 0 || l.writer != "" {
		l.cond.Wait()
	}
	l.writerWaiting--
	if err := l.open(); err != nil {
		l.cond.Broadcast()
		return nil, err
	}
	if err := flock(l.intentFile, syscall.LOCK_EX); err != nil {
		l.cond.Broadcast()
		return nil, fmt.Errorf("lock %s: %w", l.path, err)
	}
	if err := flock(l.lockFile, syscall.LOCK_EX); err != nil {
		flock(l.intentFile, syscall.LOCK_UN)
		l.cond.Broadcast()
		return nil, fmt.Errorf("lock %s: %w", l.path, err)
	}
	l.writer = name
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			flock(l.lockFile, syscall.LOCK_UN)
			flock(l.intentFile, syscall.LOCK_UN)
			l.writer = ""
			l.cond.Broadcast()
		})
	}, nil
}

// holdsExclusive reports whether test name is (within) the fault test holding the lock.
func (l *faultLock) holdsExclusive(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.writer != "" && within(name, l.writer)
}
