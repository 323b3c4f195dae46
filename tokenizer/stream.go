package tokenizer

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
	"unsafe"
)

// streamChunk is the size at which EncodeReader looks for a cut. 1 MiB per
// job keeps memory small and the workers busy, and is large enough that
// handing jobs between goroutines costs nothing measurable.
var streamChunk = 1 << 20

// streamJobsPerWorker is how many pieces EncodeReader keeps in flight per
// worker, beyond one. Pieces are emitted in order, so one slow piece holds
// back every finished piece after it; once all are held, no piece is read
// and the workers wait. Two per worker leave room for a slow piece now that
// a piece ends within a line or so of its nominal end (four did when a
// stretch of indented code made one piece of megabytes), at about 1 MB a
// waiting piece with EncodeReaderTo on a file, whose pieces keep only
// their ids' bytes (their text buffer goes back to the worker, their ids
// live in the worker's scratch). On 16 cores, 1 GB: 191 MB against 253 MB
// held, 2.6% faster (docs/benchmarks/tokenizer.md).
const streamJobsPerWorker = 2

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

// cutRule says where a text can be cut into pieces that encode separately
// to the ids of the whole: at a word boundary of the pre-tokenizer that
// holds whatever comes before and after the piece it ends or starts, found
// from a few bytes around it. Where depends on the pattern (kind); every
// place is next to a line break, so that the cuts are found by looking for
// line breaks alone.
type cutRule struct {
	ok   bool // the text can be cut at all (Tokenizer.cuttable)
	kind cutKind
}

// cutKind is where a cuttable text may be cut.
type cutKind uint8

const (
	// cutLF: after a "\n" that follows a visible ASCII character and
	// precedes an ASCII letter, for any splitting pattern and added tokens
	// that strip whitespace. In the GPT-2 and GPT-4 patterns that line
	// break is a word of its own (or ends a punctuation word), `(?!\S)`
	// sees the same at the end of a piece as before the letter, and matching
	// restarts at the letter whatever came before; an added token that
	// strips the line break on its right takes it in either piece. Code
	// whose lines start with indentation has no such cut for megabytes.
	cutLF cutKind = iota
	// cutBefore: before a line break ("\n" or "\r\n") that follows a
	// character other than whitespace, for the GPT-2 pattern. No word of
	// that pattern ends in whitespace unless it is all whitespace, so a word
	// ends at that character; the words of the whitespace run depend only
	// on the run and the character after it, which are in the same piece.
	cutBefore
	// cutAfter: after a "\n" followed by at most 15 spaces or tabs and a
	// character other than whitespace, for the GPT-4 and Qwen2 patterns.
	// Every word that holds a "\n" there ends with the run of line breaks
	// it is in (`\s*[\r\n]+`, or a punctuation word's `[\r\n]*`), and no
	// line break follows before that character; matching restarts after it
	// with nothing behind it to look at.
	cutAfter
)

// The characters around a cut are ASCII for cutLF; for the other rules any
// character the pre-tokenizers do not class as whitespace (classAt), so
// that text whose lines end or start in other scripts is cut too.

// cutBlanks is the most spaces or tabs a cutAfter cut looks past; cutReach
// is how many bytes at and after a cut's offset the rules read (the blanks
// and the character after them), cutBehind how many before it (the
// character before a cutBefore cut).
const (
	cutBlanks = 15
	cutReach  = cutBlanks + utf8.UTFMax
	cutBehind = utf8.UTFMax
)

// cutRule is the tokenizer's rule for cutting a text. cutBefore and
// cutAfter hold only where no added token strips whitespace: one that
// strips on its left (right) takes the whitespace run after (before) a
// cutAfter (cutBefore) cut in the whole text and only its part in a piece.
func (t *Tokenizer) cutRule() cutRule {
	r := cutRule{ok: t.cuttable()}
	if !r.ok {
		return r
	}
	for _, a := range t.added {
		if a.lstrip || a.rstrip {
			return r
		}
	}
	gpt2, gpt4 := true, true
	for _, s := range t.stages {
		if s.split != nil {
			gpt2 = gpt2 && s.gpt2
			gpt4 = gpt4 && s.gpt4Digits > 0
		}
	}
	switch {
	case gpt2:
		r.kind = cutBefore
	case gpt4:
		r.kind = cutAfter
	}
	return r
}

func visibleASCII(c byte) bool { return c > ' ' && c < 0x7f }
func asciiLetter(c byte) bool  { c |= 0x20; return c >= 'a' && c <= 'z' }

