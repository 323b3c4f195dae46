package ingest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// MaxLineBytes bounds one JSON line (one document). A line past it is
// skipped as too-large rather than held in memory.
const MaxLineBytes = 64 << 20

// jsonlReader reads JSON lines, plain or compressed, one line at a time.
type jsonlReader struct {
	f      *os.File
	dec    io.Closer // the decompressor, a no-op for a plain file (decompressed)
	br     *bufio.Reader
	name   string
	cols   Columns
	line   int64
	buf    []byte
	fields map[string]json.RawMessage
}

func openJSONL(path string, opt OpenOptions) (*jsonlReader, error) {
	f, in, err := openDecompressed(path, opt.Name)
	if err != nil {
		return nil, err
	}
	return &jsonlReader{f: f, dec: in, br: bufio.NewReaderSize(in, 1<<20), name: opt.Name, cols: opt.Columns}, nil
}

// openDecompressed opens the file at path (name, in its dataset) and
// reads it through its decompressor (decompressed): a stream that is not
// what its name says is the file skipped as corrupt.
func openDecompressed(path, name string) (*os.File, io.ReadCloser, error) {
	f, _, err := openNonEmpty(path, name)
	if err != nil {
		return nil, nil, err
	}
	z, err := decompressed(f, path)
	if err != nil {
		f.Close()
		return nil, nil, &SkipError{Reason: SkipCorruptFile, Path: name, Err: err}
	}
	return f, z, nil
}

// decompressed reads r's bytes as the file named name holds them: through
// gzip for a .gz name, zstd for a .zst one, as they are for any other.
// Close closes the decompressor, not r. The error is r's header not being
// the compressor's.
func decompressed(r io.Reader, name string) (io.ReadCloser, error) {
	switch {
	case strings.HasSuffix(name, ".gz"):
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, fmt.Errorf("not gzip: %w", err)
		}
		return z, nil
	case strings.HasSuffix(name, ".zst"):
		// One decoder goroutine: the cores are the tokenizer's.
		z, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, fmt.Errorf("not zstd: %w", err)
		}
		return zstdCloser{z}, nil
	}
	return io.NopCloser(r), nil
}

type zstdCloser struct{ *zstd.Decoder }

func (z zstdCloser) Close() error { z.Decoder.Close(); return nil }

// readLine returns the next line without its newline. A line longer than
// MaxLineBytes is consumed and reported with tooLarge set.
func (r *jsonlReader) readLine() (line []byte, tooLarge bool, err error) {
	r.buf = r.buf[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		if len(r.buf)+len(chunk) <= MaxLineBytes {
			r.buf = append(r.buf, chunk...)
		} else {
			tooLarge = true
		}
		switch {
		case err == nil:
			return bytes.TrimRight(r.buf, "\r\n"), tooLarge, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			if len(r.buf) == 0 && !tooLarge {
				return nil, false, io.EOF
			}
			return r.buf, tooLarge, nil
		default:
			return nil, false, err
		}
	}
}

func (r *jsonlReader) next(ctx context.Context) (record, error) {
	for {
		line, tooLarge, err := r.readLine()
		if errors.Is(err, io.EOF) {
			if r.line == 0 {
				return record{}, &SkipError{Reason: SkipEmptyFile, Path: r.name, Err: errors.New("no lines")}
			}
			return record{}, io.EOF
		}
		if err != nil {
			// A truncated or corrupt compressed stream surfaces here.
			return record{}, &SkipError{Reason: SkipCorruptFile, Path: r.name, Err: fmt.Errorf("after line %d: %w", r.line, err)}
		}
		if r.line == 0 {
			// A byte-order mark, which some editors and Windows tools
			// write first: not part of the JSON.
			line = bytes.TrimPrefix(line, []byte("\uFEFF"))
		}
		r.line++
		if tooLarge {
			return record{skip: SkipTooLarge, id: r.lineID()}, nil
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if !utf8.Valid(line) {
			// encoding/json would quietly turn bad bytes into U+FFFD.
			return record{skip: SkipInvalidUTF8, id: r.lineID()}, nil
		}
		clear(r.fields)
		if err := json.Unmarshal(line, &r.fields); err != nil {
			return record{}, &SkipError{Reason: SkipCorruptFile, Path: r.name, Err: fmt.Errorf("line %d is not a JSON object: %w", r.line, err)}
		}
		return jsonRecord(r.fields, r.cols, r.lineID()), nil
	}
}

func (r *jsonlReader) lineID() string { return r.name + "#" + strconv.FormatInt(r.line-1, 10) }

// jsonRecord is the record of a JSON object's fields, as cols reads them:
// a JSON line's or a JSON array's element alike. id names it where cols
// names no id field, or the field is empty.
func jsonRecord(fields map[string]json.RawMessage, cols Columns, id string) record {
	rec := record{id: id}
	if cols.ID != "" {
		if id, ok := jsonString(fields, cols.ID); ok && id != "" {
			rec.id = id
		}
	}
	if cols.Blob != "" {
		rec.blob, _ = jsonString(fields, cols.Blob)
		rec.encoding, _ = jsonString(fields, cols.Encoding)
		rec.id = rec.blob
		rec.null = rec.blob == ""
		return rec
	}
	text, ok := jsonString(fields, cols.Text)
	if !ok {
		rec.null = true
	} else {
		rec.text = []byte(text)
	}
	return rec
}

// jsonString returns a string field; a number is given as its text.
func jsonString(fields map[string]json.RawMessage, field string) (string, bool) {
	raw, ok := fields[field]
	if !ok || string(raw) == "null" {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return string(raw), true
	}
	return s, true
}

func (r *jsonlReader) Close() error {
	r.dec.Close()
	return r.f.Close()
}
