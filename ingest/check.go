package ingest

import (
	"context"
	"fmt"

	"github.com/parquet-go/parquet-go"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// CheckResult is what `sched datasets check` found.
type CheckResult struct {
	Revision string
	Files    int
	Bytes    int64
	Sample   string   // the file whose columns were read
	Columns  []string // its columns, when it is parquet
}

// Check resolves the preset's revision, lists its files and, for parquet,
// reads one file's footer through Range requests to confirm that the
// columns the preset reads are there, without downloading the file.
func Check(ctx context.Context, p Preset, hc *hub.Client) (CheckResult, error) {
	plan, err := Plan(ctx, p, hc, 0)
	if err != nil {
		return CheckResult{}, err
	}
	res := CheckResult{Revision: plan.Revision, Files: len(plan.Files)}
	for _, f := range plan.Files {
		res.Bytes += f.Size
	}
	f := plan.Files[0]
	res.Sample = f.Path
	if FormatOf(f.Path) != FormatParquet || hc == nil {
		return res, nil
	}
	size := f.Size
	if f.LFS != nil {
		size = f.LFS.Size
	}
	pf, err := parquet.OpenFile(&rangeReader{ctx: ctx, hc: hc, repo: p.Repo, rev: plan.Revision, path: f.Path}, size,
		parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
	if err != nil {
		return res, fmt.Errorf("dataset %s: %s is not readable parquet: %w", p.Name, f.Path, err)
	}
	res.Columns = columnNames(pf)
	c := p.Columns.withDefaults()
	want := []string{c.Text}
	if c.Blob != "" {
		want = []string{c.Blob}
	}
	if c.ID != "" {
		want = append(want, c.ID)
	}
	for _, col := range want {
		if _, ok := pf.Schema().Lookup(col); !ok {
			return res, &PresetError{fmt.Errorf("dataset %s: %s has no column %q (columns: %v): fix the preset's columns", p.Name, f.Path, col, res.Columns)}
		}
	}
	return res, nil
}

// rangeReader reads a hub file through Range requests.
type rangeReader struct {
	ctx             context.Context
	hc              *hub.Client
	repo, rev, path string
}

func (r *rangeReader) ReadAt(p []byte, off int64) (int, error) {
	b, err := r.hc.ReadRange(r.ctx, r.repo, r.rev, r.path, off, int64(len(p)))
	n := copy(p, b)
	if err == nil && n < len(p) {
		err = fmt.Errorf("short read of %s at %d", r.path, off)
	}
	return n, err
}