// at says whether b can be cut at p (between b[p-1] and b[p]). It reads
// b[p-cutBehind : p+cutReach] at most, and says false where the bytes it
// needs run past the end of b.
func (r cutRule) at(b []byte, p int) bool {
	if p < 1 || p >= len(b) {
		return false
	}
	switch r.kind {
	case cutBefore:
		lf := b[p] == '\n' || b[p] == '\r' && p+1 < len(b) && b[p+1] == '\n'
		return lf && notSpaceBefore(b, p)
	case cutAfter:
		if b[p-1] != '\n' {
			return false
		}
		for q := p; q < min(p+cutBlanks+1, len(b)); q++ {
			if c := b[q]; c != ' ' && c != '\t' {
				// A character of several bytes is read whole, or not at
				// all: at the end of a buffer it may yet be whitespace.
				return (c < utf8.RuneSelf || utf8.FullRune(b[q:])) && notSpace(b, q)
			}
		}
		return false
	}
	return p >= 2 && b[p-1] == '\n' && asciiLetter(b[p]) && visibleASCII(b[p-2])
}

// notSpaceBefore says whether the character that ends at b[p-1] is not
// whitespace. A character of several bytes ends within the UTFMax bytes
// before p, which is all it reads.
func notSpaceBefore(b []byte, p int) bool {
	_, w := utf8.DecodeLastRune(b[max(p-cutBehind, 0):p])
	return notSpace(b, p-w)
}

// notSpace says whether the pre-tokenizers class the character at b[i] as
// anything but whitespace.
func notSpace(b []byte, i int) bool {
	c, _ := classAt(b, i)
	return c != clsSpace
}

// candidates are the offsets next to a line break at j where a rule may
// cut: before a "\r" before it, before it, and after it.
func candidates(j int) [3]int { return [3]int{j - 1, j, j + 1} }

// last returns the last offset p in b at which b can be cut, or -1, for a b
// whose first from bytes were searched before, when b was that long, and
// held no cut: only cuts within cutReach-1 bytes of from or later can be
// new (a cut at p reads up to b[p+cutReach-1]), so the search stops there.
// A long stretch without a cut, read a piece at a time, is then searched
// once, not once a read (quadratic in the stretch: a file of short
// numeric lines has a line break every few bytes and no cut by cutLF).
func (r cutRule) last(b []byte, from int) int {
	lo := max(from-cutReach+1, 1)
	for end := len(b); ; {
		j := bytes.LastIndexByte(b[:end], '\n')
		if j+1 < lo {
			return -1
		}
		c := candidates(j)
		for k := len(c) - 1; k >= 0; k-- {
			if c[k] >= lo && r.at(b, c[k]) {
				return c[k]
			}
		}
		end = j
	}
}

// first returns the first offset p, from <= p < to, at which b can be cut,
// or -1; b may run past to, for the bytes a cut before to reads.
func (r cutRule) first(b []byte, from, to int) int {
	for i := max(from-1, 0); i < len(b) && i <= to; {
		k := bytes.IndexByte(b[i:], '\n')
		if k < 0 {
			return -1
		}
		j := i + k
		for _, p := range candidates(j) {
			if p >= to {
				return -1
			}
			if p >= from && r.at(b, p) {
				return p
			}
		}
		i = j + 1
	}
	return -1
}

// streamJob is one piece of a stream: its text, then its ids. Jobs are
// recycled, so that a long stream allocates nothing once they have grown.
type streamJob struct {
	seq  int
	text []byte
	buf  []byte // what a piece read at its offset was read into; text is part of it
	ids  []uint32
	out  []byte // the ids as bytes, for EncodeReaderTo
}

// EncodeReader encodes a text stream on all cores with the ids Encode would
// give for the whole text, calling emit with consecutive runs of ids in
// order, from the calling goroutine; ids is valid only until emit returns.
// The text is cut into pieces at safe points, which GOMAXPROCS workers
// encode, each with its own word cache (and one shared table of words).
// A file, or any reader that can also ReadAt and Seek, is read by the
// workers themselves, each its own piece at its offset, from its current
// position to its end (it must not change meanwhile, but may grow); it is
// left at the end of what was read. Any other
// reader is read and cut by one goroutine. Memory stays bounded by a few
// MiB per core unless the text has no safe cut point for long stretches (a
// huge line).
func (t *Tokenizer) EncodeReader(ctx context.Context, r io.Reader, emit func(ids []uint32) error) error {
	return t.encodeStream(ctx, r, 0, false, func(j *streamJob) error { return emit(j.ids) })
}

