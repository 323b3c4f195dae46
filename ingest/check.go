package ingest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/parquet-go/parquet-go"

	"github.com/kiln-lm/kiln/ingest/hub"
)

// CheckResult is what `sched datasets check` found.
type CheckResult struct {
	Revision string
	Files    int
	Bytes    int64
	Sample   string   // the file whose columns were read
	Format   Format   // the sample's format
	Columns  []string // its columns, when it is parquet
	// FirstDocument is the length in bytes of the sample's first document,
	// read through ingest's own reader: set for local files, which Check
	// reads whole where needed, and for a hub file of JSON lines, whose
	// head alone it reads (of a hub parquet file, the footer alone).
	FirstDocument int
	// PassedOver are the local files before Sample that an ingest would
	// take nothing from, with why: "empty", or the reason a text file is
	// skipped whole (not UTF-8, too large, an archive).
	PassedOver []string
}

// Describe says in a few words how ingest reads the sample.
func (r CheckResult) Describe(c Columns) string {
	var s string
	switch field := c.field(); r.Format {
	case FormatParquet:
		s = fmt.Sprintf("%s has columns %v", r.Sample, r.Columns)
	case FormatJSONL:
		s = fmt.Sprintf("%s is JSON lines, each line's field %q read", r.Sample, field)
	case FormatJSONArray:
		s = fmt.Sprintf("%s is a JSON array, each element's field %q read", r.Sample, field)
	default:
		s = fmt.Sprintf("%s is plain text, each file one document", r.Sample)
		if isJSON(r.Sample) {
			// The field misspelt makes a dataset's .json files text.
			s += fmt.Sprintf(" (a .json file is read as records where its first line or array element is an object holding the field %q)", field)
		}
	}
	if r.FirstDocument > 0 {
		s += fmt.Sprintf("; its first document reads %d bytes", r.FirstDocument)
	}
	if len(r.PassedOver) > 0 {
		s += fmt.Sprintf(" (passed over before it, as an ingest skips them: %s)", strings.Join(r.PassedOver, ", "))
	}
	return s
}

// Check resolves the preset's revision, lists its files and, for parquet,
// reads one file's footer through Range requests to confirm that the
// columns the preset reads are there, without downloading the file; for
// JSON lines (and a .json file), its head, whose first records must hold
// the field the preset reads.
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
	res.Format = FormatOf(f.Path)
	if p.Glob != "" {
		return res, checkLocal(ctx, p, plan.Files, &res)
	}
	size := f.Size
	if f.LFS != nil {
		size = f.LFS.Size
	}
	if jsonRecords(f.Path) && hc != nil && size > 0 {
		// Read as ingest reads it (formatOfHead): the file's head alone
		// is fetched, in one request unless a compressed file's head is
		// in more than jsonSniffBytes of it. The request is also where
		// the Hub refuses a gated dataset's token, as it refuses the
		// ingest's download.
		in := io.NewSectionReader(&rangeReader{ctx: ctx, hc: hc, repo: p.Repo, rev: plan.Revision, path: f.Path}, 0, size)
		head, err := jsonHead(bufio.NewReaderSize(in, jsonSniffBytes), f.Path)
		if err != nil {
			return res, fmt.Errorf("dataset %s: %w", p.Name, err)
		}
		res.Format = formatOfHead(f.Path, head, p.Columns)
		if res.Format == FormatJSONL {
			res.FirstDocument, err = headDocument(ctx, p, f.Path, head)
			return res, err
		}
	}
	if res.Format != FormatParquet || hc == nil {
		return res, nil
	}
	rr := &rangeReader{ctx: ctx, hc: hc, repo: p.Repo, rev: plan.Revision, path: f.Path}
	pf, err := openParquetFile(rr, size)
	if err != nil && rr.failed != nil {
		// The hub refused it (a gated dataset, a token it does not take)
		// or did not answer: no word of the file's format.
		return res, fmt.Errorf("dataset %s: reading %s: %w", p.Name, f.Path, rr.failed)
	}
	if err != nil {
		return res, fmt.Errorf("dataset %s: %s is not readable parquet: %w", p.Name, f.Path, err)
	}
	res.Columns = columnNames(pf)
	return res, requireColumns(p, f.Path, pf)
}

