package ingest

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// BatchBytes is the text tokenized at once across all cores: large enough
// to keep every core busy, small enough that a worker's memory stays flat
// whatever the shard's size (two batches are alive: one read, one encoded).
const BatchBytes = 8 << 20

// ShardStats describes a shard token file.
type ShardStats struct {
	Documents int64
	Tokens    int64
	SHA256    string // of the token bytes, as the store will hold them
	Skips     Skips
}

// WriteShard tokenizes every document of src on all cores, with the EOS id
// after each document, and writes the ids to w as the store's dtype. The
// next batch is read while the current one is encoded.
func WriteShard(ctx context.Context, src Source, tok *tokenizer.Tokenizer, w io.Writer) (ShardStats, error) {
	eos, ok := tok.EOS()
	if !ok {
		return ShardStats{}, errors.New("the tokenizer has no end-of-text token: train or pick one with an EOS special token")
	}
	dtype := tokens.DtypeFor(tok.VocabSize())

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	batches := make(chan []string, 1)
	readErr := make(chan error, 1)
	go func() {
		defer close(batches)
		var batch []string
		size := 0
		err := Drain(ctx, src, func(d Document) error {
			batch = append(batch, d.Text)
			if size += len(d.Text); size >= BatchBytes {
				select {
				case batches <- batch:
				case <-ctx.Done():
					return ctx.Err()
				}
				batch, size = nil, 0
			}
			return nil
		})
		if err == nil && len(batch) > 0 {
			select {
			case batches <- batch:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		readErr <- err
	}()

	h := sha256.New()
	bw := bufio.NewWriterSize(io.MultiWriter(w, h), 1<<20)
	var st ShardStats
	var buf []byte
	for batch := range batches {
		for _, ids := range tok.EncodeBatch(batch) {
			ids = append(ids, eos)
			buf = tokens.Encode(buf[:0], dtype, ids)
			if _, err := bw.Write(buf); err != nil {
				cancel()
				for range batches {
				}
				return st, fmt.Errorf("writing the shard: %w", err)
			}
			st.Tokens += int64(len(ids))
			st.Documents++
		}
	}
	if err := <-readErr; err != nil {
		return st, err
	}
	if err := bw.Flush(); err != nil {
		return st, fmt.Errorf("writing the shard: %w", err)
	}
	st.SHA256 = hex.EncodeToString(h.Sum(nil))
	st.Skips = src.Skipped()
	return st, nil
}

// SafeJoin places a listed repository path under dir, refusing one that
// would land outside it ("../../etc/passwd", an absolute path): file names
// come from a remote listing and are not trusted.
func SafeJoin(dir, repoPath string) (string, error) {
	clean := filepath.Clean(filepath.FromSlash(repoPath))
	if repoPath == "" || filepath.IsAbs(repoPath) || strings.HasPrefix(repoPath, "/") || clean == ".." ||
		strings.HasPrefix(clean, ".."+string(filepath.Separator)) || filepath.IsAbs(clean) {
		return "", &SkipError{Reason: SkipUnsafePath, Path: repoPath, Err: fmt.Errorf("the path leaves the data directory %s", dir)}
	}
	return filepath.Join(dir, clean), nil
}