// EncodeReaderTo is EncodeReader writing the ids to w as little-endian
// integers of width bytes (2 or 4; an id that does not fit in 2 bytes keeps
// its low 16 bits). The workers turn ids into bytes and write them: the
// worker that finishes the piece whose turn it is writes it and the
// finished pieces after it, so that on many cores no goroutine beyond the
// workers waits for a core between pieces. w's Write is called in order,
// never twice at once, from the workers' goroutines. It returns the number
// of ids written.
func (t *Tokenizer) EncodeReaderTo(ctx context.Context, r io.Reader, w io.Writer, width int) (int64, error) {
	if width != 2 && width != 4 {
		return 0, fmt.Errorf("encode: id width %d is not 2 or 4", width)
	}
	var n int64
	err := t.encodeStream(ctx, r, width, true, func(j *streamJob) error {
		n += int64(len(j.out) / width)
		if len(j.out) == 0 {
			return nil
		}
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
		// Four ids an 8-byte store, where a byte store each was 18
		// instructions an id, a twelfth of encoding.
		for len(ids) >= 4 && len(out) >= 8 {
			binary.LittleEndian.PutUint64(out, uint64(uint16(ids[0]))|uint64(uint16(ids[1]))<<16|
				uint64(uint16(ids[2]))<<32|uint64(uint16(ids[3]))<<48)
			ids, out = ids[4:], out[8:]
		}
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

// leInPlace turns ids into little-endian integers of width bytes in their
// own memory and returns those bytes; ids is overwritten. Id i's bytes go
// to 2i (or 4i), where ids before i were, so no id is overwritten before
// it is read.
func leInPlace(ids []uint32, width int) []byte {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(ids))), 4*len(ids))
	if width == 4 {
		if !littleEndian {
			for i, id := range ids {
				binary.LittleEndian.PutUint32(b[4*i:], id)
			}
		}
		return b
	}
	i := 0
	for ; i+4 <= len(ids); i += 4 {
		// Four ids read, then one 8-byte store at 2i, below id i+4 at 4i+16.
		v := uint64(uint16(ids[i])) | uint64(uint16(ids[i+1]))<<16 |
			uint64(uint16(ids[i+2]))<<32 | uint64(uint16(ids[i+3]))<<48
		binary.LittleEndian.PutUint64(b[2*i:], v)
	}
	for ; i < len(ids); i++ {
		id := ids[i]
		b[2*i], b[2*i+1] = byte(id), byte(id>>8)
	}
	return b[:2*len(ids)]
}

// streamEvent, when set (by the benchmarks), is told when worker w starts
// (done false) and finishes (done true) encoding piece seq, and when it
// finds no piece left (seq -1), so that a run's time can be split into
// encoding and waiting. The workers call it, at once.
var streamEvent func(worker, seq int, done bool)

