package ingest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-lm/kiln/tokens"
)

// Reconciled is a store whose status in object storage said other than
// its directory here: Listed files the status had, Holds files the store
// holds (0: no store here).
type Reconciled struct {
	Store         string
	Listed, Holds int
}

// ReconcileStatuses makes the status in object storage of every token
// store say what the store in p.StoresDir holds, where it says otherwise,
// and returns those stores. Plans and shards skip the files a status
// lists, so a status that outlived its store (the disk lost, or a backup
// of fewer files put back) would keep those files out of the store for
// good; the appending worker, which holds the stores, runs this at its
// start. A store not here at all loses its status, as one never ingested;
// one here gets its manifest's, also one that has no status (its files
// copied here after its status was cleared, or for another object store),
// which the statuses alone would not name. A store whose manifest cannot
// be read is left alone and named in the error.
func (p *Pipeline) ReconcileStatuses(ctx context.Context) ([]Reconciled, error) {
	if p.StoresDir == "" {
		return nil, nil
	}
	objs, err := p.Objects.List(ctx, "tokens/")
	if err != nil {
		return nil, fmt.Errorf("listing the token stores' statuses: %w", err)
	}
	names := map[string]bool{}
	for _, o := range objs {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, "tokens/"), "/status.json")
		if ok && !strings.Contains(name, "/") && CheckStoreName(name) == nil {
			names[name] = true
		}
	}
	var errs []error
	dirs, err := os.ReadDir(p.StoresDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("listing the token stores in %s: %w", p.StoresDir, err))
	}
	for _, d := range dirs {
		if d.IsDir() && CheckStoreName(d.Name()) == nil {
			names[d.Name()] = true
		}
	}
	var out []Reconciled
	for _, name := range slices.Sorted(maps.Keys(names)) {
		r, changed, err := p.reconcile(ctx, name)
		if err != nil {
			errs = append(errs, err)
		} else if changed {
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}

func (p *Pipeline) reconcile(ctx context.Context, name string) (Reconciled, bool, error) {
	r := Reconciled{Store: name}
	st, err := p.Status(ctx, name)
	if err != nil {
		return r, false, err
	}
	r.Listed = len(st.Done)
	dir := filepath.Join(p.StoresDir, name)
	unlock := lockStoreHere(dir)
	defer unlock()
	m, err := tokens.ReadManifest(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if len(st.Done) == 0 {
			return r, false, nil
		}
		if err := p.Objects.Delete(ctx, StatusKey(name)); err != nil {
			return r, false, fmt.Errorf("clearing the status of token store %s, which is not in %s: %w", name, p.StoresDir, err)
		}
		return r, true, nil
	case err != nil:
		return r, false, err
	}
	done, partial := storeFiles(*m)
	r.Holds = len(done)
	if slices.Equal(done, st.Done) && slices.Equal(partial, st.Partial) && st.Tokens == m.Tokens {
		return r, false, nil
	}
	_, err = p.publishStatus(ctx, name, *m, Limits{}, Limits{})
	return r, err == nil, err
}

// StoresWatch notices the token stores of a Pipeline's StoresDir that
// went while the process runs (their directory or its manifest deleted,
// as `sched datasets` says to do with a damaged one) or whose directory
// was replaced by another, and makes their statuses in object storage say
// what the directory holds now, as ReconcileStatuses does for every store
// at a worker's start: a status that outlived its store would keep the
// store's files out of the next ingest, which would take them for stored.
// A store that appears is left to the appends that fill it, which publish
// its status. It is safe for concurrent use.
type StoresWatch struct {
	p       *Pipeline
	mu      sync.Mutex
	seen    map[string]storeSeen
	failed  map[string]string // the last error of each store not mended
	stopped bool
}

// storeSeen is what a look found of one store's directory.
type storeSeen struct {
	dir      os.FileInfo // its identity, for os.SameFile (device and inode); nil: not known
	manifest bool
}

// WatchStores looks at the stores in p.StoresDir now; Check looks again
// and mends the statuses of those that went or were replaced since.
func (p *Pipeline) WatchStores() *StoresWatch {
	seen, err := p.lookAtStores()
	if err != nil {
		seen = map[string]storeSeen{} // the next look that reads tells
	}
	return &StoresWatch{p: p, seen: seen, failed: map[string]string{}}
}

// lookAtStores lists the store directories in p.StoresDir (none when it
// does not exist yet) and whether each holds a manifest.
func (p *Pipeline) lookAtStores() (map[string]storeSeen, error) {
	seen := map[string]storeSeen{}
	if p.StoresDir == "" {
		return seen, nil
	}
	dirs, err := os.ReadDir(p.StoresDir)
	if errors.Is(err, fs.ErrNotExist) {
		return seen, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the token stores in %s: %w", p.StoresDir, err)
	}
	for _, d := range dirs {
		if !d.IsDir() || CheckStoreName(d.Name()) != nil {
			continue
		}
		fi, err := d.Info()
		if err != nil {
			continue // gone since the listing
		}
		_, err = os.Lstat(filepath.Join(p.StoresDir, d.Name(), tokens.ManifestFile))
		seen[d.Name()] = storeSeen{dir: fi, manifest: !errors.Is(err, fs.ErrNotExist)}
	}
	return seen, nil
}

// Check looks at the stores again and makes the status of each store that
// held a manifest at the last look, and no longer does (its directory or
// manifest gone) or lies in another directory now, say what its directory
// holds (ReconcileStatuses); it returns the stores whose status changed.
// A store whose status could not be mended is tried again at the next
// Check, and its error is returned again only when it changes. After Stop,
// Check does nothing.
func (w *StoresWatch) Check(ctx context.Context) ([]Reconciled, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, nil
	}
	now, err := w.p.lookAtStores()
	if err != nil {
		return nil, w.fail("", err)
	}
	delete(w.failed, "")
	var out []Reconciled
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(w.seen)) {
		was := w.seen[name]
		is, here := now[name]
		if !was.manifest || here && is.manifest && was.dir != nil && os.SameFile(was.dir, is.dir) {
			continue
		}
		r, changed, err := w.p.reconcile(ctx, name)
		if err != nil {
			now[name] = was // looked at again at the next Check
			if err := w.fail(name, err); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		delete(w.failed, name)
		if changed {
			out = append(out, r)
		}
	}
	w.seen = now
	return out, errors.Join(errs...)
}

// Saw tells the watch that the store name held a manifest a moment ago
// (an append to it ended), whether or not a look found it since: a store
// made and deleted between two looks is noticed too.
func (w *StoresWatch) Saw(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[name].manifest {
		return
	}
	fi, err := os.Lstat(filepath.Join(w.p.StoresDir, name))
	if err != nil {
		fi = nil // gone already: the next Check mends its status
	}
	w.seen[name] = storeSeen{dir: fi, manifest: true}
}

// fail records err as the last error of the store name ("": of the
// listing) and returns it, or nil when it is the one recorded already.
func (w *StoresWatch) fail(name string, err error) error {
	if w.failed[name] == err.Error() {
		return nil
	}
	w.failed[name] = err.Error()
	return err
}

// Stop ends the watch: no Check mends a status once Stop returns (a
// worker that lost the append queue to another disk no longer speaks for
// the stores).
func (w *StoresWatch) Stop() {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}
