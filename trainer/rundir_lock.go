package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RunDirLockFile is the file in a run directory whose flock the process
// training into the directory holds: two processes training into one
// directory would write each other's checkpoints and metrics, and remove
// each other's checkpoints under way as stale. The kernel drops the
// flock when its holder dies, SIGKILL included; the pid in the file only
// names the holder in the error another process gets.
const RunDirLockFile = ".train.lock"

// RunDirBusyError is Run's error where another process trains into the
// run directory.
type RunDirBusyError struct {
	Dir string
	PID int // 0 where the holder could not be read
}

func (e *RunDirBusyError) Error() string {
	who := "another process"
	if e.PID > 0 {
		who = "another process (pid " + strconv.Itoa(e.PID) + ")"
	}
	return fmt.Sprintf("run directory %s is being trained into by %s: wait for it to end or stop it, or train into another directory (--out)", e.Dir, who)
}

// lockRunDir takes the flock of dir's RunDirLockFile without waiting; the
// returned file holds it until closed.
func lockRunDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, RunDirLockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock run directory %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			b, _ := os.ReadFile(path)
			pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			return nil, &RunDirBusyError{Dir: dir, PID: pid}
		}
		return nil, fmt.Errorf("lock run directory %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
