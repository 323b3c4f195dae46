package ingest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// RootsSetting names where a worker's local roots are set, for the errors
// that tell the user what to change.
const RootsSetting = "KILN_LOCAL_ROOTS (--local-roots, local_roots in the config file)"

// OutsideRootsError is a local path in a task that lies outside the
// directories the worker is configured to read. Task payloads come from
// whoever can write to Redis, so a path there is not trusted: without this
// check a payload naming /etc/passwd would be tokenized into a store.
type OutsideRootsError struct {
	Path  string
	Roots []string
	// Target is where Path leads through a symbolic link (itself or a
	// directory above it); "" where it leads nowhere else.
	Target string
}

func (e *OutsideRootsError) Error() string {
	if len(e.Roots) == 0 {
		return fmt.Sprintf("local file %s: this worker reads no local files; set %s to the directories it may read", e.Path, RootsSetting)
	}
	roots := strings.Join(e.Roots, string(os.PathListSeparator))
	if e.Target != "" {
		return fmt.Sprintf("local file %s leads through a symbolic link to %s, outside the directories this worker may read (%s): copy that file under one of them in the link's place, or add its directory to %s",
			e.Path, e.Target, roots, RootsSetting)
	}
	return fmt.Sprintf("local file %s is outside the directories this worker may read (%s): move it under one of them or add its directory to %s",
		e.Path, roots, RootsSetting)
}

// BadInput is true: retrying cannot help until the worker's roots change.
func (e *OutsideRootsError) BadInput() bool { return true }

// CheckLocalPath refuses path unless it lies under one of roots, once
// symbolic links are resolved on both sides, so that a link inside a root
// cannot lead out of it. A path that does not exist is judged by its
// spelling alone: reading it fails anyway.
func CheckLocalPath(roots []string, path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return &OutsideRootsError{Path: path, Roots: roots}
	}
	real, err := filepath.EvalSymlinks(abs)
	if errors.Is(err, fs.ErrNotExist) {
		real = abs
	} else if err != nil {
		return fmt.Errorf("resolving local file %s: %w", path, err)
	}
	for _, root := range roots {
		if root == "" {
			continue
		}
		r, err := filepath.Abs(root)
		if err != nil {
			continue
		}
		if rr, err := filepath.EvalSymlinks(r); err == nil {
			r = rr
		}
		if within(r, real) {
			return nil
		}
	}
	e := &OutsideRootsError{Path: path, Roots: roots}
	if real != abs {
		e.Target = real
	}
	return e
}

// within reports whether p is dir or lies below it; both are absolute and
// clean.
func within(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)) && !filepath.IsAbs(rel)
}
