// Package pidlock takes an exclusive flock(2) on a file that names its
// holder's pid. The kernel drops the flock when the holder dies, SIGKILL
// included, so a crashed holder never leaves the lock behind; the pid only
// names the holder in the error another process gets.
package pidlock

import (
	"errors"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// BusyError is Lock's error where another open file holds the flock.
type BusyError struct {
	// PID is the holder's, as its file says (0: not read).
	PID int
}

func (e *BusyError) Error() string {
	if e.PID > 0 {
		return "locked by pid " + strconv.Itoa(e.PID)
	}
	return "locked by another process"
}

// Lock takes the flock of path, made if missing, without waiting, and
// writes this process's pid into it; the returned file holds the flock
// until it is closed. Where another open file holds it, the error is a
// *BusyError naming the holder's pid, unless waitOwn is set and that pid
// is this process's (a child it forked holds the descriptor between its
// fork and exec), when Lock waits for the flock.
func Lock(path string, waitOwn bool) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) && waitOwn && Holder(path) == os.Getpid() {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	}
	if err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &BusyError{PID: Holder(path)}
		}
		return nil, err
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// Holder is the pid that path names (0: none read).
func Holder(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}
