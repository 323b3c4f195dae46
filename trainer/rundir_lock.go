package trainer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/kiln-lm/kiln/internal/pidlock"
)

// RunDirLockFile is the file in a run directory whose flock the process
// training into the directory holds: two processes training into one
// directory would write each other's checkpoints and metrics, and remove
// each other's checkpoints under way as stale. The kernel drops the
// flock when its holder dies, SIGKILL included.
const RunDirLockFile = ".train.lock"

// RunDirBusyError is Run's error where another process trains into the
// run directory.
type RunDirBusyError struct {
	Dir string
	PID int // 0 where the holder could not be read
}

func (e *RunDirBusyError) Error() string {
	return fmt.Sprintf("run directory %s is being trained into by %s: wait for it to end or stop it, or train into another directory (--out)", e.Dir, e.Holder())
}

// Holder names the process that holds the directory, by its pid where
// that could be read.
func (e *RunDirBusyError) Holder() string {
	if e.PID > 0 {
		return "another process (pid " + strconv.Itoa(e.PID) + ")"
	}
	return "another process"
}

// lockRunDir takes the flock of dir's RunDirLockFile without waiting; the
// returned file holds it until closed.
func lockRunDir(dir string) (*os.File, error) {
	f, err := pidlock.Lock(filepath.Join(dir, RunDirLockFile), false)
	var busy *pidlock.BusyError
	if errors.As(err, &busy) {
		return nil, &RunDirBusyError{Dir: dir, PID: busy.PID}
	}
	if err != nil {
		return nil, fmt.Errorf("lock run directory %s: %w", dir, err)
	}
	return f, nil
}
