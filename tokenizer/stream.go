package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// streamChunk is the size at which EncodeReader looks for a cut. 1 MiB per
// job keeps memory small and the workers busy, and is large enough that
// handing jobs between goroutines costs nothing measurable.
var streamChunk = 1 << 20

// streamJobsPerWorker is how many pieces EncodeReader keeps in flight per
// worker, beyond one. Pieces are emitted in order, so one slow piece holds
// back every finished piece after it; once all are held, the reader stops
// and the workers wait. Four per worker leave room for a slow piece, at
// about 3 MB a piece with EncodeReaderTo, whose pieces keep their text and
// bytes but not their ids (docs/benchmarks/tokenizer.md).
const streamJobsPerWorker = 4

// cuttable reports whether the text can be cut at safe points and encoded
// in pieces with the same ids as a whole: not when a pre-tokenizer adds a
// prefix space (each piece would get one), not when no stage splits (the
// whole text is one word), not when an added token contains a line break (it
// could straddle a cut), and not when an added token that strips the space
// on its left starts with a letter (at the start of a piece it would not
// reach back over the line break before it).
func (t *Tokenizer) cuttable() bool {
	splits := false
	for _, s := range t.stages {
		if s.prefixSpace {
			return false
		}
		splits = splits || s.split != nil
	}
	if !splits {
		return false
	}
	for _, a := range t.added {
		if strings.ContainsAny(a.content, "\r\n") {
			return false
		}
		if c := a.content[0] | 0x20; a.lstrip && c >= 'a' && c <= 'z' {
			return false
		}
	}
	return true
}

// safeCut returns the last offset p in b at which encoding b[:p] and b[p:]
// separately gives the ids of b, or -1. It cuts after a single "\n" that
// follows a visible ASCII character and precedes an ASCII letter: in both
// the GPT-2 and GPT-4 patterns that line break is a word of its own (or
// ends a punctuation word), the lookahead `(?!\S)` sees the same thing at
// the end of a piece as before the letter, and matching restarts at the
// letter whatever came before.
func safeCut(b []byte) int { return safeCutAfter(b, 0) }

// safeCutAfter is safeCut for a b whose first from bytes were searched
// before, when b was that long, and held no cut: only cuts at from or
// later can be new (a cut at p reads b[p-2 : p+1]), so the search stops
// there. A long stretch without a cut, read a piece at a time, is then
// searched once, not once a read (quadratic in the stretch: a file of
// short numeric lines has a line break every few bytes and no cut).
func safeCutAfter(b []byte, from int) int {
	lo := max(from-1, 1)
	for end := len(b); ; {
		j := bytes.LastIndexByte(b[:end], '\n')
		if j < lo {
			return -1
		}
		if p := j + 1; p < len(b) {
			c, prev := b[p]|0x20, b[j-1]
			if c >= 'a' && c <= 'z' && prev > ' ' && prev < 0x7f {
				return p
			}
		}
		end = j
	}
}

// streamJob is one piece of a stream: its text, then its ids. Jobs are
// recycled, so that a long stream allocates nothing once they have grown.
type streamJob struct {
	seq  int
	text []byte
	ids  []uint32
	out  []byte // the ids as bytes, for EncodeReaderTo
}

// EncodeReader encodes a text stream on all cores with the ids Encode would
// give for the whole text, calling emit with consecutive runs of ids in
// order, from the calling goroutine; ids is valid only until emit returns.
// Reading, encoding and emitting overlap: one goroutine reads and cuts the
// text into pieces at safe points, GOMAXPROCS workers encode them, each
// with its own word cache, and the caller emits them in order. Memory stays
// bounded by a few MiB per core unless the text has no safe cut point for
// long stretches (a huge line).
func (t *Tokenizer) EncodeReader(ctx context.Context, r io.Reader, emit func(ids []uint32) error) error {
	return t.encodeStream(ctx, r, 0, func(j *streamJob) error { return emit(j.ids) })
}

