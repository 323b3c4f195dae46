package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kiln-lm/kiln/internal/bytesize"
	"github.com/kiln-lm/kiln/internal/disk"
	"github.com/kiln-lm/kiln/store"
)

// StaleDownloadAge is how long a shard's download may lie in a worker's
// raw/ directory untouched and held by no process before a shard task on
// a worker of the same data directory removes it. A download stays after
// a failed attempt so that the task's retry resumes it; one whose task
// ended for good (archived, cancelled, its worker killed in its last
// retry) has no retry coming, and over a month-long ingest such files
// would fill the disk.
const StaleDownloadAge = 24 * time.Hour

// downloadDir is the directory, under the data directory's raw/, of the
// download of a store's shard: one per shard id, the same at each attempt
// of its task, so that a retry resumes the file a failed attempt left.
func downloadDir(dataDir, storeName, shardID string) string {
	h := sha256.Sum256([]byte(shardID))
	return filepath.Join(dataDir, "raw", storeName, hex.EncodeToString(h[:8]))
}

// holdDownload makes the download directory dir when missing and holds it
// as MkdirTemp holds its directories, so that no cleaner removes it while
// the shard downloads and tokenizes. A directory another live process
// holds for longer than a cleaner looks at one is refused: its shard is
// being read there.
func holdDownload(dir string) (*TempDir, error) {
	for range mkdirTempTries {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("download directory %s: %w", dir, err)
		}
		f, held, err := hold(dir)
		if err != nil {
			return nil, fmt.Errorf("hold download directory %s: %w", dir, err)
		}
		if held {
			return &TempDir{Path: dir, f: f}, nil
		}
		// A cleaner removed a stale directory of this shard (it is made
		// again), or holds it while it looks at its age, or another run
		// of this shard's task reads it.
		time.Sleep(holdDownloadWait)
	}
	return nil, fmt.Errorf("download directory %s is held by another process: the same file is being read there by another run of its task; this one is tried again later", dir)
}

// holdDownloadWait is how long holdDownload waits for a directory held by
// another process before it looks again: a cleaner holds one for as long
// as it takes to read its times.
const holdDownloadWait = 20 * time.Millisecond

// RemoveStaleDownloads removes from dataDir/raw the shard downloads that
// no process holds and that nothing has written for StaleDownloadAge
// before now: what a shard task left that ended for good. It returns the
// paths it removed; a data directory without raw/ holds none.
func RemoveStaleDownloads(dataDir string, now time.Time) ([]string, error) {
	raw := filepath.Join(dataDir, "raw")
	stores, err := os.ReadDir(raw)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove stale downloads in %s: %w", raw, err)
	}
	before := now.Add(-StaleDownloadAge)
	var removed []string
	var errs []error
	for _, s := range stores {
		if !s.IsDir() {
			continue
		}
		dir := filepath.Join(raw, s.Name())
		entries, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, fmt.Errorf("remove stale downloads in %s: %w", dir, err))
			continue
		}
		for _, e := range entries {
			path := filepath.Join(dir, e.Name())
			if !e.IsDir() {
				// A download of a build that held no directory.
				if info, err := e.Info(); err == nil && info.ModTime().Before(before) {
					if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
						errs = append(errs, fmt.Errorf("stale download %s: %w", path, err))
						continue
					}
					removed = append(removed, path)
				}
				continue
			}
			f, held, err := hold(path)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("stale download %s: %w", path, err))
				continue
			case !held:
				continue // a live shard's, or gone already
			}
			if newest(path).Before(before) {
				if err := os.RemoveAll(path); err != nil {
					errs = append(errs, fmt.Errorf("stale download %s: %w; remove it by hand", path, err))
				} else {
					removed = append(removed, path)
				}
			}
			f.Close()
		}
	}
	return removed, errors.Join(errs...)
}

// newest is the latest modification time of dir and everything in it.
func newest(dir string) time.Time {
	var t time.Time
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.ModTime().After(t) {
			t = info.ModTime()
		}
		return nil
	})
	return t
}

// noRoom says, of an error that is a full disk (ENOSPC), which directory
// has no room for what, and how much room it has; other errors are
// returned as they are; dir "" is that of the file the error names.
// Nothing a store committed is lost to a full disk: an append that fails
// leaves it as it was. A put that filled the disk (filledError) says how
// much of its object it had written: the store removed the partial file,
// so the room free now is not what the put found, and a shard's size, known
// only once it is made, needs more than that.
func noRoom(err error, dir, what string) error {
	if !errors.Is(err, syscall.ENOSPC) {
		return err
	}
	var pe *fs.PathError
	if dir == "" && errors.As(err, &pe) {
		dir = filepath.Dir(pe.Path) // a local object store's, say
	}
	free := "unknown"
	if n, ferr := disk.Free(dir); ferr == nil {
		free = bytesize.Format(n)
	}
	var filled *filledError
	if errors.As(err, &filled) && filled.Written > 0 {
		return fmt.Errorf("no space left on the disk of %s for %s: the disk filled once at least %s of it had been written, so it needs more room than that (free there: %s, with its partial file since removed): free space on it and run the ingest again, which adds only what the store lacks: %w",
			dir, what, bytesize.Format(filled.Written), free, err)
	}
	return fmt.Errorf("no space left on the disk of %s for %s (free there: %s): free space on it and run the ingest again, which adds only what the store lacks: %w",
		dir, what, free, err)
}

// filledError is a put whose disk filled (ENOSPC) once at least Written
// bytes of its object had gone to it; the store removed the partial file.
type filledError struct {
	Written int64
	Err     error
}

func (e *filledError) Error() string { return e.Err.Error() }
func (e *filledError) Unwrap() error { return e.Err }

// countedPuts is a local object store whose puts that fill the disk say
// how far they got (filledError): a shard's tokens stream into a put of
// unknown size, and the partial file that the store removes is the only
// measure of the room the shard needed.
type countedPuts struct{ *store.Local }

// CountPuts is s, where s is a local object store, with its puts that
// fill the disk saying how far they got, so that a shard that fills it
// says how much of it had been written; any other store is returned as it
// is (an S3 server's disk is not this machine's).
func CountPuts(s store.Store) store.Store {
	if l, ok := s.(*store.Local); ok {
		return countedPuts{l}
	}
	return s
}

func (s countedPuts) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	c := &putCount{r: r}
	err := s.Local.Put(ctx, key, c, size)
	if errors.Is(err, syscall.ENOSPC) {
		// The put writes each read before the next: all but the last
		// went to the disk whole, and of the last, what the disk took.
		return &filledError{Written: c.n - c.last, Err: err}
	}
	return err
}

// putCount counts the bytes a put read, and those of its last read.
type putCount struct {
	r       io.Reader
	n, last int64
}

func (c *putCount) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if n > 0 {
		c.last = int64(n)
	}
	return n, err
}
