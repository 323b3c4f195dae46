// Package catalog is the set of tokenizers kiln knows, by name. A tokenizer
// lives at tokenizers/<name>/tokenizer.json in object storage, where every
// worker finds it, and is copied to <data dir>/tokenizers/<name>/tokenizer.json
// on each machine that uses it. A name, once published, always means the same
// bytes: token stores and checkpoints record the SHA-256 of those bytes, and a
// name that changed meaning would silently re-map every id made with it. So
// the SHA-256 is published beside the file (SHA256SUMS), and a machine saves
// or uses a download only once it matches.
package catalog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kiln-lm/kiln/internal/shell"
	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokenizer"
)

// Prefix is the object-store prefix under which tokenizers live.
const Prefix = "tokenizers/"

// FileName is the tokenizer's file inside its directory or prefix.
const FileName = "tokenizer.json"

// Key is the object key of tokenizer name.
func Key(name string) string { return Prefix + name + "/" + FileName }

// Catalog finds tokenizers in object storage and in the local data directory.
type Catalog struct {
	// Objects is the shared object store; nil means the local directory only
	// (a machine without object storage, or a test).
	Objects store.Store
	// Dir is the local root: <data dir>/tokenizers.
	Dir string
}

// New returns the catalog of a data directory and an object store.
func New(objects store.Store, dataDir string) *Catalog {
	return &Catalog{Objects: objects, Dir: filepath.Join(dataDir, "tokenizers")}
}

// Entry is one known tokenizer.
type Entry struct {
	Name string
	// Path is the local tokenizer.json (empty when only object storage has it).
	Path      string
	SHA256    string
	VocabSize int
	// EOS is the end-of-text id that separates documents; HasEOS is false
	// for a tokenizer without one (it cannot fill a token store).
	EOS    uint32
	HasEOS bool
	// Special lists the special tokens in id order.
	Special []string
	// Unreadable, set by List, says why the tokenizer.json of this name
	// does not load (the other fields are then empty).
	Unreadable string
}

func entryOf(name, local string, t *tokenizer.Tokenizer) Entry {
	e := Entry{Name: name, Path: local, SHA256: t.SHA256(), VocabSize: t.VocabSize()}
	e.EOS, e.HasEOS = t.EOS()
	e.Special = SpecialTokens(t)
	return e
}

// SpecialTokens lists t's special tokens in id order.
func SpecialTokens(t *tokenizer.Tokenizer) []string {
	var out []string
	for id := range t.VocabSize() {
		if t.IsSpecial(uint32(id)) {
			out = append(out, t.Token(uint32(id)))
		}
	}
	return out
}

// NameError is a tokenizer name that cannot be a path element: store.CheckName's
// refusal, marked as bad input.
type NameError struct {
	Name string
	err  error
}

func (e *NameError) Error() string  { return e.err.Error() }
func (e *NameError) Unwrap() error  { return e.err }
func (e *NameError) BadInput() bool { return true }

// CheckName refuses a name that would not stay one path element.
func CheckName(name string) error {
	if err := store.CheckName("tokenizer", name); err != nil {
		return &NameError{Name: name, err: err}
	}
	return nil
}

// NotFoundError is a tokenizer name that neither place holds.
type NotFoundError struct {
	Name  string
	Known []string
	// Local is where this machine would find it: a tokenizer.json that
	// 'sched tokenizer train' writes there is known by the name.
	Local string
	// Argument is set where the name was a command's argument, not
	// --tokenizer's (or KILN_TOKENIZER's) value.
	Argument bool
}

func (e *NotFoundError) Error() string {
	known := "none yet"
	if len(e.Known) > 0 {
		known = strings.Join(e.Known, ", ")
	}
	here := "'sched tokenizer train'"
	if e.Local != "" {
		here = fmt.Sprintf("'mkdir -p %s && sched tokenizer train --in TEXT --out %s'", shell.Quote(filepath.Dir(e.Local)), shell.Quote(e.Local))
	}
	other := "name another with --tokenizer"
	if e.Argument {
		other = "name another"
	}
	return fmt.Sprintf("tokenizer %q is not known (known: %s): train it with 'sched enqueue tokenizer %s' or, on this machine, %s, or %s",
		e.Name, known, e.Name, here, other)
}
func (e *NotFoundError) BadInput() bool { return true }