// encodeStream runs EncodeReader's pipeline; with width set, the workers
// also write each piece's ids as bytes into its out. emit gets the pieces
// in order: from the workers, one at a time, when onWorkers is set, else
// from the calling goroutine.
func (t *Tokenizer) encodeStream(ctx context.Context, r io.Reader, width int, onWorkers bool, emit func(j *streamJob) error) error {
	workers := runtime.GOMAXPROCS(0)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	// free bounds the jobs in flight (streamJobsPerWorker).
	nJobs := streamJobsPerWorker*workers + 1
	free := newJobPool(nJobs)

	// next gives a worker its next piece, read, or nil when there is none;
	// a piece of a file is read into spare, the buffer of the worker's last
	// piece (nil at first).
	var next func(spare []byte) (*streamJob, error)
	var finish func() error // after the workers: where the source stopped
	fp, fromFile := newFilePieces(r, t.cutRule(), workers)
	var textBytes int64 // when known: the shared word table's first size
	if fromFile {
		textBytes = fp.size
		next = func(spare []byte) (*streamJob, error) {
			j := free.get(ctx)
			if j == nil {
				return nil, nil
			}
			j.buf = spare
			ok, err := fp.next(j)
			if !ok || err != nil {
				free.put(j)
				return nil, err
			}
			return j, nil
		}
		finish = fp.finish
	} else {
		todo := make(chan *streamJob, nJobs)
		var readErr error
		readDone := make(chan struct{})
		go func() {
			defer close(readDone)
			defer close(todo)
			readErr = t.readJobs(ctx, r, free, todo)
		}()
		next = func([]byte) (*streamJob, error) { return <-todo, nil }
		finish = func() error {
			<-readDone
			return readErr
		}
	}

	var order inOrder
	order.waiting = map[int]*streamJob{}
	done := make(chan *streamJob, nJobs)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := t.workerState(workers, textBytes)
			defer t.putState(st)
			var scratch []uint32
			var spare []byte
			for {
				j, err := next(spare)
				spare = nil
				if err != nil {
					cancel(err)
				}
				if j == nil || ctx.Err() != nil {
					if j != nil {
						free.put(j)
					}
					if streamEvent != nil {
						streamEvent(w, -1, false)
					}
					return
				}
				if streamEvent != nil {
					streamEvent(w, j.seq, false)
				}
				// Room for the ids of most text (code and prose average
				// three to four bytes an id): grown once, not doubled from
				// nothing through fresh pages.
				want := len(j.text)/2 + 64
				if width > 0 {
					// Written out as bytes: the ids go through this worker's
					// scratch, and the piece keeps only the bytes.
					// One scratch a worker: room for an id a byte, so
					// that no piece grows it (a piece of whitespace-rich
					// text passed half, and each worker's scratch was
					// made, then doubled through fresh pages).
					if cap(scratch) < len(j.text)+64 {
						scratch = make([]uint32, 0, max(len(j.text), streamChunk+cutLookahead)+64)
					}
					scratch = st.encode(scratch[:0], j.text)
					j.ids = j.ids[:0]
				} else {
					if cap(j.ids) < want {
						j.ids = make([]uint32, 0, want)
					}
					j.ids = st.encode(j.ids[:0], j.text)
				}
				if fromFile {
					// The text is encoded: its buffer reads this worker's
					// next piece, so that only the pieces being encoded
					// hold text, not every piece waiting for its turn
					// (at 16 workers that was 65 buffers of a megabyte,
					// 50 of them idle, and their pages faulted in anew).
					spare, j.buf, j.text = j.buf[:0], nil, nil
				}
				if streamEvent != nil {
					streamEvent(w, j.seq, true)
				}
				switch {
				case !onWorkers:
					done <- j
				case order.claim(j.seq):
					// Its turn, and no one is writing: the ids go out
					// from this worker's scratch, as bytes in place,
					// not copied into the piece (on one core that copy
					// and the fresh pages it filled were a tenth of
					// `sched tokenize`).
					own := j.out
					j.out = leInPlace(scratch, width)
					err := emit(j)
					j.out = own[:0]
					free.put(j)
					if err := order.claimed(err, emit, free); err != nil {
						cancel(err)
					}
				default:
					if n := width * len(scratch); cap(j.out) < n {
						// Made once at the size the pieces need, with an
						// eighth to spare: grown by append's steps, the
						// pieces in flight left 1.5x their bytes behind as
						// garbage, and the heap, then the resident set,
						// grew with it.
						j.out = make([]byte, 0, n+n/8)
					}
					j.out = appendLE(j.out[:0], scratch, width)
					if err := order.finished(j, emit, free); err != nil {
						cancel(err)
					}
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		close(done)
	}()

	// Jobs come back out of order; hold them until their turn.
	for j := range done {
		if ctx.Err() != nil {
			continue // draining after a failure
		}
		if err := order.finished(j, emit, free); err != nil {
			cancel(err)
		}
	}
	srcErr := finish()
	if err := context.Cause(ctx); err != nil {
		return err
	}
	return srcErr
}

// inOrder hands finished pieces to emit in the order of their seq.
type inOrder struct {
	mu       sync.Mutex
	waiting  map[int]*streamJob
	next     int
	emitting bool // one goroutine emits at a time, the others leave their pieces
	failed   bool
}

// finished takes the finished job j. If no one is emitting, the caller
// emits the pieces whose turn has come, j's and those after it, and puts
// their jobs back on free; it returns emit's first error.
func (o *inOrder) finished(j *streamJob, emit func(*streamJob) error, free *jobPool) error {
	o.mu.Lock()
	o.waiting[j.seq] = j
	if o.emitting || o.failed {
		o.mu.Unlock()
		return nil
	}
	o.emitting = true
	return o.drain(emit, free)
}

// claim reports whether piece seq's turn has come and no one is emitting;
// if so, the caller emits that piece itself, from wherever its ids are,
// then calls claimed.
func (o *inOrder) claim(seq int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.emitting || o.failed || seq != o.next {
		return false
	}
	o.emitting = true
	return true
}

// claimed ends a claim whose piece emit took with error err: the caller
// then emits the pieces after it whose turn has come, as finished does.
func (o *inOrder) claimed(err error, emit func(*streamJob) error, free *jobPool) error {
	o.mu.Lock()
	o.next++
	if err != nil {
		o.failed = true
		o.mu.Unlock()
		return err
	}
	return o.drain(emit, free)
}

// drain emits the waiting pieces whose turn has come, with o.mu held and
// emitting claimed; it gives both up.
func (o *inOrder) drain(emit func(*streamJob) error, free *jobPool) error {
	for {
		j, ok := o.waiting[o.next]
		if !ok {
			break
		}
		delete(o.waiting, o.next)
		o.next++
		o.mu.Unlock()
		err := emit(j)
		free.put(j)
		o.mu.Lock()
		if err != nil {
			o.failed = true
			o.mu.Unlock()
			return err
		}
	}
	o.emitting = false
	o.mu.Unlock()
	return nil
}

// jobPool holds the jobs not in flight and hands out the one put back
// last: its buffers are the ones most likely still in cache, and the jobs
// beyond those the workers keep busy are never taken, so their buffers
// are never made (handed out in turn, every job grew its own).
type jobPool struct {
	mu    sync.Mutex
	jobs  []*streamJob
	ready chan struct{} // a token for each job in jobs
}

func newJobPool(n int) *jobPool {
	p := &jobPool{jobs: make([]*streamJob, 0, n), ready: make(chan struct{}, n)}
	for range n {
		p.put(&streamJob{})
	}
	return p
}

// get takes a job, waiting for one; nil once ctx is done.
func (p *jobPool) get(ctx context.Context) *streamJob {
	select {
	case <-p.ready:
	case <-ctx.Done():
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	j := p.jobs[len(p.jobs)-1]
	p.jobs = p.jobs[:len(p.jobs)-1]
	return j
}

// put gives j back. It never blocks: the pool has room for every job.
func (p *jobPool) put(j *streamJob) {
	p.mu.Lock()
	p.jobs = append(p.jobs, j)
	p.mu.Unlock()
	p.ready <- struct{}{}
}

// filePieces cuts a text it can read at any offset (a file) into pieces
// that the workers read and encode at once, with no goroutine between them
// and the file. Piece k runs from the first safe cut at or after its
// nominal start to the first at or after the next piece's, so that a
// worker finds both ends of its piece from the bytes around them, without
// the pieces before it; the pieces meet, and together are the text. A
// piece with no cut between its nominal start and the next one's is
// empty: the piece before it runs over it.
type filePieces struct {
	r       io.ReaderAt
	seek    io.Seeker
	base    int64 // where the text starts in r
	size    int64 // its length when the encoding began
	cut     cutRule
	workers int

	mu    sync.Mutex
	seq   int
	start int64 // nominal start of the next piece
	last  bool  // the piece that reads to the end is given out
	end   int64 // where the text ended, once the last piece has read it; -1 before
}

// newFilePieces reads r at offsets when it can: an *os.File of a regular
// file, or another reader with ReadAt and Seek (bytes.Reader,
// io.SectionReader). A pipe or a terminal is read as a stream.
func newFilePieces(r io.Reader, cut cutRule, workers int) (*filePieces, bool) {
	ra, ok := r.(io.ReaderAt)
	seek, ok2 := r.(io.Seeker)
	if !ok || !ok2 {
		return nil, false
	}
	if f, isFile := r.(*os.File); isFile {
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			return nil, false
		}
	}
	base, err := seek.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, false
	}
	end, err := seek.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, false
	}
	// r stays where it was until the text has been read (finish).
	if _, err := seek.Seek(base, io.SeekStart); err != nil {
		return nil, false
	}
	return &filePieces{r: ra, seek: seek, base: base, size: max(end-base, 0), cut: cut, workers: workers, end: -1}, true
}

