package tokens

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

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

func lockStore(dir string) (*storeLock, error) {
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
	l, err := flockStore(dir, path)
	if err != nil {
		held.Lock()
		delete(held.paths, path)
		held.Unlock()
	}
	return l, err
}

func flockStore(dir, path string) (*storeLock, error) {
	// Held by this process's pid: a child of it between its fork and
	// exec, which lets it go at its exec.
	f, err := pidlock.Lock(path, true)
	var busy *pidlock.BusyError
	if errors.As(err, &busy) {
		return nil, &LockedError{Dir: dir, PID: busy.PID}
	}
	if err != nil {
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	return &storeLock{f: f, path: path}, nil
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
}

func (e *LockedError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("token store %s is locked by %s: only one appender may write a store; wait for it to finish or stop it", e.Dir, who)
}