// ConflictError is one name with two different tokenizer.json files: the
// local copy and object storage's, or an existing one and a new one.
type ConflictError struct {
	Name                string
	Have, HaveSHA       string // where the existing file is, and its sha256
	Other, OtherSHA     string
	publishingOverwrite bool
}

func (e *ConflictError) Error() string {
	if e.publishingOverwrite {
		return fmt.Sprintf("tokenizer %q already exists (%s, sha256 %s) and the new one differs (sha256 %s): a published tokenizer is never replaced, because the stores and checkpoints made with it would change meaning; give the new one another name",
			e.Name, e.Have, e.HaveSHA, e.OtherSHA)
	}
	return fmt.Sprintf("tokenizer %q differs between %s (sha256 %s) and %s (sha256 %s): one of them was replaced outside kiln; remove the wrong copy (the object store's is the published one)",
		e.Name, e.Have, e.HaveSHA, e.Other, e.OtherSHA)
}
func (e *ConflictError) BadInput() bool { return true }

func (c *Catalog) localPath(name string) string { return filepath.Join(c.Dir, name, FileName) }

// fetch returns the bytes of name from object storage (nil, nil when
// absent), checked against the SHA-256 published with them (download),
// and from the local directory (nil, nil when absent).
func (c *Catalog) fetch(ctx context.Context, name string) (remote, local []byte, err error) {
	local, err = tokenizer.ReadFile(c.localPath(name))
	if errors.Is(err, fs.ErrNotExist) {
		local = nil
	} else if err != nil {
		return nil, nil, &localReadError{name: name, err: err}
	}
	if c.Objects == nil {
		return nil, local, nil
	}
	// local stays on an error: Resolve uses it while object storage is
	// down, or while its downloads do not match but local does.
	remote, err = c.download(ctx, name, local)
	return remote, local, err
}

// localReadError is fetch's where this machine's copy of a tokenizer is
// there but does not read (a directory in its place, no permission).
type localReadError struct {
	name string
	err  error
}

func (e *localReadError) Error() string { return fmt.Sprintf("tokenizer %s: %v", e.name, e.err) }
func (e *localReadError) Unwrap() error { return e.err }

// Resolve finds tokenizer name, copies it from object storage to the local
// directory when this machine lacks it, and loads it. Only a download that
// matches the SHA-256 published with it is saved, used, or compared with
// the local copy: one that differs from the published tokenizer is refused
// rather than used. While object storage does not answer, the local copy
// is used as it is.
func (c *Catalog) Resolve(ctx context.Context, name string) (Entry, *tokenizer.Tokenizer, error) {
	if err := CheckName(name); err != nil {
		return Entry{}, nil, err
	}
	remote, local, err := c.fetch(ctx, name)
	// While object storage is out of service this machine's copy serves:
	// it came from there or was published from here, and a published
	// tokenizer's bytes never change (Publish refuses other bytes). It
	// serves too where no download matched the published SHA-256 and this
	// copy does: it is the published tokenizer.
	if err != nil && !localServes(err, local) {
		return Entry{}, nil, err
	}
	data := local
	switch {
	case remote == nil && local == nil:
		known, lerr := c.Names(ctx)
		if lerr != nil {
			return Entry{}, nil, lerr
		}
		return Entry{}, nil, &NotFoundError{Name: name, Known: known, Local: c.localPath(name)}
	case remote != nil && local != nil && !bytes.Equal(remote, local):
		// remote is what was published (download checked it): the
		// local copy is another.
		return Entry{}, nil, &ConflictError{Name: name, Have: c.localPath(name), HaveSHA: sha(local), Other: "object storage " + Key(name), OtherSHA: sha(remote)}
	case local == nil:
		data = remote
	}
	t, err := tokenizer.Parse(data)
	if err != nil {
		return Entry{}, nil, fmt.Errorf("tokenizer %s: %w", name, err)
	}
	// Saved only once it loads: a file saved here is taken as this
	// machine's copy of the published tokenizer by every later command.
	if local == nil {
		if err := writeAtomic(c.localPath(name), data); err != nil {
			return Entry{}, nil, err
		}
	}
	return entryOf(name, c.localPath(name), t), t, nil
}

