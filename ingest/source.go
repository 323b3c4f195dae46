// Package ingest turns dataset files into token shards: it reads parquet,
// JSON lines (plain, gzip, zstd), JSON arrays, plain text and Software
// Heritage blobs as streams of documents, tokenizes them on all cores, and
// hands the shards to the token store's appender.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"unicode/utf8"
)

// Document is one training document.
type Document struct {
	// ID names the document within its dataset: an id column's value, or
	// "<file>#<row>" when there is none.
	ID   string
	Text string
}

// Source yields a file's documents one at a time. Next returns io.EOF after
// the last one. A Source holds at most a page (parquet), a line (JSON
// lines) or an element (a JSON array) of text at a time, whatever the
// file's size.
type Source interface {
	Next(ctx context.Context) (Document, error)
	// Skipped counts the records skipped so far, by reason.
	Skipped() Skips
	Close() error
}

// record is one row of a file before it becomes a Document: either its text,
// or the reference of a Software Heritage blob that holds the text.
type record struct {
	id       string
	text     []byte // valid until the next call to next
	blob     string
	encoding string
	null     bool
	skip     string // set when the reader already knows the record is skipped
}

// recordReader is what each file format implements.
type recordReader interface {
	next(ctx context.Context) (record, error)
	Close() error
}

// textSource turns a recordReader's text records into checked Documents.
type textSource struct {
	r     recordReader
	skips Skips
	// from is the first record read (OpenOptions.From); at is the next
	// record's index.
	from, at int64
	log      skipLog
}

func (s *textSource) Next(ctx context.Context) (Document, error) {
	for {
		rec, err := s.r.next(ctx)
		if err != nil {
			return Document{}, err
		}
		at := s.at
		s.at++
		if at < s.from {
			continue
		}
		if reason := recordSkip(rec); reason != "" {
			s.skips.Add(reason, 1)
			s.log.add(at, reason)
			continue
		}
		return Document{ID: rec.id, Text: string(rec.text)}, nil
	}
}

func (s *textSource) Skipped() Skips       { return s.skips }
func (s *textSource) SkippedAt() []SkipRun { return s.log }
func (s *textSource) Close() error         { return s.r.Close() }

// Reasons a record or a file is skipped. They are counted per reason and
// recorded in the token store's manifest.
const (
	SkipInvalidUTF8     = "invalid-utf8"     // a document's text is not UTF-8 (a text file's: the file)
	SkipEmptyDocument   = "empty-document"   // a document with no text (or a null)
	SkipTooLarge        = "too-large"        // a line, blob or text file past the size limit
	SkipUnknownEncoding = "unknown-encoding" // a Software Heritage src_encoding we cannot decode
	SkipMissingBlob     = "swh-missing"      // Software Heritage answered NoSuchKey
	SkipCorruptFile     = "corrupt-file"     // a file that cannot be decoded (bad parquet, truncated zstd)
	SkipEmptyFile       = "empty-file"       // a file with no documents at all, or none that could be taken
	SkipUnsafePath      = "unsafe-path"      // a listed path that would leave the data directory
	SkipMissingColumn   = "missing-column"   // the preset's text column is not in the file
	SkipLongWord        = "long-word"        // a document with a word over tokenizer.DefaultMaxWordBytes (1 MiB)
	SkipArchive         = "archive"          // a compressed file read as text that holds a tar archive (.tar.gz)
	SkipZstdWindow      = "zstd-window"      // a zstd file whose frame's window is over the decoder's 512 MiB (zstd --long=30, 31)
)

// Skips counts skipped records and files by reason. It is not safe for
// concurrent use; each Source owns one.
type Skips map[string]int64

// Add counts n more skips for reason.
func (s Skips) Add(reason string, n int64) {
	if n != 0 {
		s[reason] += n
	}
}

// Merge adds every count of o to s.
func (s Skips) Merge(o Skips) {
	for k, v := range o {
		s.Add(k, v)
	}
}

// String is "reason=n, ..." in a stable order, for messages.
func (s Skips) String() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(s)) {
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, s[k])
	}
	return b.String()
}

// SkipError says that a whole file was skipped, and why. It is permanent:
// retrying the same file gives the same answer.
type SkipError struct {
	Reason string
	Path   string
	Err    error
}

func (e *SkipError) Error() string {
	return fmt.Sprintf("%s: skipped (%s): %v", e.Path, e.Reason, e.Err)
}

func (e *SkipError) Unwrap() error { return e.Err }

// SkipReason returns the reason of a SkipError in err's chain, or "".
func SkipReason(err error) string {
	var s *SkipError
	if errors.As(err, &s) {
		return s.Reason
	}
	return ""
}

// checkText applies the per-document checks shared by every format. It
// returns the reason to skip the document, or "" to keep it.
func checkText(text []byte) string {
	switch {
	case len(text) == 0:
		return SkipEmptyDocument
	case !utf8.Valid(text):
		return SkipInvalidUTF8
	}
	return ""
}

// Drain reads every document of src, calling fn for each; it stops at the
// first error of src, of fn, or of ctx.
func Drain(ctx context.Context, src Source, fn func(Document) error) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := src.Next(ctx)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(d); err != nil {
			return err
		}
	}
}

// openNonEmpty opens a downloaded file for a source; an empty one is
// skipped and counted, not an error.
func openNonEmpty(path, name string) (*os.File, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	if st.Size() == 0 {
		f.Close()
		return nil, 0, &SkipError{Reason: SkipEmptyFile, Path: name, Err: errors.New("the file is empty")}
	}
	return f, st.Size(), nil
}
