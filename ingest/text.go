package ingest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"
)

// MaxTextFileBytes bounds a plain text file, which is one document: a file
// past it is skipped as too-large rather than held in memory.
const MaxTextFileBytes = 64 << 20

// textReader yields a plain text file as one document: a compressed one
// (compressedText: .txt.gz, a config gzipped in a source tree)
// decompressed, any other file as its bytes are. The document is the file,
// so one that would be skipped (too large, not UTF-8) skips the file, for
// that reason: counted as a skipped document, the file would be recorded as
// one of no documents at all (empty-file).
type textReader struct {
	f    *os.File
	in   io.Reader // f, or its decompressor
	z    io.Closer // the decompressor; nil where f is read as it is
	size int64     // f's size; 0 where it is decompressed
	name string
	done bool
}

func openText(path string, opt OpenOptions) (Source, error) {
	r := &textReader{name: opt.Name}
	var err error
	if compressedText(path) {
		var z io.ReadCloser
		r.f, z, err = openDecompressed(path, opt.Name)
		r.in, r.z = z, z
	} else {
		r.f, r.size, err = openNonEmpty(path, opt.Name)
		r.in = r.f
	}
	if err != nil {
		return nil, err
	}
	return &textSource{r: r, skips: Skips{}, from: opt.From}, nil
}

func (r *textReader) next(ctx context.Context) (record, error) {
	if r.done {
		return record{}, io.EOF
	}
	r.done = true
	if r.size > MaxTextFileBytes {
		return record{}, r.tooLarge(fmt.Sprintf("it is %d bytes, over", r.size))
	}
	in := r.in
	compressed := r.z != nil
	if compressed {
		// A tar archive compressed (src.tar.gz, or a .gz that holds one
		// under another name) is files and their headers, not a text:
		// told by its first header's magic, before the rest is read.
		br := bufio.NewReaderSize(r.in, 4096)
		if head, _ := br.Peek(tarHeader); isTar(head) {
			return record{}, &SkipError{Reason: SkipArchive, Path: r.name, Err: errors.New("it holds a tar archive (its first header says so), not text")}
		}
		in = br
	}
	b, err := io.ReadAll(io.LimitReader(in, MaxTextFileBytes+1))
	switch {
	case err != nil && compressed:
		// A compressed stream cut short or corrupt, as in JSON lines
		// (or of a zstd window too large to read).
		return record{}, streamSkip(r.name, "", err)
	case err != nil:
		return record{}, fmt.Errorf("reading %s: %w", r.name, err)
	case len(b) > MaxTextFileBytes && compressed:
		return record{}, r.tooLarge("it decompresses to over")
	case len(b) > MaxTextFileBytes:
		// Grown past the limit since it was opened.
		return record{}, r.tooLarge("it is over")
	case len(b) == 0 && compressed:
		return record{}, &SkipError{Reason: SkipEmptyFile, Path: r.name, Err: errors.New("the file decompresses to nothing")}
	case !utf8.Valid(b):
		return record{}, &SkipError{Reason: SkipInvalidUTF8, Path: r.name,
			Err: errors.New("it is not UTF-8 text (a binary file, or text in another encoding such as Latin-1 or UTF-16): convert it to UTF-8 to ingest it")}
	}
	return record{id: r.name, text: b}, nil
}

// tooLarge skips the file as too-large; past begins the message, which
// goes on with the limit ("it is 70000000 bytes, over").
func (r *textReader) tooLarge(past string) error {
	return &SkipError{Reason: SkipTooLarge, Path: r.name,
		Err: fmt.Errorf("%s the %d MiB a text file may hold as its one document (a fixed limit): split it into smaller files to ingest it", past, MaxTextFileBytes>>20)}
}

// tarHeader is the size of a tar header, which holds the format's magic
// "ustar" at offset 257 (POSIX and GNU alike).
const tarHeader = 512

func isTar(head []byte) bool {
	return len(head) >= tarHeader && bytes.HasPrefix(head[257:], []byte("ustar"))
}

func (r *textReader) Close() error {
	if r.z != nil {
		r.z.Close()
	}
	return r.f.Close()
}
