package tokens

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// storeLock is an exclusive flock on <store>/lock. The kernel drops it when
// the holder dies, even by SIGKILL, so a crashed appender never leaves a
// store locked; the pid written into the file only names the holder in the
// error a second appender gets.
type storeLock struct{ f *os.File }

func lockStore(dir string) (*storeLock, error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &LockedError{Dir: dir, PID: readPID(path)}
		}
		return nil, fmt.Errorf("lock token store %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &storeLock{f: f}, nil
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
	return l.f.Close()
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