// requireColumns says which column the preset reads that the parquet file
// at path lacks, if any.
func requireColumns(p Preset, path string, pf *parquet.File) error {
	c := p.Columns.withDefaults()
	want := []string{c.Text}
	if c.Blob != "" {
		want = []string{c.Blob}
	}
	if c.ID != "" {
		want = append(want, c.ID)
	}
	for i, col := range want {
		leaf, ok := pf.Schema().Lookup(col)
		if !ok {
			return &PresetError{fmt.Errorf("dataset %s: %s has no column %q (columns: %v): name the columns to read with --columns (text=<column>), or fix the preset's", p.Name, path, col, columnNames(pf))}
		}
		if why := notText(leaf); i == 0 && why != "" {
			return &PresetError{fmt.Errorf("dataset %s: %s's column %q %s: name the column that holds the text with --columns text=<column>, or in the preset's columns", p.Name, path, col, why)}
		}
	}
	return nil
}

// checkLocal reads the local dataset's first document with ingest's own
// reader, so that a wrong column or field, a file that is not what its name
// says, or files of nothing but skipped records are named before any
// ingest. Empty files are passed over, up to localCheckFiles of them, as
// are text files skipped whole (one not UTF-8, too large, an archive: a
// source tree's image among its code), which an ingest skips and goes on.
func checkLocal(ctx context.Context, p Preset, files []hub.File, res *CheckResult) error {
	for _, f := range files[:min(len(files), localCheckFiles)] {
		res.Sample, res.Format = f.Path, formatOfFile(f.Path, p.Columns)
		n, err := firstDocument(ctx, p, res)
		why := "empty"
		if reason := SkipReason(err); reason != "" && res.Format == FormatText {
			why, err = reason, nil
		}
		if err != nil || n > 0 || p.Columns.Blob != "" {
			res.FirstDocument = n
			return err
		}
		res.PassedOver = append(res.PassedOver, f.Path+": "+why)
	}
	which := fmt.Sprintf("the first %d of its %d files hold no document", len(res.PassedOver), len(files))
	switch {
	case len(files) == 1:
		which = "its one file holds no document"
	case len(res.PassedOver) == len(files):
		which = fmt.Sprintf("none of its %d files holds a document", len(files))
	}
	return &PresetError{fmt.Errorf("dataset %s: %s (%s): give a glob that matches files with text",
		p.Name, which, strings.Join(res.PassedOver, ", "))}
}

// localCheckFiles bounds the files a local check passes over.
const localCheckFiles = 8

