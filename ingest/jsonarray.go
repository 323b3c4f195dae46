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
	"unicode/utf8"
)

// jsonArrayReader reads a .json file that holds one JSON array of objects
// (FormatJSONArray), an element at a time, as JSON lines are read a line
// at a time: the file, of any size, is never held whole, and a compressed
// one (.json.gz, .json.zst) is streamed through its decompressor. Each
// element is a record, numbered from 0 as JSON lines are, so that
// OpenOptions.From passes over a part already taken. An element is read
// as a JSON line: one that is not UTF-8 is skipped as invalid-utf8, a
// null as an empty document, a field that is not a string is read as its
// JSON text, and one that is not a JSON object ends the file as corrupt,
// as such a line does. So does an array cut short or malformed part-way,
// or its compressed stream cut short or corrupt: the file is skipped as
// corrupt and its shard not made, and the store keeps what earlier files
// (or an earlier part of this one) put in it. An element over
// MaxLineBytes ends the file, skipped as too-large, where such a line is
// passed over alone: the decoder holds an element whole to find its end,
// so it is stopped there rather than hold more.
type jsonArrayReader struct {
	f      *os.File
	z      io.Closer // the decompressor, a no-op for a plain file (decompressed)
	in     *elementBound
	dec    *json.Decoder
	name   string
	cols   Columns
	n      int64 // the elements read
	begun  bool  // the array's '[' was read
	done   bool  // its ']' was
	raw    json.RawMessage
	fields map[string]json.RawMessage
}

func openJSONArray(path string, opt OpenOptions) (*jsonArrayReader, error) {
	f, z, err := openDecompressed(path, opt.Name)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(z, 1<<20)
	if bom, _ := br.Peek(3); bytes.Equal(bom, []byte("\uFEFF")) {
		// As a JSON line's: some editors and Windows tools write it.
		br.Discard(3)
	}
	in := &elementBound{r: br, max: MaxLineBytes}
	in.from(0)
	return &jsonArrayReader{f: f, z: z, in: in, dec: json.NewDecoder(in), name: opt.Name, cols: opt.Columns}, nil
}

func (r *jsonArrayReader) next(ctx context.Context) (record, error) {
	if r.done {
		return record{}, io.EOF
	}
	if !r.begun {
		tok, err := r.dec.Token()
		if err == nil && tok != json.Delim('[') {
			// The file changed since its head was read (jsonFormat).
			err = fmt.Errorf("not a JSON array: it begins with %v", tok)
		}
		if err != nil {
			return record{}, r.corrupt(err)
		}
		r.begun = true
	}
	r.in.from(r.dec.InputOffset())
	if !r.dec.More() {
		return record{}, r.end()
	}
	if err := r.dec.Decode(&r.raw); err != nil {
		return record{}, r.corrupt(err)
	}
	r.n++
	id := r.name + "#" + strconv.FormatInt(r.n-1, 10)
	if !utf8.Valid(r.raw) {
		// encoding/json would quietly turn bad bytes into U+FFFD.
		return record{skip: SkipInvalidUTF8, id: id}, nil
	}
	clear(r.fields)
	if err := json.Unmarshal(r.raw, &r.fields); err != nil {
		return record{}, &SkipError{Reason: SkipCorruptFile, Path: r.name, Err: fmt.Errorf("element %d of the array is not a JSON object: %w", r.n, err)}
	}
	return jsonRecord(r.fields, r.cols, id), nil
}

// end reads the array's ']' and what follows it, which must be nothing
// but space: a file cut short between two elements ends without its ']'.
func (r *jsonArrayReader) end() error {
	if tok, err := r.dec.Token(); err != nil || tok != json.Delim(']') {
		return r.corrupt(err)
	}
	if tok, err := r.dec.Token(); !errors.Is(err, io.EOF) {
		return r.corrupt(fmt.Errorf("more after the array's end (%v, %v)", tok, err))
	}
	r.done = true
	if r.n == 0 {
		return &SkipError{Reason: SkipEmptyFile, Path: r.name, Err: errors.New("an empty array")}
	}
	return io.EOF
}

// corrupt is the error that ends the file at err, met after the elements
// read so far.
func (r *jsonArrayReader) corrupt(err error) error {
	if errors.Is(err, io.EOF) {
		// The array is cut short, and the error is no end of the
		// documents (Drain).
		err = io.ErrUnexpectedEOF
	}
	if errors.Is(err, errElementTooLarge) {
		return &SkipError{Reason: SkipTooLarge, Path: r.name, Err: fmt.Errorf("element %d of the array is over %d MiB", r.n+1, r.in.max>>20)}
	}
	return &SkipError{Reason: SkipCorruptFile, Path: r.name, Err: fmt.Errorf("after element %d of the array: %w", r.n, err)}
}

func (r *jsonArrayReader) Close() error {
	r.z.Close()
	return r.f.Close()
}

// errElementTooLarge is what elementBound answers past its bound.
var errElementTooLarge = errors.New("a JSON array's element is past the size bound")

// elementBound is a JSON array's reader as its decoder sees it: it
// refuses to read more than max bytes (and a comma) from where the last
// element ended, so that the decoder, which buffers an element whole
// before decoding it, holds no more.
type elementBound struct {
	r    io.Reader
	max  int64
	read int64 // the bytes handed to the decoder
	stop int64 // read may not pass it
}

// from bounds the next element, which begins after offset at (the
// decoder's InputOffset).
func (b *elementBound) from(at int64) { b.stop = at + b.max + 1 }

func (b *elementBound) Read(p []byte) (int, error) {
	room := b.stop - b.read
	if room <= 0 {
		return 0, errElementTooLarge
	}
	if int64(len(p)) > room {
		p = p[:room]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}
