package tokens

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
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
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) && readPID(path) == os.Getpid() {
		// Held by a child of this process between its fork and exec.
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f, path: path}, nil
}

func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
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
