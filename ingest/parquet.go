package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/parquet-go/parquet-go"
)

// parquetReader streams one parquet file. Each column it reads is read a
// page at a time, the small ones (ids, blob ids, encodings) row by row
// beside the text, so memory is bounded by the page size (about 1 MiB in
// the datasets kiln reads), not by the row group (often hundreds of MiB
// of text) nor by the rows it claims to hold: a count the file gives sizes
// nothing (a row group claiming 2^33 rows ends at its last value, a
// corrupt file).
type parquetReader struct {
	f    *os.File
	pf   *parquet.File
	path string
	name string

	text              int // leaf index of the text column, -1 when blobs are read instead
	id, blob, encName int // leaf indexes of the small columns, -1 when absent

	rg        int // next row group to open
	base      int64
	rows, pos int64

	// The current row group's columns, nil where not read.
	textCol, idCol, blobCol, encCol *columnCursor
}

func openParquet(path string, opt OpenOptions) (*parquetReader, error) {
	f, size, err := openNonEmpty(path, opt.Name)
	if err != nil {
		return nil, err
	}
	pf, err := openParquetFile(f, size)
	if err != nil {
		f.Close()
		if !errors.As(err, new(*footerError)) {
			err = fmt.Errorf("not a readable parquet file: %w", err)
		}
		return nil, &SkipError{Reason: SkipCorruptFile, Path: opt.Name, Err: err}
	}
	r := &parquetReader{f: f, pf: pf, path: path, name: opt.Name, text: -1, id: -1, blob: -1, encName: -1}
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

// openParquetFile reads the footer of the parquet file r (size bytes),
// every reader of one (ingest's, datasets check's local and hub ones)
// through here: a footer that claims more than its bytes hold is a
// *footerError before the library sizes anything by it (checkParquetFooter),
// and one whose damage makes the library panic is an error like any other.
func openParquetFile(r io.ReaderAt, size int64) (pf *parquet.File, err error) {
	tail, err := checkParquetFooter(r, size)
	if err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			pf, err = nil, fmt.Errorf("its footer: %v", p)
		}
	}()
	if tail != nil {
		c := &footerCache{ReaderAt: r, off: size - int64(len(tail)), tail: tail}
		// The library keeps the reader for the pages: the tail is not
		// held past the footer's decoding.
		defer func() { c.tail = nil }()
		r = c
	}
	return parquet.OpenFile(r, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true))
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
		rg: g, base: base}
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
	if r.textCol != nil {
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
	null := true
	if r.idCol != nil {
		if rec.id, null, err = r.nextSmall(r.idCol); err != nil {
			return record{}, err
		}
	}
	if null {
		rec.id = r.name + "#" + strconv.FormatInt(r.base+row, 10)
	}
	if r.blobCol != nil {
		if rec.blob, rec.null, err = r.nextSmall(r.blobCol); err != nil {
			return record{}, err
		}
		rec.id = rec.blob
	}
	if r.encCol != nil {
		if rec.encoding, _, err = r.nextSmall(r.encCol); err != nil {
			return record{}, err
		}
	}
	r.pos++
	if r.pos == r.rows {
		// Each small column holds a value a row, as the text does.
		for _, c := range []*columnCursor{r.idCol, r.blobCol, r.encCol} {
			if c == nil {
				continue
			}
			if _, err := c.next(); !errors.Is(err, io.EOF) {
				if err == nil {
					err = fmt.Errorf("column %q has more values than its %d rows", r.columnName(c), r.rows)
				}
				return record{}, r.corrupt(fmt.Errorf("row group %d: %w", r.rg-1, err))
			}
		}
	}
	return rec, nil
}

// openRowGroup moves to the next row group and opens the pages of its
// columns.
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
	chunks := g.ColumnChunks()
	open := func(col int) *columnCursor {
		if col < 0 {
			return nil
		}
		return &columnCursor{col: col, pages: chunks[col].Pages()}
	}
	r.textCol, r.idCol, r.blobCol, r.encCol = open(r.text), open(r.id), open(r.blob), open(r.encName)
	return nil
}

// nextText returns the next value of the text column.
func (r *parquetReader) nextText() (parquet.Value, error) {
	v, err := r.textCol.next()
	if errors.Is(err, io.EOF) {
		return parquet.Value{}, r.corrupt(fmt.Errorf("row group %d ended after %d of %d rows", r.rg-1, r.pos, r.rows))
	}
	if err != nil {
		return parquet.Value{}, r.corrupt(err)
	}
	return v, nil
}

// nextSmall returns the current row's value of a small column as text,
// and whether it is null.
func (r *parquetReader) nextSmall(c *columnCursor) (string, bool, error) {
	v, err := c.next()
	if errors.Is(err, io.EOF) {
		err = fmt.Errorf("column %q has %d values for %d rows", r.columnName(c), r.pos, r.rows)
	}
	if err != nil {
		return "", false, r.corrupt(fmt.Errorf("row group %d: %w", r.rg-1, err))
	}
	if v.IsNull() {
		return "", true, nil
	}
	return v.String(), false, nil
}

func (r *parquetReader) columnName(c *columnCursor) string {
	return strings.Join(r.pf.Schema().Columns()[c.col], ".")
}

// columnCursor reads one column chunk's values a page at a time.
type columnCursor struct {
	col   int // the column's leaf index
	pages parquet.Pages
	page  parquet.Page
	vr    parquet.ValueReader
	vals  [256]parquet.Value
	vi    int
	vn    int
}

// next returns the chunk's next value, or io.EOF after its last. A byte
// array value points into the page, valid until the next call.
func (c *columnCursor) next() (parquet.Value, error) {
	if c.vi >= c.vn {
		return c.fill()
	}
	c.vi++
	return c.vals[c.vi-1], nil
}

// fill is next where the values read are done: it reads more, from the
// next page where the page is done.
func (c *columnCursor) fill() (parquet.Value, error) {
	for c.vi >= c.vn {
		if c.vr != nil {
			n, err := c.vr.ReadValues(c.vals[:])
			c.vi, c.vn = 0, n
			if n > 0 {
				continue
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return parquet.Value{}, err
			}
			parquet.Release(c.page)
			c.page, c.vr = nil, nil
		}
		p, err := c.pages.ReadPage()
		if err != nil {
			return parquet.Value{}, err
		}
		c.page, c.vr = p, p.Values()
	}
	c.vi++
	return c.vals[c.vi-1], nil
}

func (c *columnCursor) close() {
	if c == nil {
		return
	}
	if c.page != nil {
		parquet.Release(c.page)
		c.page, c.vr = nil, nil
	}
	c.pages.Close()
}

func (r *parquetReader) closePages() {
	for _, c := range []*columnCursor{r.textCol, r.idCol, r.blobCol, r.encCol} {
		c.close()
	}
	r.textCol, r.idCol, r.blobCol, r.encCol = nil, nil, nil, nil
}

func (r *parquetReader) Close() error {
	r.closePages()
	return r.f.Close()
}
