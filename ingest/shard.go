package ingest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	// Layout places the documents in their file; nil when the source does
	// not say where it left records out, and the shard can then be
	// appended only whole.
	Layout *Layout
}

// shardChunk is a run of consecutive documents and, once done is closed,
// their ids in the store's dtype with EOS after each document.
type shardChunk struct {
	docs   []string
	buf    []byte
	tokens int64
	// ends is, for each document, the tokens of the chunk up to its end.
	ends []int64
	// inside are the documents (their index in docs) whose own ids hold
	// EOS.
	inside []EOSInside
	// long are the documents (their index in docs) refused for a word
	// longer than tokenizer.DefaultMaxWordBytes.
	long  []int
	done  chan struct{}
	shard *shardEncoding
}

// shardEncoding is how one shard's chunks are encoded.
type shardEncoding struct {
	ctx   context.Context // once done, the shard's chunks are skipped
	tok   *tokenizer.Tokenizer
	eos   uint32
	dtype tokens.Dtype
}

// chunks keeps written chunks, their buffers grown, for the next chunk of
// this shard or of the next: a worker writes shard after shard, and a
// chunk made afresh grows its token buffer document by document (on 16
// cores that growing and the collections it caused cost 2-3% of the
// worker's CPU).
var chunks = sync.Pool{New: func() any { return new(shardChunk) }}

func getChunk(shard *shardEncoding) *shardChunk {
	c := chunks.Get().(*shardChunk)
	c.docs, c.buf, c.tokens, c.ends, c.inside, c.long, c.shard = c.docs[:0], c.buf[:0], 0, c.ends[:0], c.inside[:0], c.long[:0], shard
	c.done = make(chan struct{})
	return c
}

func putChunk(c *shardChunk) {
	clear(c.docs) // let the text go
	c.shard = nil
	chunks.Put(c)
}

// encoders is the process's encoding pool: one goroutine per core, started
// at the first shard, taking the chunks of every shard being written in the
// order they come. Shards written at once share the cores rather than each
// running an encoder per core: a shard between files (opening one, waiting
// for its first pages) or short of decoded text leaves its cores to the
// others' chunks, and no more encoders than cores compete for them. On 16
// cores it measured the same as an encoder per core per shard
// (docs/benchmarks/ingest.md).
var encoders struct {
	once sync.Once
	work chan *shardChunk
}

// DefaultEncoders is the size of the process's encoding pool: one encoder
// per core. Leaving one core of 16 to the append, readers, uploads and the
// object store instead measured no faster (docs/benchmarks/ingest.md).
func DefaultEncoders() int { return runtime.GOMAXPROCS(0) }

// poolSize, when positive, replaces DefaultEncoders (SetEncoders).
var poolSize atomic.Int64

// SetEncoders sizes the encoding pool, for comparisons of sizes: it must be
// called before the process writes its first shard, which starts the pool.
func SetEncoders(n int) { poolSize.Store(int64(n)) }

// encode queues c for the pool; it blocks while the pool's queue is full,
// and returns ctx's error, with c marked done unencoded, if ctx ends first.
func encode(ctx context.Context, c *shardChunk) error {
	encoders.once.Do(func() {
		n := DefaultEncoders()
		if k := poolSize.Load(); k > 0 {
			n = int(k)
		}
		encoders.work = make(chan *shardChunk, 4*n)
		for range n {
			go encodeChunks(encoders.work, n)
		}
	})
	select {
	case encoders.work <- c:
		return nil
	case <-ctx.Done():
		close(c.done)
		return ctx.Err()
	}
}

// encodeChunks is one of the pool's n encoders. They share their
// tokenizer's word tables (AppendEncodedAmong): with a table each, 16
// encoders merged 641,163 GPT-4-style words of 100 MB of Go and prose
// where one merges 133,728; sharing, 139,912, with a quarter less CPU
// time (a 2-vCPU VM).
func encodeChunks(work <-chan *shardChunk, n int) {
	var ids []uint32
	for c := range work {
		sh := c.shard
		if sh.ctx.Err() == nil {
			for i, d := range c.docs {
				var err error
				ids, err = sh.tok.AppendEncodedAmongBounded(n, ids[:0], unsafe.Slice(unsafe.StringData(d), len(d)), tokenizer.DefaultMaxWordBytes)
				if err != nil {
					// A word of megabytes (a run of spaces in generated
					// text) would cost tens of bytes of memory a byte to
					// merge, and is no text to learn from: the document is
					// left out, its EOS alone kept so that the shard's
					// documents stay those of the file's records, which a
					// part of the file is cut by.
					c.long = append(c.long, i)
					ids = ids[:0]
				}
				// Text that spells the end-of-text token encodes to EOS:
				// a part of the shard must not end there.
				if k := countID(ids, sh.eos); k > 0 {
					c.inside = append(c.inside, EOSInside{Doc: int64(i), N: k})
				}
				ids = append(ids, sh.eos)
				c.buf = tokens.Encode(c.buf, sh.dtype, ids)
				c.tokens += int64(len(ids))
				c.ends = append(c.ends, c.tokens)
			}
		}
		close(c.done)
	}
}