// cutLookahead is how far past a piece's nominal end its first read goes
// for the cut that ends it: a line break before a letter is rarely
// further.
const cutLookahead = 16 << 10

// next reads the next piece into j, or reports false when every piece has
// been given out.
func (p *filePieces) next(j *streamJob) (bool, error) {
	p.mu.Lock()
	if p.last {
		p.mu.Unlock()
		return false, nil
	}
	j.seq = p.seq
	p.seq++
	s, e := p.start, int64(-1) // e < 0: the last piece, to the end of the text
	if p.cut.ok {
		// Pieces of streamChunk bytes, and at the end smaller ones (half
		// an even share of what is left, down to a sixteenth), so that the
		// workers run out of work nearly together, not up to a piece apart.
		n := min(int64(streamChunk), max((p.size-s)/int64(2*p.workers), int64(streamChunk/16), 1))
		if s+n < p.size {
			e = s + n
		}
	}
	if e < 0 {
		p.last = true
	} else {
		p.start = e
	}
	p.mu.Unlock()

	// From cutBehind bytes before s: whether s is a cut depends on them.
	lo := max(s-cutBehind, 0)
	until := p.size + cutLookahead
	if e >= 0 {
		until = e + cutLookahead
	}
	buf, eof, err := p.fill(j.buf[:0], lo, until-lo)
	for e < 0 && !eof && err == nil {
		// The last piece reads to the end, wherever that is by now.
		buf, eof, err = p.fill(buf, lo, int64(2*len(buf)+cutLookahead))
	}
	if err != nil {
		j.buf = buf
		return false, err
	}
	if e < 0 {
		p.mu.Lock()
		p.end = lo + int64(len(buf))
		p.mu.Unlock()
	}
	from := 0
	if s > 0 {
		// The first cut at or after s and before the next piece's start.
		to := len(buf)
		if e >= 0 {
			to = int(min(e-lo, int64(len(buf))))
		}
		if from = p.cut.first(buf, int(s-lo), to); from < 0 {
			j.buf, j.text = buf, buf[:0]
			return true, nil
		}
	}
	to := len(buf)
	if e >= 0 {
		// The first cut at or after the next piece's start.
		for searched := int(e - lo); ; {
			if c := p.cut.first(buf, searched, len(buf)); c >= 0 {
				to = c
				break
			}
			if eof {
				to = len(buf)
				break
			}
			// A cut near the end may need the bytes after it.
			searched = max(searched, len(buf)-cutReach+1)
			if buf, eof, err = p.fill(buf, lo, int64(2*len(buf)+cutLookahead)); err != nil {
				j.buf = buf
				return false, err
			}
		}
	}
	j.buf, j.text = buf, buf[from:to]
	return true, nil
}

