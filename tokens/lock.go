package tokens

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/kiln-lm/kiln/internal/pidlock"
)

// storeLock is an exclusive flock on <store>/lock. The kernel drops it when
// the holder dies, even by SIGKILL, so a crashed appender never leaves a
// store locked; the pid written into the file only names the holder in the
// error a second appender gets.
//
// A flock belongs to the open file, which a child this process forks
// shares until its exec closes it: a lock released while another
// goroutine starts a process (a task's process, a test's server) is held
// a moment longer by that child. So a process knows its own appenders'
// locks (held), and where the flock is busy, the file names this process
// and none of its appenders holds the store, it waits for the flock: the
// child's exec lets it go.
type storeLock struct {
	f    *os.File
	path string
}

var held = struct {
	sync.Mutex
	paths map[string]bool
}{paths: map[string]bool{}}

// LockWait says whether and how OpenAppenderWaiting waits for a store that
// another process holds: another worker's append holds it while it
// commits, a direct ingest for its whole run.
type LockWait struct {
	// For is how long to wait for the other process to let the store go;
	// the *LockedError after it has its Waited set. 0: not at all.
	For time.Duration
	// Waiting, when set, hears the holder's pid (0: not read) as the wait
	// begins, and again when another process holds the store.
	Waiting func(pid int)
}

// lockPoll is how often a wait tries the store's flock again: a flock
// that blocks cannot be given up on when the wait's context ends. A
// commit takes milliseconds and more (an fsync), so the store is taken
// within a commit or so of its release.
const lockPoll = 10 * time.Millisecond

func lockStore(ctx context.Context, dir string, wait LockWait) (*storeLock, error) {
	path, err := filepath.Abs(filepath.Join(dir, lockFile))
	if err != nil {
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	held.Lock()
	if held.paths[path] {
		held.Unlock()
		return nil, &LockedError{Dir: dir, PID: os.Getpid()}
	}
	held.paths[path] = true
	held.Unlock()
	l, err := flockStore(ctx, dir, path, wait)
	if err != nil {
		held.Lock()
		delete(held.paths, path)
		held.Unlock()
	}
	return l, err
}

func flockStore(ctx context.Context, dir, path string, wait LockWait) (*storeLock, error) {
	var giveUp, poll *time.Timer
	said := -1 // the holder Waiting heard of last
	for {
		// Held by this process's pid: a child of it between its fork and
		// exec, which lets it go at its exec.
		f, err := pidlock.Lock(path, true)
		var busy *pidlock.BusyError
		switch {
		case err == nil:
			return &storeLock{f: f, path: path}, nil
		case !errors.As(err, &busy):
			return nil, fmt.Errorf("lock token store %s: %w", dir, err)
		case wait.For <= 0:
			return nil, &LockedError{Dir: dir, PID: busy.PID}
		}
		if giveUp == nil {
			giveUp, poll = time.NewTimer(wait.For), time.NewTimer(lockPoll)
			defer giveUp.Stop()
			defer poll.Stop()
		} else {
			poll.Reset(lockPoll)
		}
		if busy.PID != said && wait.Waiting != nil {
			wait.Waiting(busy.PID)
		}
		said = busy.PID
		select {
		case <-poll.C:
		case <-giveUp.C:
			return nil, &LockedError{Dir: dir, PID: busy.PID, Waited: wait.For}
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for token store %s, locked by %s: %w", dir, LockHolder(busy.PID), ctx.Err())
		}
	}
}

func (l *storeLock) release() error {
	// Closing the descriptor releases the flock; the file stays so that a
	// waiting appender never races a re-creation.
	err := l.f.Close()
	held.Lock()
	delete(held.paths, l.path)
	held.Unlock()
	return err
}

// LockedError is returned when another appender holds the store.
type LockedError struct {
	Dir string
	PID int // 0 when the holder could not be read
	// Waited is how long OpenAppenderWaiting waited for the holder to let
	// the store go (LockWait.For); 0: it did not wait.
	Waited time.Duration
}

func (e *LockedError) Error() string {
	if e.Waited > 0 {
		return fmt.Sprintf("token store %s is still locked by %s after this append waited %v for it: only one process appends to a store at a time, and a direct ingest ('sched ingest --direct') holds its store until it ends",
			e.Dir, LockHolder(e.PID), e.Waited)
	}
	return fmt.Sprintf("token store %s is locked by %s: only one appender may write a store; wait for it to finish or stop it", e.Dir, LockHolder(e.PID))
}

// LockHolder names the process of pid, which a store's lock file named
// (0: none, or not read).
func LockHolder(pid int) string {
	if pid > 0 {
		return "pid " + strconv.Itoa(pid)
	}
	return "another process"
}