// WriteShard tokenizes every document of src on all cores, with the EOS id
// after each document, and writes the ids to w as the store's dtype.
//
// Reading and decoding the source, encoding, and writing with the hash run
// at once: one goroutine reads chunks of documents, the process's encoders
// (one per core, shared by the shards written at once) turn each chunk
// into token bytes, and the caller's goroutine writes the chunks in order
// and hashes them. No stage waits for another to finish a batch, so parquet
// decoding, the hash and the writes overlap with tokenization.
func WriteShard(ctx context.Context, src Source, tok *tokenizer.Tokenizer, w io.Writer) (ShardStats, error) {
	return writeShard(ctx, src, tok, w, 0, math.MaxInt64)
}

// writeShard is WriteShard of a source whose first record is from, which
// stops once the shard holds more than room tokens, when the source says
// where its records lie (placed): the documents after the one that passes
// room could never go into a store with room tokens left, whose limit
// lets it take no more (an append takes whole documents while they fit),
// and the file is read no further, so that a store with little room left
// does not wait for a whole file of many times that to be read (every
// blob of a file of Software Heritage ids fetched) and tokenized. The
// shard's layout then ends at the record after its last document
// (Layout.To), and counts the records left out before it alone.
func writeShard(ctx context.Context, src Source, tok *tokenizer.Tokenizer, w io.Writer, from, room int64) (ShardStats, error) {
	pl, placedSrc := src.(placed)
	if !placedSrc {
		room = math.MaxInt64
	}
	eos, ok := tok.EOS()
	if !ok {
		return ShardStats{}, errors.New("the tokenizer has no end-of-text token: train or pick one with an EOS special token")
	}
	// Chunks in flight: enough that every core has the next one queued
	// while the writer catches up, and few enough to bound memory.
	inFlight := 4 * runtime.GOMAXPROCS(0)

	ctx, cancel := context.WithCancel(ctx)
	shard := &shardEncoding{ctx: ctx, tok: tok, eos: eos, dtype: tokens.DtypeFor(tok.VocabSize())}
	var wg sync.WaitGroup
	order := make(chan *shardChunk, inFlight)
	readErr := make(chan error, 1)
	defer func() {
		// On any early return the reader stops at its next send, the
		// encoders skip this shard's queued chunks, and nothing of the
		// shard outlives the call.
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
		send := func(c *shardChunk) error {
			// order first: the writer must learn of a chunk no later than
			// an encoder finishes it, and order's capacity bounds the
			// chunks alive.
			select {
			case order <- c:
			case <-ctx.Done():
				return ctx.Err()
			}
			return encode(ctx, c)
		}
		c := getChunk(shard)
		size := 0
		err := Drain(ctx, src, func(d Document) error {
			c.docs = append(c.docs, d.Text)
			if size += len(d.Text); size >= chunkBytes {
				if err := send(c); err != nil {
					return err
				}
				c, size = getChunk(shard), 0
			}
			return nil
		})
		if err == nil && len(c.docs) > 0 {
			err = send(c)
		}
		readErr <- err
	}()

	h := sha256.New()
	var st ShardStats
	var inside []EOSInside
	var long int64 // documents left out for a word too long
	short := false // the shard stops short of the file's end, past room
	width := int64(shard.dtype.Width())
	for c := range order {
		select {
		case <-c.done:
		case <-ctx.Done():
			return st, ctx.Err()
		}
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		docs, n := len(c.docs), c.tokens
		if st.Tokens+n > room {
			// The chunk's first document to pass room is the shard's last.
			docs = 1 + slices.IndexFunc(c.ends, func(end int64) bool { return st.Tokens+end > room })
			n = c.ends[docs-1]
			short = true
		}
		// Chunks are hundreds of KiB: written as they are, with no
		// buffering copy.
		if _, err := w.Write(c.buf[:n*width]); err != nil {
			return st, fmt.Errorf("writing the shard: %w", err)
		}
		h.Write(c.buf[:n*width])
		for _, e := range c.inside {
			if e.Doc < int64(docs) {
				inside = append(inside, EOSInside{Doc: st.Documents + e.Doc, N: e.N})
			}
		}
		for _, i := range c.long {
			if i < docs {
				long++
			}
		}
		st.Tokens += n
		st.Documents += int64(docs)
		putChunk(c)
		if short {
			break
		}
	}
	if short {
		// The reader and the encoders stop, and are waited for, before
		// the source's record of what it left out is read.
		cancel()
		for c := range order {
			<-c.done
			putChunk(c)
		}
		wg.Wait()
	} else if err := <-readErr; err != nil {
		return st, err
	}
	st.SHA256 = hex.EncodeToString(h.Sum(nil))
	st.Skips = src.Skipped()
	if placedSrc {
		st.Layout = &Layout{From: from, Skips: slices.Clone(pl.SkippedAt()), EOSInside: inside}
		if short {
			st.Layout.endAfter(st.Documents)
			st.Skips = st.Layout.skipsIn(from, 0)
		}
	}
	if long > 0 {
		st.Skips = maps.Clone(st.Skips)
		if st.Skips == nil {
			st.Skips = Skips{}
		}
		st.Skips.Add(SkipLongWord, long)
	}
	return st, nil
}

// countID is how many of ids are id.
func countID(ids []uint32, id uint32) int64 {
	var n int64
	for _, v := range ids {
		if v == id {
			n++
		}
	}
	return n
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
