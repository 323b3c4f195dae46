package tokenizer

import (
	"fmt"
	"unsafe"
)

// DefaultMaxWordBytes is the bound on a word's length in bytes for
// ingest's encoders (AppendEncodedAmongBounded): a document with a longer
// word is refused, not merged. A word is one pre-token, a run of letters,
// digits, punctuation or whitespace, so only a run of one class of
// character with nothing between comes near it: the longest words of
// 39,000 text files (430 MB: the Go 1.26 tree, Python 3.11's library and a
// Go module cache) were a JSON parser's test of 250,000 bytes of `[{"":`
// and, under the GPT-2 pattern, which does not cut digits in threes, the
// 100,000 digits of e. What goes past a megabyte is data in a text file:
// padding, a dump, a document of 16 MiB of spaces. A word at the bound
// takes 16 MB and 150-270 ms to merge (letters, spaces; mergeHeap, on a
// 2-vCPU VM), so that a worker merging one on each of 16 cores stays well
// under its 1 GiB; past it the merge grows with the word (16 MiB of
// spaces: 290 MB and 6 s, and 1.2 GB before mergeHeap was made smaller).
const DefaultMaxWordBytes = 1 << 20

// LongWordError is the error of a bounded encode (AppendEncodedBounded)
// for a document with a word longer than its bound: the first such word.
type LongWordError struct {
	// Offset is the word's first byte in the document. For a tokenizer
	// that normalizes text (NFC), it counts the normalized text's bytes
	// where the normalizer changed the document; where the pre-tokenizer
	// adds a space before a piece (add_prefix_space), a word that starts
	// with that space is given the piece's first byte.
	Offset int
	// Length is the word's length in bytes, as encoded: normalized, with
	// an added space.
	Length int
	// Max is the bound it is over.
	Max int
}

func (e *LongWordError) Error() string {
	return fmt.Sprintf("encode: the word of %d bytes at byte %d of the document is longer than the %d bytes a word may have; skip the document (a word that long is a run of one kind of character: data, not text)", e.Length, e.Offset, e.Max)
}

// AppendEncodedBounded is AppendEncoded for a document whose words may
// run to any length: a word longer than maxWord bytes is not merged, and
// the document's ids are not appended; dst comes back as it was, with a
// *LongWordError naming the first such word. The other documents' ids
// are AppendEncoded's, the same for every bound. maxWord is at least 15
// (DefaultMaxWordBytes for ingest); a smaller one is an error.
func (t *Tokenizer) AppendEncodedBounded(dst []uint32, b []byte, maxWord int) ([]uint32, error) {
	return t.AppendEncodedAmongBounded(1, dst, b, maxWord)
}

// AppendEncodedAmongBounded is AppendEncodedBounded for one of workers
// goroutines that encode with t at once (AppendEncodedAmong).
func (t *Tokenizer) AppendEncodedAmongBounded(workers int, dst []uint32, b []byte, maxWord int) ([]uint32, error) {
	if maxWord < maxPacked {
		// The word tables answer for shorter words before any bound is
		// looked at.
		return dst, fmt.Errorf("encode: a word bound of %d bytes is below %d, the shortest the encoder can bound (it looks shorter words up first)", maxWord, maxPacked)
	}
	st := t.workerState(workers, 0)
	st.maxWord, st.doc = maxWord, docSpan{text: b}
	ids := st.encode(dst, b)
	long := st.tooLong
	st.maxWord, st.doc, st.tooLong = 0, docSpan{}, nil
	t.putState(st)
	if long != nil {
		// The words after it were encoded, and any longer one skipped:
		// a pass over the text, not stopped by a test in every word's
		// loop, at no more than the cost of the ids of a document kept.
		return dst, long
	}
	return ids, nil
}

// refuse notes w, a word over the bound of a bounded encode, unless an
// earlier one was, and returns dst, with nothing appended for w. Not
// inlined: word's frame, which every word that reaches it pays for, stays
// as it was without a bound.
//
//go:noinline
func (st *encoderState) refuse(dst []uint32, w []byte) []uint32 {
	if st.tooLong == nil {
		st.tooLong = &LongWordError{Offset: st.doc.offset(w), Length: len(w), Max: st.maxWord}
	}
	return dst
}

// encodeNormalCopy is encodeNormal of nb, the normalized text of b, in a
// bounded encode: its words' offsets are nb's, from b's. Not inlined, as
// refuse, to leave its caller as it was.
//
//go:noinline
func (st *encoderState) encodeNormalCopy(dst []uint32, b, nb []byte) []uint32 {
	doc := st.doc
	st.doc = doc.within(b, nb, false)
	dst = st.encodeNormal(dst, nb)
	st.doc = doc
	return dst
}

// pretokenizeSpaced is pretokenize of spaced, piece with a space added
// before it, from stage k, in a bounded encode: its words' offsets are
// piece's, less the space. Not inlined, as refuse.
//
//go:noinline
func (st *encoderState) pretokenizeSpaced(dst []uint32, piece, spaced []byte, k int) []uint32 {
	doc := st.doc
	st.doc = doc.within(piece, spaced, true)
	dst = st.pretokenize(dst, spaced, k)
	st.doc = doc
	return dst
}

// docSpan is where the text being encoded lies in the document, for a
// LongWordError's offset: text[i] is the document's byte off+i, or with
// spaced set, text[0] is a space the pre-tokenizer added before byte off.
type docSpan struct {
	text   []byte
	off    int
	spaced bool
}

// offset is the offset in the document of w, a word within d.text: -1,
// which should not happen, for one outside.
func (d docSpan) offset(w []byte) int {
	p := int(uintptr(unsafe.Pointer(unsafe.SliceData(w))) - uintptr(unsafe.Pointer(unsafe.SliceData(d.text))))
	if p < 0 || p >= len(d.text) {
		return -1
	}
	if d.spaced {
		return d.off + max(p-1, 0)
	}
	return d.off + p
}

// within is the span of text, which holds the bytes of the piece p of d
// from its start on, in another buffer: a normalized copy (spaced false)
// or one with a space before them (true).
func (d docSpan) within(p, text []byte, spaced bool) docSpan {
	off := d.offset(p)
	if off < 0 {
		return docSpan{} // every offset in it unknown too
	}
	return docSpan{text: text, off: off, spaced: spaced}
}
