package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"unsafe"

	"github.com/kiln-lm/kiln/tokenizer"
	"github.com/kiln-lm/kiln/tokens"
)

// chunkBytes is the text one encoder takes at a time. Chunks are small so
// that the cores never wait for one another at a batch boundary (a large
// batch ends with one core finishing its last document while the others
// idle) and so that the text and tokens in flight stay a few MiB whatever
// the shard's size; 256 KiB is still dozens of documents, so handing them
// over costs nothing measurable.
const chunkBytes = 256 << 10

// ShardStats describes a shard token file.
type ShardStats struct {
	Documents int64
	Tokens    int64
	SHA256    string // of the token bytes, as the store will hold them
	Skips     Skips
}

// shardChunk is a run of consecutive documents and, once done is closed,
// their ids in the store's dtype with EOS after each document.
type shardChunk struct {
	docs   []string
	buf    []byte
	tokens int64
	done   chan struct{}
}

// chunks keeps written chunks, their buffers grown, for the next chunk of
// this shard or of the next: a worker writes shard after shard, and a
// chunk made afresh grows its token buffer document by document (on 16
// cores that growing and the collections it caused cost 2-3% of the
// worker's CPU).
var chunks = sync.Pool{New: func() any { return new(shardChunk) }}

func getChunk() *shardChunk {
	c := chunks.Get().(*shardChunk)
	c.docs, c.buf, c.tokens = c.docs[:0], c.buf[:0], 0
	c.done = make(chan struct{})
	return c
}

func putChunk(c *shardChunk) {
	clear(c.docs) // let the text go
	chunks.Put(c)
}

// WriteShard tokenizes every document of src on all cores, with the EOS id
// after each document, and writes the ids to w as the store's dtype.
//
// Reading and decoding the source, encoding, and writing with the hash run
// at once: one goroutine reads chunks of documents, one encoder per core
// turns each chunk into token bytes, and the caller's goroutine writes the
// chunks in order and hashes them. No stage waits for another to finish a
// batch, so parquet decoding, the hash and the writes overlap with
// tokenization.
func WriteShard(ctx context.Context, src Source, tok *tokenizer.Tokenizer, w io.Writer) (ShardStats, error) {
	eos, ok := tok.EOS()
	if !ok {
		return ShardStats{}, errors.New("the tokenizer has no end-of-text token: train or pick one with an EOS special token")
	}
	dtype := tokens.DtypeFor(tok.VocabSize())
	encoders := runtime.GOMAXPROCS(0)
	// Chunks in flight: enough that every encoder has the next one queued
	// while the writer catches up, and few enough to bound memory.
	inFlight := 4 * encoders

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// work holds at most the chunks in order plus the one the writer is
	// waiting on, so a send to it never blocks.
	work := make(chan *shardChunk, inFlight+1)
	order := make(chan *shardChunk, inFlight)
	readErr := make(chan error, 1)
	defer func() {
		// On any early return the reader stops at its next send, the
		// encoders skip what is queued, and nothing outlives the call.
		cancel()
		for c := range order {
			<-c.done
			putChunk(c)
		}
		wg.Wait()
	}()

	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(order)
		defer close(work)
		send := func(c *shardChunk) error {
			// order first: the writer must learn of a chunk no later than
			// an encoder finishes it, and order's capacity bounds the
			// chunks alive.
			select {
			case order <- c:
			case <-ctx.Done():
				return ctx.Err()
			}
			work <- c
			return nil
		}
		c := getChunk()
		size := 0
		err := Drain(ctx, src, func(d Document) error {
			c.docs = append(c.docs, d.Text)
			if size += len(d.Text); size >= chunkBytes {
				if err := send(c); err != nil {
					return err
				}
				c, size = getChunk(), 0
			}
			return nil
		})
		if err == nil && len(c.docs) > 0 {
			err = send(c)
		}
		readErr <- err
	}()

	for range encoders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ids []uint32
			for c := range work {
				if ctx.Err() == nil {
					for _, d := range c.docs {
						ids = tok.AppendEncoded(ids[:0], unsafe.Slice(unsafe.StringData(d), len(d)))
						ids = append(ids, eos)
						c.buf = tokens.Encode(c.buf, dtype, ids)
						c.tokens += int64(len(ids))
					}
				}
				close(c.done)
			}
		}()
	}

	h := sha256.New()
	var st ShardStats
	for c := range order {
		select {
		case <-c.done:
		case <-ctx.Done():
			return st, ctx.Err()
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		// Chunks are hundreds of KiB: written as they are, with no
		// buffering copy.
		if _, err := w.Write(c.buf); err != nil {
			return st, fmt.Errorf("writing the shard: %w", err)
		}
		h.Write(c.buf)
		st.Tokens += c.tokens
		st.Documents += int64(len(c.docs))
		putChunk(c)
	}
	if err := <-readErr; err != nil {
		return st, err
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
