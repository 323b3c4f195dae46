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

	"github.com/kiln-lm/kiln/internal/bytesize"
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
		head := &frameHead{r: r}
		z, err := zstd.NewReader(head, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(zstdMaxWindow))
		if err != nil {
			return nil, fmt.Errorf("not zstd: %w", err)
		}
		return &zstdReader{z: z, head: head}, nil
	}
	return io.NopCloser(r), nil
}

// zstdMaxWindow is the largest window a zstd frame may declare for ingest
// to read it: its decoder holds up to that much of what it decompressed,
// for each file being read. zstd writes windows of 8 MiB by default, up to
// 128 MiB at its highest levels and 512 MiB with --long=29; a frame of a
// larger one (--long=30 or 31, 1 or 2 GiB) is skipped (SkipZstdWindow)
// rather than held.
const zstdMaxWindow = 1 << 29

// zstdReader reads a zstd stream, saying of a frame whose window is over
// zstdMaxWindow that it is (windowError) where the decoder's error would
// read as a corrupt file. It has Read alone: the decoder's WriteTo, which
// io.Copy would call in its place, would pass that by.
type zstdReader struct {
	z    *zstd.Decoder
	head *frameHead
}

func (z *zstdReader) Read(p []byte) (int, error) {
	n, err := z.z.Read(p)
	if err != nil && (errors.Is(err, zstd.ErrWindowSizeExceeded) || errors.Is(err, zstd.ErrDecoderSizeExceeded)) {
		// The same errors stand for a corrupt block's reference past
		// the window: the frame's header tells them apart.
		var h zstd.Header
		if h.Decode(z.head.b) == nil {
			window := h.WindowSize
			if h.SingleSegment {
				window = h.FrameContentSize // the whole content is the window
			}
			if window > zstdMaxWindow {
				err = &windowError{window: window}
			}
		}
	}
	return n, err
}

func (z *zstdReader) Close() error { z.z.Close(); return nil }

// frameHead keeps the first bytes read through it: the header of a zstd
// stream's first frame.
type frameHead struct {
	r io.Reader
	b []byte
}

func (f *frameHead) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if room := zstd.HeaderMaxSize - len(f.b); room > 0 {
		f.b = append(f.b, p[:min(n, room)]...)
	}
	return n, err
}

// windowError is a zstd frame that declares a window over zstdMaxWindow:
// a valid file, which a decoder of more memory would read.
type windowError struct{ window uint64 }

func (e *windowError) Error() string {
	return fmt.Sprintf("its zstd frame declares a window of %s, over the %s ingest's decoder holds for a file (a fixed limit, which bounds its memory; zstd --long=31 makes 2 GiB windows): recompress it with --long=29 or less, or without --long (zstd -dc --long=31 FILE | zstd -o NEW.zst)",
		bytesize.Format(int64(e.window)), bytesize.Format(zstdMaxWindow))
}

func (e *windowError) Unwrap() error { return zstd.ErrWindowSizeExceeded }

// streamSkip is the skip of the file named name whose decompressed stream
// failed with err, at where ("after line 3", or ""): the stream cut short
// or corrupt, or a zstd frame of a window over the decoder's limit, which
// is no fault of the file and has its own reason.
func streamSkip(name, where string, err error) *SkipError {
	var w *windowError
	if errors.As(err, &w) {
		return &SkipError{Reason: SkipZstdWindow, Path: name, Err: w}
	}
	if where != "" {
		err = fmt.Errorf("%s: %w", where, err)
	}
	return &SkipError{Reason: SkipCorruptFile, Path: name, Err: err}
}

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
			return record{}, streamSkip(r.name, fmt.Sprintf("after line %d", r.line), err)
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