// fill reads the text from offset lo+len(buf) on until buf holds n bytes
// or the text ends (eof).
func (p *filePieces) fill(buf []byte, lo, n int64) (_ []byte, eof bool, _ error) {
	if int64(len(buf)) >= n {
		return buf, false, nil
	}
	// With cutBehind bytes to spare: every piece after the first reads
	// from cutBehind bytes before its start, and a buffer made for the
	// first grew again for the second (1.06 MB, then 1.33).
	buf = slices.Grow(buf, int(n)-len(buf)+cutBehind)
	k, err := p.r.ReadAt(buf[len(buf):n], p.base+lo+int64(len(buf)))
	buf = buf[:len(buf)+k]
	if errors.Is(err, io.EOF) {
		return buf, true, nil
	}
	if err != nil {
		return buf, false, fmt.Errorf("encode: read: %w", err)
	}
	return buf, false, nil
}

// finish leaves r at the end of the text, as reading it through would.
func (p *filePieces) finish() error {
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	if end < 0 {
		return nil // stopped before the end
	}
	if _, err := p.seek.Seek(p.base+end, io.SeekStart); err != nil {
		return fmt.Errorf("encode: seek past the text: %w", err)
	}
	return nil
}

// readJobs reads r into jobs from free, each cut at a safe point (or the
// whole text when it cannot be cut), and queues them on todo in order.
func (t *Tokenizer) readJobs(ctx context.Context, r io.Reader, free *jobPool, todo chan<- *streamJob) error {
	cut := t.cutRule()
	var carry []byte // text after the last cut, for the next job
	for seq := 0; ; seq++ {
		j := free.get(ctx)
		if j == nil {
			return ctx.Err()
		}
		j.seq = seq
		j.text = append(j.text[:0], carry...)
		eof := false
		searched := 0 // j.text's first bytes, searched for a cut and holding none
		for {
			if cut.ok && len(j.text) >= streamChunk {
				if p := cut.last(j.text, searched); p > 0 {
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