// firstDocument reads res.Sample's columns (parquet) and the length of its
// first document: 0 when the file holds none and skipped nothing.
func firstDocument(ctx context.Context, p Preset, res *CheckResult) (int, error) {
	if res.Format == FormatParquet {
		f, size, err := openNonEmpty(res.Sample, res.Sample)
		if SkipReason(err) == SkipEmptyFile {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		defer f.Close()
		pf, err := openParquetFile(f, size)
		if err != nil {
			return 0, &PresetError{fmt.Errorf("dataset %s: %s is not readable parquet: %w", p.Name, res.Sample, err)}
		}
		res.Columns = columnNames(pf)
		if err := requireColumns(p, res.Sample, pf); err != nil {
			return 0, err
		}
	}
	if p.Columns.Blob != "" {
		return 0, nil // the document would be fetched from Software Heritage
	}
	src, err := Open(ctx, res.Sample, OpenOptions{Columns: p.Columns})
	if SkipReason(err) == SkipEmptyFile {
		return 0, nil
	}
	if err != nil {
		return 0, &PresetError{fmt.Errorf("dataset %s: %w", p.Name, err)}
	}
	defer src.Close()
	doc, err := src.Next(ctx)
	if errors.Is(err, io.EOF) {
		if skipped := src.Skipped(); len(skipped) > 0 {
			return 0, &PresetError{fmt.Errorf("dataset %s: %s gave no document, every record skipped (%v): %s",
				p.Name, res.Sample, skipped, skipsRemedy(skipped, p.Columns))}
		}
		return 0, nil
	}
	if SkipReason(err) != "" {
		// The skip names the file (a text file too large or not UTF-8,
		// a corrupt one) and says why.
		return 0, &PresetError{fmt.Errorf("dataset %s: %w", p.Name, err)}
	}
	if err != nil {
		return 0, &PresetError{fmt.Errorf("dataset %s: %s: %w", p.Name, res.Sample, err)}
	}
	return len(doc.Text), nil
}

// skipsRemedy says what to do of a file none of whose records gave a
// document, skipped as skips counts: records over the size limit are
// documents too large, which no column or field would mend; any other
// skip (no text, or empty, in the field read) most often means the text is
// in another one.
func skipsRemedy(skips Skips, c Columns) string {
	size := fmt.Sprintf("a record over the %d MiB one JSON line may hold is skipped as too large (a fixed limit that bounds memory): split such documents into smaller ones, or the file into lines of less",
		MaxLineBytes>>20)
	column := fmt.Sprintf("check the field or column the text is in (%q), or name another with --columns text=<name>", c.withDefaults().Text)
	switch {
	case skips[SkipTooLarge] == 0:
		return column
	case len(skips) == 1:
		return size
	}
	return column + "; " + size
}

// headDocument reads the JSON lines of head, the head (jsonHead) of the
// hub file path, through ingest's own reader, and returns the length of
// the first document in them: a field misspelt, which an ingest would
// take for a store of skipped records, or a line that is not JSON, for
// which it would skip the file, is refused here naming the file. A head
// cut in its first line (a first record longer than jsonSniffBytes) is
// not judged.
func headDocument(ctx context.Context, p Preset, path string, head []byte) (int, error) {
	if len(head) == jsonSniffBytes {
		// The file goes on: its last line in the head is cut.
		i := bytes.LastIndexByte(head, '\n')
		if i < 0 {
			return 0, nil
		}
		head = head[:i+1]
	}
	cols := p.Columns.withDefaults()
	rows := &jsonlReader{br: bufio.NewReader(bytes.NewReader(head)), name: path, cols: cols}
	skips := Skips{}
	var firstFields []string
	for {
		rec, err := rows.next(ctx)
		if errors.Is(err, io.EOF) || SkipReason(err) == SkipEmptyFile {
			break
		}
		if err != nil {
			// The skip names the file and its line, and says why.
			return 0, &PresetError{fmt.Errorf("dataset %s: %w", p.Name, err)}
		}
		if firstFields == nil {
			firstFields = slices.Sorted(maps.Keys(rows.fields))
		}
		if cols.Blob != "" && rec.skip == "" && !rec.null {
			return 0, nil // the document would be fetched from Software Heritage
		}
		reason := recordSkip(rec)
		if reason == "" {
			return len(rec.text), nil
		}
		skips.Add(reason, 1)
	}
	if len(skips) == 0 {
		return 0, nil
	}
	key := "text"
	if cols.Blob != "" {
		key = "blob"
	}
	var n int64
	for _, c := range skips {
		n += c
	}
	lines := "its first line"
	if n > 1 {
		lines = fmt.Sprintf("the %d lines of it", n)
	}
	return 0, &PresetError{fmt.Errorf("dataset %s: %s gave no document in %s that the check read, every one skipped (%v): check the field the text is in (%q; its first line has the fields %q), or name another with --columns %s=<field>",
		p.Name, path, lines, skips, cols.field(), firstFields, key)}
}

// rangeReader reads a hub file through Range requests.
type rangeReader struct {
	ctx             context.Context
	hc              *hub.Client
	repo, rev, path string
	// failed is the hub's error of a read, where it gave one: the file
	// was not read, which says nothing of what it holds.
	failed error
}

func (r *rangeReader) ReadAt(p []byte, off int64) (int, error) {
	b, err := r.hc.ReadRange(r.ctx, r.repo, r.rev, r.path, off, int64(len(p)))
	if err != nil && r.failed == nil {
		r.failed = err
	}
	n := copy(p, b)
	if err == nil && n < len(p) {
		err = fmt.Errorf("short read of %s at %d", r.path, off)
	}
	return n, err
}
