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
	"time"

	"github.com/kiln-lm/kiln/store"
	"github.com/kiln-lm/kiln/tokens"
)

// Reconciled is a store whose status in object storage said other than
// its directory here: Listed files the status had, Holds files the store
// holds (0: no store here).
type Reconciled struct {
	Store         string
	Listed, Holds int
	// Damaged is set where the store's files are damaged: its status now
	// says so (StoreStatus.Damaged), and the status's files stay listed.
	Damaged string
	// Gone is set where the store is not in the directory at all (deleted,
	// or its disk lost): its status was cleared.
	Gone bool
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
// which the statuses alone would not name. A store whose files are
// damaged (tokens.bin cut short or gone, a manifest that does not parse)
// has its status marked so (StoreStatus.Damaged); one whose manifest
// cannot be read for another reason (another release's) is left alone
// and named in the error.
func (p *Pipeline) ReconcileStatuses(ctx context.Context) ([]Reconciled, error) {
	out, _, failed, err := p.reconcileAll(ctx)
	errs := []error{err}
	for _, name := range slices.Sorted(maps.Keys(failed)) {
		errs = append(errs, failed[name])
	}
	return out, errors.Join(errs...)
}

// reconcileAll is ReconcileStatuses with its errors apart: err is the
// whole's (a listing, of the statuses or of the stores' directory),
// failed each store's that could not be mended; damaged holds how each
// store whose files are damaged is, its status marked now or before.
func (p *Pipeline) reconcileAll(ctx context.Context) (out []Reconciled, damaged map[string]string, failed map[string]error, err error) {
	if p.StoresDir == "" {
		return nil, nil, nil, nil
	}
	published, err := PublishedStores(ctx, p.Objects)
	if err != nil {
		return nil, nil, nil, err
	}
	names := map[string]bool{}
	for _, name := range published {
		names[name] = true
	}
	dirs, lerr := os.ReadDir(p.StoresDir)
	if lerr != nil && !errors.Is(lerr, fs.ErrNotExist) {
		err = fmt.Errorf("listing the token stores in %s: %w", p.StoresDir, lerr)
	}
	for _, d := range dirs {
		if d.IsDir() && CheckStoreName(d.Name()) == nil {
			names[d.Name()] = true
		}
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		r, changed, rerr := p.reconcile(ctx, name)
		if rerr != nil {
			if failed == nil {
				failed = map[string]error{}
			}
			failed[name] = rerr
			continue
		}
		if changed {
			out = append(out, r)
		}
		if r.Damaged != "" {
			if damaged == nil {
				damaged = map[string]string{}
			}
			damaged[name] = r.Damaged
		}
	}
	return out, damaged, failed, err
}

// PublishedStores names the token stores that have a status in objects,
// sorted: those the worker that appends holds, and those it held that
// are not mended yet.
func PublishedStores(ctx context.Context, objects store.Store) ([]string, error) {
	objs, err := objects.List(ctx, "tokens/")
	if err != nil {
		return nil, fmt.Errorf("listing the token stores' statuses: %w", err)
	}
	var names []string
	for _, o := range objs {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, "tokens/"), "/status.json")
		if ok && !strings.Contains(name, "/") && CheckStoreName(name) == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

func (p *Pipeline) reconcile(ctx context.Context, name string) (Reconciled, bool, error) {
	r := Reconciled{Store: name}
	dir := filepath.Join(p.StoresDir, name)
	// The status is read under the store's lock, which an append holds
	// until it has published the status of what it committed: read before
	// it, an append's status could be taken for a stale one and published
	// over, its limits' mark lost.
	unlock := lockStoreHere(dir)
	defer unlock()
	st, err := p.Status(ctx, name)
	if err != nil {
		return r, false, err
	}
	r.Listed = len(st.Done)
	m, err := tokens.ReadManifest(dir)
	if err == nil {
		err = tokens.CheckFile(dir, m)
	}
	var ie *tokens.InputError
	if errors.As(err, &ie) && ie.Damage != "" {
		return p.publishDamaged(ctx, r, st, dir, ie.Damage)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if len(st.Done) == 0 {
			return r, false, nil
		}
		err := p.leased(ctx, name, "clear its status", func(ctx context.Context) error { return p.Objects.Delete(ctx, StatusKey(name)) })
		var lapsed *LeaseError
		if errors.As(err, &lapsed) {
			lapsed.Then = statusLeft
			return r, false, err
		}
		if err != nil {
			return r, false, fmt.Errorf("clearing the status of token store %s, which is not in %s: %w", name, p.StoresDir, err)
		}
		r.Gone = true
		return r, true, nil
	case err != nil:
		return r, false, err
	}
	done, partial := storeFiles(*m)
	r.Holds = len(done)
	if slices.Equal(done, st.Done) && slices.Equal(partial, st.Partial) && st.Tokens == m.Tokens && st.Damaged == "" {
		return r, false, nil
	}
	_, err = p.publishStatus(ctx, name, *m, Limits{}, Limits{})
	var lapsed *LeaseError
	if errors.As(err, &lapsed) {
		lapsed.Then = statusLeft
	}
	return r, err == nil, err
}

// publishDamaged marks the status st of the store in dir damaged, as
// damage says: its last whole status stays, for the files it lists to be
// planned again only once the store is deleted (reconcile then clears
// it) or mended.
func (p *Pipeline) publishDamaged(ctx context.Context, r Reconciled, st StoreStatus, dir, damage string) (Reconciled, bool, error) {
	host, _ := os.Hostname()
	if host == "" {
		host = "the worker that serves append"
	}
	r.Damaged = fmt.Sprintf("%s; delete %s on %s, then re-ingest it if you still need it", damage, dir, host)
	if st.Damaged == r.Damaged {
		return r, false, nil
	}
	st.Damaged, st.Updated = r.Damaged, time.Now().UTC()
	err := p.putStatus(ctx, r.Store, st, "mark its status damaged")
	var lapsed *LeaseError
	if errors.As(err, &lapsed) {
		lapsed.Then = statusLeft
	}
	return r, err == nil, err
}

// statusLeft is what becomes of a status that reconcile did not mend for
// want of a lease (LeaseError.Then).
const statusLeft = "the status is left as it was, for a worker whose claim holds to mend: this one's watch of the stores tries again at its next look, and a worker's start mends every status"

// StoresWatch notices the token stores of a Pipeline's StoresDir that
// changed while the process runs other than by its own appends (a store's
// directory or manifest deleted, as `sched datasets` says to do with a
// damaged one; a directory replaced, or a backup put back in it; a store
// moved away and back) and makes their statuses in object storage say
// what the directory holds now, as ReconcileStatuses does for every store
// at a worker's start: a status that outlived its store would keep the
// store's files out of the next ingest, which would take them for stored,
// and a store back without a status would be taken for empty. It is safe
// for concurrent use; a Check's requests to object storage hold up no Saw.
type StoresWatch struct {
	p *Pipeline
	// checking is held by a Check from its look to its last mend, and by
	// Stop: Checks take turns, and Stop waits for the one under way.
	checking sync.Mutex
	mu       sync.Mutex // guards the fields below
	seen     map[string]storeSeen
	listed   bool              // StoresDir existed at a look
	failed   map[string]string // the last error of each store not mended
	stopped  bool
	// pending is set while every status is still to be mended (ReconcileAll
	// failed, or ReconcileLater): a worker's start that could not.
	pending bool
}

// allStores is the key of failed for ReconcileAll's last error.
const allStores = "\x00all"

// ReconcileAll runs ReconcileStatuses, every store's status mended, as
// a worker's start does. Where the whole fails (object storage down, the
// stores' directory unreadable) it is left pending, for the caller's next
// look to try again whole (Pending); a store that fails alone (its
// manifest unreadable, the lease unconfirmed) is tried again by the next
// Check, as a store that changed, so that one damaged store does not
// make every look list every status. Each error is returned once while
// it stays the same. After Stop it does nothing.
func (w *StoresWatch) ReconcileAll(ctx context.Context) ([]Reconciled, error) {
	w.checking.Lock()
	defer w.checking.Unlock()
	if w.Stopped() {
		return nil, nil
	}
	rs, damaged, failed, err := w.p.reconcileAll(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	for name, d := range damaged {
		s := w.seen[name]
		s.damaged = d
		w.seen[name] = s
	}
	w.pending = err != nil
	var errs []error
	if err != nil {
		errs = append(errs, w.fail(allStores, err))
	} else {
		delete(w.failed, allStores)
	}
	for _, name := range slices.Sorted(maps.Keys(failed)) {
		s := w.seen[name]
		s.again = true
		w.seen[name] = s
		errs = append(errs, w.fail(name, failed[name]))
	}
	return rs, errors.Join(errs...)
}

// ReconcileLater leaves ReconcileAll pending: a worker that starts while
// object storage does not answer.
func (w *StoresWatch) ReconcileLater() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending = true
}

// Pending says whether ReconcileAll is still to succeed.
func (w *StoresWatch) Pending() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// storeSeen is what a look found of one store: its directory's, its
// manifest's and its tokens.bin's identity (device and inode, for
// os.SameFile), the manifest's size and time too, which a manifest
// written again in place changes, and tokens.bin's size. The zero value
// is a store not there.
type storeSeen struct {
	dir, manifest, tokens os.FileInfo // nil: not there
	// again marks a store whose status was not mended: the next Check
	// tries again.
	again bool
	// damaged is, for a store whose status says its files are damaged,
	// how (StoreStatus.Damaged): any change of tokens.bin may have
	// mended it.
	damaged string
}

// same says whether a, the last look of a store, and b, the look now,
// are the same. tokens.bin grows with every append, this process's too:
// only a file that shrank (cut short outside kiln) or was replaced is a
// change, or any change of a store found damaged (a file put back).
func (a storeSeen) same(b storeSeen) bool {
	return !a.again && !b.again && sameFile(a.dir, b.dir) && sameFile(a.manifest, b.manifest) &&
		(a.manifest == nil || a.manifest.Size() == b.manifest.Size() && a.manifest.ModTime().Equal(b.manifest.ModTime())) &&
		sameFile(a.tokens, b.tokens) &&
		(a.tokens == nil || b.tokens.Size() >= a.tokens.Size() && (a.damaged == "" || b.tokens.Size() == a.tokens.Size() && b.tokens.ModTime().Equal(a.tokens.ModTime())))
}

func sameFile(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	return os.SameFile(a, b)
}

// WatchStores looks at the stores in p.StoresDir now; Check looks again
// and mends the statuses of those that changed since.
func (p *Pipeline) WatchStores() *StoresWatch {
	w := &StoresWatch{p: p, seen: map[string]storeSeen{}, failed: map[string]string{}}
	if seen, listed, err := p.lookAtStores(false); err == nil {
		w.seen, w.listed = seen, listed
	}
	return w
}

// lookAtStores looks at each store directory in p.StoresDir and its
// manifest, and says whether the directory exists. Where it existed at
// the last look (listed) and does not now, it is an error: a disk that
// went for a moment (unmounted) must not clear every status; a worker's
// start mends them if it stays gone.
func (p *Pipeline) lookAtStores(listed bool) (map[string]storeSeen, bool, error) {
	seen := map[string]storeSeen{}
	if p.StoresDir == "" {
		return seen, false, nil
	}
	dirs, err := os.ReadDir(p.StoresDir)
	if errors.Is(err, fs.ErrNotExist) && !listed {
		return seen, false, nil
	}
	if err != nil {
		return nil, listed, fmt.Errorf("listing the token stores in %s: %w; their statuses are left as they are until it lists again", p.StoresDir, err)
	}
	for _, d := range dirs {
		if !d.IsDir() || CheckStoreName(d.Name()) != nil {
			continue
		}
		if s, ok := lookAtStore(filepath.Join(p.StoresDir, d.Name())); ok {
			seen[d.Name()] = s
		}
	}
	return seen, true, nil
}

// lookAtStore is what the store directory dir holds now; false where it
// cannot tell (gone since the listing, or a manifest it may not stat).
func lookAtStore(dir string) (storeSeen, bool) {
	fi, err := os.Lstat(dir)
	if err != nil {
		return storeSeen{}, errors.Is(err, fs.ErrNotExist)
	}
	s := storeSeen{dir: fi}
	for _, f := range []struct {
		name string
		fi   *os.FileInfo
	}{{tokens.ManifestFile, &s.manifest}, {tokens.TokensFile, &s.tokens}} {
		fi, err := os.Lstat(filepath.Join(dir, f.name))
		switch {
		case err == nil:
			*f.fi = fi
		case !errors.Is(err, fs.ErrNotExist):
			return storeSeen{}, false
		}
	}
	return s, true
}

// Check looks at the stores again and makes the status of each store that
// changed since the last look (went, came, or holds another manifest than
// an append of this process left) say what its directory holds
// (ReconcileStatuses); it returns the stores whose status changed. A store
// whose status could not be mended is tried again at the next Check, and
// its error is returned again only when it changes. After Stop, Check does
// nothing.
func (w *StoresWatch) Check(ctx context.Context) ([]Reconciled, error) {
	w.checking.Lock()
	defer w.checking.Unlock()
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return nil, nil
	}
	now, listed, err := w.p.lookAtStores(w.listed)
	if err != nil {
		err = w.fail("", err)
		w.mu.Unlock()
		return nil, err
	}
	delete(w.failed, "")
	// A store not in one of the looks is its zero value there.
	names := maps.Clone(w.seen)
	maps.Copy(names, now)
	var changed []string
	for _, name := range slices.Sorted(maps.Keys(names)) {
		if !w.seen[name].same(now[name]) {
			changed = append(changed, name)
		}
		if s, ok := now[name]; ok {
			s.damaged = w.seen[name].damaged // until a mend says otherwise
			now[name] = s
		}
	}
	w.seen, w.listed = now, listed
	w.mu.Unlock()

	var out []Reconciled
	var errs []error
	for _, name := range changed {
		r, mended, err := w.p.reconcile(ctx, name)
		w.mu.Lock()
		if s, ok := w.seen[name]; ok && err == nil {
			s.damaged = r.Damaged
			w.seen[name] = s
		}
		if err != nil {
			s := w.seen[name]
			s.again = true // looked at again at the next Check
			w.seen[name] = s
			if err := w.fail(name, err); err != nil {
				errs = append(errs, err)
			}
		} else {
			delete(w.failed, name)
		}
		w.mu.Unlock()
		if err == nil && mended {
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}

// Saw tells the watch that an append of this process to the store name
// ended: the store as it is now is its own doing, and a store made and
// deleted before the next look is noticed too.
func (w *StoresWatch) Saw(name string) {
	s, ok := lookAtStore(filepath.Join(w.p.StoresDir, name))
	w.mu.Lock()
	defer w.mu.Unlock()
	if !ok || s.manifest == nil {
		// Gone already, or cannot tell: the next Check mends its status.
		s = storeSeen{again: true}
	}
	s.damaged = w.seen[name].damaged // an append refuses a damaged store
	w.seen[name] = s
}

// Damaged returns how each store found damaged at the last look is
// damaged (StoreStatus.Damaged), by its name; nil where none is.
func (w *StoresWatch) Damaged() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out map[string]string
	for name, s := range w.seen {
		if s.damaged != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = s.damaged
		}
	}
	return out
}

// fail records err as the last error of the store name ("": of the
// listing) and returns it, or nil when it is the one recorded already.
// The caller holds w.mu.
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
	w.checking.Lock()
	defer w.checking.Unlock()
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

// Stopped says whether Stop has been called.
func (w *StoresWatch) Stopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}
