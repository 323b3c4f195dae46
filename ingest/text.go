package ingest

import (
	"context"
	"fmt"
	"io"
	"os"
)

// MaxTextFileBytes bounds a plain text file, which is one document: a file
// past it is skipped as too-large rather than held in memory.
const MaxTextFileBytes = 64 << 20

// textReader yields a plain text file as one document.
type textReader struct {
	f    *os.File
	name string
	done bool
}

func openText(path string, opt OpenOptions) (Source, error) {
	f, _, err := openNonEmpty(path, opt.Name)
	if err != nil {
		return nil, err
	}
	return &textSource{r: &textReader{f: f, name: opt.Name}, skips: Skips{}, from: opt.From}, nil
}

func (r *textReader) next(ctx context.Context) (record, error) {
	if r.done {
		return record{}, io.EOF
	}
	r.done = true
	b, err := io.ReadAll(io.LimitReader(r.f, MaxTextFileBytes+1))
	if err != nil {
		return record{}, fmt.Errorf("reading %s: %w", r.name, err)
	}
	if len(b) > MaxTextFileBytes {
		return record{id: r.name, skip: SkipTooLarge}, nil
	}
	return record{id: r.name, text: b}, nil
}

func (r *textReader) Close() error { return r.f.Close() }
