package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/parquet-go/parquet-go"
)

// parquetReader streams one parquet file. The text column is read a page at
// a time, so memory is bounded by the page size (about 1 MiB in the datasets
// kiln reads), not by the row group (often hundreds of MiB of text). The
// small columns (ids, blob ids, encodings) are read a row group at a time.
type parquetReader struct {
	f    *os.File
	pf   *parquet.File
	path string
	name string

	text              int // leaf index of the text column, -1 when blobs are read instead
	id, blob, encName int // leaf indexes of the small columns, -1 when absent

	rg         int // next row group to open
	base       int64
	rows, pos  int64
	small      map[int][]string // the small columns of the current row group
	smallNulls map[int][]bool

	pages parquet.Pages
	page  parquet.Page
	vr    parquet.ValueReader
	vals  []parquet.Value
	vi    int
	vn    int
}

func openParquet(path string, opt OpenOptions) (*parquetReader, error) {
	f, size, err := openNonEmpty(path, opt.Name)
	if err != nil {
		return nil, err
	}
	pf, err := openParquetFile(f, size)
	if err != nil {
		f.Close()
		return nil, &SkipError{Reason: SkipCorruptFile, Path: opt.Name, Err: fmt.Errorf("not a readable parquet file: %w", err)}
	}
	r := &parquetReader{f: f, pf: pf, path: path, name: opt.Name, text: -1, id: -1, blob: -1, encName: -1,
		vals: make([]parquet.Value, 256)}
	lookup := func(col string, required, text bool) (int, error) {
		if col == "" {
			return -1, nil
		}
		leaf, ok := pf.Schema().Lookup(col)
		if !ok {
			if !required {
				return -1, nil
			}
			return -1, &SkipError{Reason: SkipMissingColumn, Path: opt.Name, Err: fmt.Errorf("no column %q (columns: %v)", col, columnNames(pf))}
		}
		if text {
			if why := notText(leaf); why != "" {
				return -1, &SkipError{Reason: SkipMissingColumn, Path: opt.Name, Err: fmt.Errorf("column %q %s", col, why)}
			}
		}
		return leaf.ColumnIndex, nil
	}
	c := opt.Columns
	if c.Blob != "" {
		r.blob, err = lookup(c.Blob, true, true)
	} else {
		r.text, err = lookup(c.Text, true, true)
	}
	if err == nil {
		// An id may be a number (many datasets' is an int64): it is
		// read as its decimal text.
		r.id, err = lookup(c.ID, true, false)
	}
	if err == nil {
		// The encoding column is optional: python-edu has none and is UTF-8.
		r.encName, err = lookup(c.Encoding, false, true)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// notText says why a column cannot be read as text ("" when it can): its
// values are not byte arrays (an INT64 column), which the text, blob and
// encoding columns must be.
func notText(leaf parquet.LeafColumn) string {
	if k := leaf.Node.Type().Kind(); k != parquet.ByteArray && k != parquet.FixedLenByteArray {
		return fmt.Sprintf("holds %s values, not text", k)
	}
	return ""
}

// openParquetFile reads the file's footer; a footer whose damage makes the
// library panic is an error like any other.
func openParquetFile(f *os.File, size int64) (pf *parquet.File, err error) {
	defer func() {
		if p := recover(); p != nil {
			pf, err = nil, fmt.Errorf("its footer: %v", p)
		}
	}()
	return parquet.OpenFile(f, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
}

func columnNames(pf *parquet.File) []string {
	var names []string
	for _, f := range pf.Schema().Fields() {
		names = append(names, f.Name())
	}
	return names
}

// cursor is a reader of row group g alone, whose first row is row base of
// the file, for a decoder of its own: it shares the open file (read at
// offsets, which is safe from several goroutines) but no page state. The
// caller closes its pages, not the file.
func (r *parquetReader) cursor(g int, base int64) *parquetReader {
	return &parquetReader{f: r.f, pf: r.pf, path: r.path, name: r.name, text: r.text, id: r.id, blob: r.blob, encName: r.encName,
		rg: g, base: base, vals: make([]parquet.Value, len(r.vals))}
}

func (r *parquetReader) corrupt(err error) error {
	return &SkipError{Reason: SkipCorruptFile, Path: r.name, Err: err}
}

// recoverCorrupt turns a panic of the parquet library into the file's
// corrupt-file skip: the library trusts the sizes a page header gives, and
// a damaged one (a negative length, an offset past the page) would end the
// whole process, every task of the worker with it. Deferred by the methods
// that read pages, with their error result.
func (r *parquetReader) recoverCorrupt(err *error) {
	if p := recover(); p != nil {
		*err = r.corrupt(fmt.Errorf("row group %d: unreadable page (%v)", max(r.rg-1, 0), p))
	}
}

func (r *parquetReader) next(ctx context.Context) (rec record, err error) {
	defer r.recoverCorrupt(&err)
	for r.pos >= r.rows {
		if err := r.openRowGroup(ctx); err != nil {
			return record{}, err
		}
	}
	row := r.pos
	if r.text >= 0 {
		v, err := r.nextText()
		if err != nil {
			return record{}, err
		}
		if v.IsNull() {
			rec.null = true
		} else {
			rec.text = v.ByteArray()
		}
	}
	r.pos++
	if r.id >= 0 && !r.smallNulls[r.id][row] {
		rec.id = r.small[r.id][row]
	} else {
		rec.id = r.name + "#" + strconv.FormatInt(r.base+row, 10)
	}
	if r.blob >= 0 {
		rec.blob, rec.null = r.small[r.blob][row], r.smallNulls[r.blob][row]
		rec.id = rec.blob
	}
	if r.encName >= 0 {
		rec.encoding = r.small[r.encName][row]
	}
	return rec, nil
}

// openRowGroup moves to the next row group and reads its small columns.
func (r *parquetReader) openRowGroup(ctx context.Context) (err error) {
	defer r.recoverCorrupt(&err)
	if err := ctx.Err(); err != nil {
		return err
	}
	r.closePages()
	groups := r.pf.RowGroups()
	if r.rg >= len(groups) {
		return io.EOF
	}
	g := groups[r.rg]
	r.rg++
	r.base += r.rows
	r.rows, r.pos = g.NumRows(), 0
	r.small, r.smallNulls = map[int][]string{}, map[int][]bool{}
	for _, col := range []int{r.id, r.blob, r.encName} {
		if col < 0 {
			continue
		}
		vals, nulls, err := readSmallColumn(g.ColumnChunks()[col], r.rows)
		if err != nil {
			return r.corrupt(fmt.Errorf("row group %d: %w", r.rg-1, err))
		}
		r.small[col], r.smallNulls[col] = vals, nulls
	}
	if r.text >= 0 {
		r.pages = g.ColumnChunks()[r.text].Pages()
	}
	return nil
}

// nextText returns the next value of the text column, reading pages as needed.
func (r *parquetReader) nextText() (parquet.Value, error) {
	for r.vi >= r.vn {
		if r.vr != nil {
			n, err := r.vr.ReadValues(r.vals)
			r.vi, r.vn = 0, n
			if n > 0 {
				continue
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return parquet.Value{}, r.corrupt(err)
			}
			parquet.Release(r.page)
			r.page, r.vr = nil, nil
		}
		p, err := r.pages.ReadPage()
		if errors.Is(err, io.EOF) {
			return parquet.Value{}, r.corrupt(fmt.Errorf("row group %d ended after %d of %d rows", r.rg-1, r.pos, r.rows))
		}
		if err != nil {
			return parquet.Value{}, r.corrupt(err)
		}
		r.page, r.vr = p, p.Values()
	}
	v := r.vals[r.vi]
	r.vi++
	return v, nil
}

func readSmallColumn(cc parquet.ColumnChunk, rows int64) ([]string, []bool, error) {
	pages := cc.Pages()
	defer pages.Close()
	vals := make([]string, 0, rows)
	nulls := make([]bool, 0, rows)
	buf := make([]parquet.Value, 1024)
	for {
		p, err := pages.ReadPage()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		vr := p.Values()
		for {
			n, err := vr.ReadValues(buf)
			for _, v := range buf[:n] {
				nulls = append(nulls, v.IsNull())
				if v.IsNull() {
					vals = append(vals, "")
				} else {
					vals = append(vals, v.String())
				}
			}
			if errors.Is(err, io.EOF) || (err == nil && n == 0) {
				break
			}
			if err != nil {
				parquet.Release(p)
				return nil, nil, err
			}
		}
		parquet.Release(p)
	}
	if int64(len(vals)) != rows {
		return nil, nil, fmt.Errorf("a column has %d values for %d rows", len(vals), rows)
	}
	return vals, nulls, nil
}

func (r *parquetReader) closePages() {
	if r.page != nil {
		parquet.Release(r.page)
		r.page, r.vr = nil, nil
	}
	r.vi, r.vn = 0, 0
	if r.pages != nil {
		r.pages.Close()
		r.pages = nil
	}
}

func (r *parquetReader) Close() error {
	r.closePages()
	return r.f.Close()
}
