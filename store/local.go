package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// Local stores objects as files under a directory. Put writes a temporary
// file beside the target and renames it, so a reader never sees a partial
// object and a crash leaves only a temporary file, which List ignores.
type Local struct {
	dir string
	// dirs orders this process's puts making a directory and its deletes
	// removing one that became empty (see createTemp).
	dirs sync.Mutex
}

// tmpSuffix marks in-progress puts; List and Get never return them.
const tmpSuffix = ".kiln-partial"

// NewLocal returns a store rooted at dir, creating it if needed.
func NewLocal(dir string) (*Local, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("local store %s: %w", dir, err)
	}
	return &Local{dir: dir}, nil
}

func (l *Local) path(key string) (string, error) {
	if err := CheckKey(key); err != nil {
		return "", err
	}
	if strings.HasSuffix(key, tmpSuffix) {
		return "", fmt.Errorf("object key %q: the suffix %s is reserved", key, tmpSuffix)
	}
	return filepath.Join(l.dir, filepath.FromSlash(key)), nil
}

// Put implements Store.
func (l *Local) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	p, err := l.path(key)
	if err != nil {
		return err
	}
	f, err := l.createTemp(p)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			f.Close()
			os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, ctxReader{ctx, r})
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if size >= 0 && n != size {
		return fmt.Errorf("put %s: read %d bytes, expected %d", key, n, size)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	ok = true
	return nil
}

// createTemp makes p's directory and the temporary file of a put to p in
// it; once the file is there, no Delete removes the directory. A Delete
// that empties a directory removes it, so the two are ordered in this
// process, and tried again where another process sharing the store
// removed a directory in between.
func (l *Local) createTemp(p string) (*os.File, error) {
	l.dirs.Lock()
	defer l.dirs.Unlock()
	for try := 0; ; try++ {
		err := os.MkdirAll(filepath.Dir(p), 0o755)
		var f *os.File
		if err == nil {
			f, err = os.CreateTemp(filepath.Dir(p), filepath.Base(p)+".*"+tmpSuffix)
		}
		if err == nil || !errors.Is(err, fs.ErrNotExist) || try == 100 {
			return f, err
		}
	}
}

// Get implements Store.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %s from %s: %w", key, l.dir, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return f, nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, key string) (Info, error) {
	p, err := l.path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && fi.IsDir()) {
		return Info{}, fmt.Errorf("stat %s in %s: %w", key, l.dir, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()}, nil
}

// List implements Store.
func (l *Local) List(ctx context.Context, prefix string) ([]Info, error) {
	var out []Info
	// Only the prefix's directory is walked, not the whole store; and an
	// object or a directory deleted while the walk passes (a delete
	// elsewhere, an emptied directory removed) is no longer there to list,
	// not an error.
	root := l.dir
	if i := strings.LastIndexByte(prefix, '/'); i > 0 {
		root = filepath.Join(l.dir, filepath.FromSlash(prefix[:i]))
	}
	err := walkFiles(ctx, root, func(p string, d fs.DirEntry) error {
		if strings.HasSuffix(p, tmpSuffix) {
			return nil
		}
		rel, err := filepath.Rel(l.dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		out = append(out, Info{Key: key, Size: fi.Size(), Modified: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q in %s: %w", prefix, l.dir, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Delete implements Store.
func (l *Local) Delete(ctx context.Context, key string) error {
	p, err := l.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	l.removeEmptyDirs(p)
	return nil
}

// removeEmptyDirs removes the directories above p that its removal left
// empty: directories exist only through their objects, as in S3 (os.Remove
// refuses a directory that is not empty), so that a checkpoint pruned
// leaves no empty step directory.
func (l *Local) removeEmptyDirs(p string) {
	l.dirs.Lock()
	defer l.dirs.Unlock()
	for d := filepath.Dir(p); d != l.dir && strings.HasPrefix(d, l.dir+string(filepath.Separator)); d = filepath.Dir(d) {
		if os.Remove(d) != nil {
			break
		}
	}
}

// removeStalePuts removes the temporary files of puts under kiln's
// prefixes that nothing has written since before cutoff: those a process
// killed mid-put left (a put that fails removes its own), which no List or
// Get shows and nothing else would ever remove. It returns them as
// uploads: the object's key, the file's name as the id.
func (l *Local) removeStalePuts(ctx context.Context, cutoff time.Time) ([]Upload, error) {
	var out []Upload
	for _, prefix := range Prefixes {
		root := filepath.Join(l.dir, filepath.FromSlash(strings.TrimSuffix(prefix, "/")))
		err := walkFiles(ctx, root, func(p string, d fs.DirEntry) error {
			if !strings.HasSuffix(p, tmpSuffix) {
				return nil
			}
			fi, err := d.Info()
			if errors.Is(err, fs.ErrNotExist) || err == nil && !fi.ModTime().Before(cutoff) {
				return nil
			}
			if err != nil {
				return err
			}
			if err := os.Remove(p); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
			l.removeEmptyDirs(p)
			// createTemp names it <object>.<random><tmpSuffix>.
			name := strings.TrimSuffix(p, tmpSuffix)
			if i := strings.LastIndexByte(name, '.'); i > len(filepath.Dir(p)) {
				name = name[:i]
			}
			key, _ := filepath.Rel(l.dir, name)
			out = append(out, Upload{Key: filepath.ToSlash(key), ID: filepath.Base(p), LastActive: fi.ModTime()})
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("remove the unfinished puts under %s in %s: %w", prefix, l.dir, err)
		}
	}
	return out, nil
}

// walkFiles calls visit for each file under root until ctx ends. A file
// or directory deleted while the walk passes (a delete elsewhere, an
// emptied directory removed), or a root not made yet, is no longer there:
// not an error.
func walkFiles(ctx context.Context, root string, visit func(p string, d fs.DirEntry) error) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		return visit(p, d)
	})
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