// Publish stores tokenizer.json bytes under name, in object storage and the
// local directory. Publishing the same bytes again is a no-op, so a retried
// task succeeds; different bytes under an existing name are refused.
func (c *Catalog) Publish(ctx context.Context, name string, data []byte) (Entry, error) {
	if err := CheckName(name); err != nil {
		return Entry{}, err
	}
	t, err := tokenizer.Parse(data)
	if err != nil {
		return Entry{}, fmt.Errorf("publish tokenizer %s: %w", name, err)
	}
	remote, local, err := c.fetch(ctx, name)
	if err != nil {
		return Entry{}, err
	}
	for _, have := range []struct {
		b     []byte
		where string
	}{{remote, "object storage " + Key(name)}, {local, c.localPath(name)}} {
		if have.b != nil && !bytes.Equal(have.b, data) {
			return Entry{}, &ConflictError{Name: name, Have: have.where, HaveSHA: sha(have.b), OtherSHA: t.SHA256(), publishingOverwrite: true}
		}
	}
	if c.Objects != nil && remote == nil {
		// The hash first: every machine checks its download against it,
		// so none ever finds the tokenizer.json without it.
		sums := sumsLine(data)
		if err := c.Objects.Put(ctx, SumsKey(name), bytes.NewReader(sums), int64(len(sums))); err != nil {
			return Entry{}, fmt.Errorf("publish tokenizer %s: %w", name, err)
		}
		if err := c.Objects.Put(ctx, Key(name), bytes.NewReader(data), int64(len(data))); err != nil {
			return Entry{}, fmt.Errorf("publish tokenizer %s: %w", name, err)
		}
	}
	if local == nil {
		if err := writeAtomic(c.localPath(name), data); err != nil {
			return Entry{}, err
		}
	}
	return entryOf(name, c.localPath(name), t), nil
}

// Names lists the tokenizers in object storage and the local directory.
func (c *Catalog) Names(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	if c.Objects != nil {
		infos, err := c.Objects.List(ctx, Prefix)
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", Prefix, err)
		}
		for _, in := range infos {
			rest := strings.TrimPrefix(in.Key, Prefix)
			if name, file, ok := strings.Cut(rest, "/"); ok && file == FileName {
				seen[name] = true
			}
		}
	}
	dirs, err := os.ReadDir(c.Dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("list tokenizers in %s: %w", c.Dir, err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(c.localPath(d.Name())); err == nil {
			seen[d.Name()] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// List describes every known tokenizer without copying any to this machine.
func (c *Catalog) List(ctx context.Context) ([]Entry, error) {
	names, err := c.Names(ctx)
	if err != nil {
		return nil, err
	}
	var out []Entry
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		remote, local, err := c.fetch(ctx, name)
		var unread *localReadError
		var dl *DownloadError
		switch {
		case errors.As(err, &unread):
			// One copy here that does not read hides none of the others.
			out = append(out, Entry{Name: name, Path: c.localPath(name), Unreadable: unread.err.Error()})
			continue
		case errors.As(err, &dl):
			// Nor does one whose downloads never matched what was
			// published, though this machine's copy may serve its tasks
			// (Resolve): the listing is where that is seen.
			e := Entry{Name: name, Unreadable: dl.listed()}
			if local != nil {
				e.Path = c.localPath(name)
			}
			out = append(out, e)
			continue
		case err != nil:
			return nil, err
		}
		// The published copy is object storage's, where there is one;
		// the path shown is this machine's copy, where there is one.
		data, where, read := remote, "", Key(name)+" in object storage"
		if data == nil {
			data, where, read = local, c.localPath(name), c.localPath(name)
		} else if local != nil {
			where = c.localPath(name)
		}
		t, err := tokenizer.Parse(data)
		if err != nil {
			// One damaged file does not hide the others: it is listed as
			// such, naming the copy that was read.
			out = append(out, Entry{Name: name, Path: where, Unreadable: fmt.Sprintf("%s: %v", read, err)})
			continue
		}
		if remote != nil && local != nil && !bytes.Equal(remote, local) {
			// Not what Resolve would load: it refuses the two copies.
			conflict := &ConflictError{Name: name, Have: where, HaveSHA: sha(local), Other: "object storage " + Key(name), OtherSHA: sha(remote)}
			out = append(out, Entry{Name: name, Path: where, Unreadable: conflict.Error()})
			continue
		}
		out = append(out, entryOf(name, where, t))
	}
	return out, nil
}

// writeAtomic writes data to p through a temporary file and a rename, so a
// reader never sees part of a tokenizer.json.
func writeAtomic(p string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	f, err := os.CreateTemp(filepath.Dir(p), "."+path.Base(p)+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return nil
}
