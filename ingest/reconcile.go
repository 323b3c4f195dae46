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