// EncodeReaderTo is EncodeReader writing the ids to w as little-endian
// integers of width bytes (2 or 4; an id that does not fit in 2 bytes keeps
// its low 16 bits). The workers turn ids into bytes, so that on many cores
// the one goroutine that writes does nothing else. It returns the number of
// ids written.
func (t *Tokenizer) EncodeReaderTo(ctx context.Context, r io.Reader, w io.Writer, width int) (int64, error) {
	if width != 2 && width != 4 {
		return 0, fmt.Errorf("encode: id width %d is not 2 or 4", width)
	}
	var n int64
	err := t.encodeStream(ctx, r, width, func(j *streamJob) error {
		n += int64(len(j.out) / width)
		if _, err := w.Write(j.out); err != nil {
			return fmt.Errorf("encode: write: %w", err)
		}
		return nil
	})
	return n, err
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// appendLE appends ids to dst as little-endian integers of width bytes.
func appendLE(dst []byte, ids []uint32, width int) []byte {
	n := len(dst)
	dst = slices.Grow(dst, width*len(ids))[:n+width*len(ids)]
	out := dst[n:]
	if width == 2 {
		out = out[:2*len(ids)] // one bounds check for the loop
		for i, id := range ids {
			out[2*i] = byte(id)
			out[2*i+1] = byte(id >> 8)
		}
	} else if littleEndian {
		// The ids' own bytes are the output: one copy.
		copy(out, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids)))
	} else {
		for i, id := range ids {
			binary.LittleEndian.PutUint32(out[4*i:], id)
		}
	}
	return dst
}

// encodeStream runs EncodeReader's pipeline; with width set, the workers
// also write each piece's ids as bytes into its out.
func (t *Tokenizer) encodeStream(ctx context.Context, r io.Reader, width int, emit func(j *streamJob) error) error {
	workers := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// free bounds the jobs in flight (streamJobsPerWorker).
	nJobs := streamJobsPerWorker*workers + 1
	free := make(chan *streamJob, nJobs)
	for range nJobs {
		free <- &streamJob{}
	}
	todo := make(chan *streamJob, nJobs)
	done := make(chan *streamJob, nJobs)

	var readErr error
	go func() {
		defer close(todo)
		readErr = t.readJobs(ctx, r, free, todo)
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := t.workerState(workers)
			defer t.putState(st)
			var scratch []uint32
			for j := range todo {
				// Room for the ids of most text (code and prose average
				// three to four bytes an id): grown once, not doubled from
				// nothing through fresh pages.
				want := len(j.text)/2 + 64
				if width > 0 {
					// Written out as bytes: the ids go through this worker's
					// scratch, and the piece keeps only the bytes.
					if cap(scratch) < want {
						scratch = make([]uint32, 0, want)
					}
					scratch = st.encode(scratch[:0], j.text)
					j.ids = j.ids[:0]
					j.out = appendLE(j.out[:0], scratch, width)
					done <- j
					continue
				}
				if cap(j.ids) < want {
					j.ids = make([]uint32, 0, want)
				}
				j.ids = st.encode(j.ids[:0], j.text)
				done <- j
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()

	// Jobs come back out of order; hold them until their turn.
	var err error
	waiting := map[int]*streamJob{}
	next := 0
	for j := range done {
		if err != nil {
			continue // draining after a failure
		}
		waiting[j.seq] = j
		for {
			j, ok := waiting[next]
			if !ok {
				break
			}
			delete(waiting, next)
			next++
			if err = emit(j); err != nil {
				cancel()
				break
			}
			free <- j
		}
	}
	if err != nil {
		return err
	}
	if readErr != nil {
		return readErr
	}
	return ctx.Err()
}

// readJobs reads r into jobs from free, each cut at a safe point (or the
// whole text when it cannot be cut), and queues them on todo in order.
func (t *Tokenizer) readJobs(ctx context.Context, r io.Reader, free <-chan *streamJob, todo chan<- *streamJob) error {
	cut := t.cuttable()
	var carry []byte // text after the last cut, for the next job
	for seq := 0; ; seq++ {
		var j *streamJob
		select {
		case j = <-free:
		case <-ctx.Done():
			return ctx.Err()
		}
		j.seq = seq
		j.text = append(j.text[:0], carry...)
		eof := false
		searched := 0 // j.text's first bytes, searched for a cut and holding none
		for {
			if cut && len(j.text) >= streamChunk {
				if p := safeCutAfter(j.text, searched); p > 0 {
					carry = append(carry[:0], j.text[p:]...)
					j.text = j.text[:p]
					break
				}
				searched = len(j.text)
			}
			// Read into the job's own buffer: no copy between the reader
			// and the encoder. A text that cannot be cut is read whole.
			if cap(j.text)-len(j.text) <= streamChunk/4 {
				j.text = slices.Grow(j.text, streamChunk+1)
			}
			n, err := r.Read(j.text[len(j.text):cap(j.text)])
			j.text = j.text[:len(j.text)+n]
			if errors.Is(err, io.EOF) {
				eof = true
				break
			}
			if err != nil {
				return fmt.Errorf("encode: read: %w", err)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if eof {
			carry = carry[:0]
		}
		if len(j.text) > 0 || seq == 0 {
			select {
			case todo <- j:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if eof {
			return nil
		}
	}
}
