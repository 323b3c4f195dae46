package ingest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// TempDir is a temporary directory held by the process that made it: an
// exclusive flock(2) on the directory itself, which the kernel drops when
// the process exits however it exits (SIGKILL, the OOM killer), as the
// token store's lock is. A process killed before it removes its directory
// leaves it unheld, and RemoveStaleTemp, run by the next process that
// makes such directories, removes it; one still held is never touched, so
// processes sharing a data directory (scaled workers on one volume, two
// direct ingests) can clean it while the others run.
//
// The lock is on the directory, not on a file inside it: the directory
// exists locked or not at all, with no moment in which a cleaner could not
// tell a process that is just making it from one that died doing so.
type TempDir struct {
	// Path is the directory.
	Path string
	// f is the directory open, holding the flock; its descriptor is
	// close-on-exec, so a child process never inherits the hold.
	f *os.File
}

// mkdirTempTries bounds MkdirTemp's retries: each needs a cleaner to take
// the new directory in the moment between its mkdir and its flock.
const mkdirTempTries = 100

// MkdirTemp makes a new directory in dir, named from pattern as
// os.MkdirTemp names it, and holds it until Remove.
func MkdirTemp(dir, pattern string) (*TempDir, error) {
	for range mkdirTempTries {
		path, err := os.MkdirTemp(dir, pattern)
		if err != nil {
			return nil, err
		}
		f, held, err := hold(path)
		if err != nil {
			os.Remove(path)
			return nil, fmt.Errorf("hold temporary directory %s: %w", path, err)
		}
		if held {
			return &TempDir{Path: path, f: f}, nil
		}
		// A cleaner took the directory before its flock: the cleaner
		// removes it, and another name is tried.
	}
	return nil, fmt.Errorf("make a temporary directory %s in %s: taken by a cleaner %d times running; is another process removing %s?",
		pattern, dir, mkdirTempTries, filepath.Join(dir, pattern))
}

// Remove removes the directory and everything in it, then lets it go: it
// stays held until it is gone, so no cleaner races the removal.
func (d *TempDir) Remove() error {
	err := os.RemoveAll(d.Path)
	if cerr := d.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Release lets the directory go and leaves it in place, for a later
// process to take up or a cleaner to remove.
func (d *TempDir) Release() error { return d.f.Close() }

// RemoveStaleTemp removes the directories in dir named from pattern (as
// MkdirTemp names them) that no live process holds: those a killed process
// left. It returns the ones it removed; a missing dir holds none.
func RemoveStaleTemp(dir, pattern string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove stale temporary directories in %s: %w", dir, err)
	}
	prefix, suffix := pattern, ""
	if i := strings.LastIndex(pattern, "*"); i >= 0 {
		prefix, suffix = pattern[:i], pattern[i+1:]
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() || len(name) < len(prefix)+len(suffix) || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, suffix) {
			continue
		}
		path := filepath.Join(dir, name)
		f, held, err := hold(path)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("stale temporary directory %s: %w", path, err))
			continue
		case !held:
			continue // a live process's, or gone already
		}
		err = os.RemoveAll(path)
		f.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("stale temporary directory %s, left by a killed process: %w; remove it by hand", path, err))
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}

// hold takes the flock of the directory path without waiting. held is
// false, with no error, when another process holds it or path no longer
// names the directory that was locked (a cleaner removed it, and perhaps a
// new one took its name): the directory is not the caller's to use.
func hold(path string) (f *os.File, held bool, err error) {
	f, err = os.OpenFile(path, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, false, nil
		}
		return nil, false, err
	}
	locked, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, false, err
	}
	now, err := os.Lstat(path)
	if err != nil || !os.SameFile(locked, now) {
		f.Close()
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, false, err
		}
		return nil, false, nil
	}
	return f, true, nil
}
