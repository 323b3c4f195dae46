// Package tokenizer is kiln's byte-level BPE tokenizer. It reads the
// tokenizer.json files of HF tokenizers and gives the same ids as HF
// tokenizers 0.23.2 for every valid UTF-8 text; it also trains new
// vocabularies (Train) and writes them in the same format.
//
// Invalid UTF-8 is defined, not an error: byte-level BPE maps bytes, so
// EncodeBytes accepts any bytes. A byte that does not start a valid UTF-8
// sequence is pre-tokenized like a punctuation character and encoded as its
// byte symbol, and Decode returns the original bytes exactly:
// Decode(EncodeBytes(b)) == string(b) for every b. (HF's decode would
// replace such bytes with U+FFFD; kiln keeps them so that nothing is lost.)
package tokenizer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/text/unicode/norm"
)

const noID = ^uint32(0)

// stage is one step of the pre-tokenizer: an optional prefix space, then an
// optional split. The last stage is the ByteLevel one.
type stage struct {
	split       splitter
	prefixSpace bool
	byteLevel   bool
	// gpt4Digits, when set, says split is the GPT-4 pattern's scanner
	// with at most this many digits a word (3, or Qwen2's 1): as the last
	// split its words are looked up by splitWordsGPT4, in one loop.
	gpt4Digits int
	// gpt2 says split is the GPT-2 pattern's scanner: as the last split
	// its words are looked up by splitWordsGPT2, in one loop.
	gpt2 bool
}

type addedToken struct {
	id         uint32
	content    string
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// Tokenizer encodes and decodes text. It is safe for concurrent use.
type Tokenizer struct {
	sha256       func() string
	nfc          bool
	stages       []stage
	ignoreMerges bool
	unk          uint32
	fuseUnk      bool

	vocab     map[string]uint32 // token as written in tokenizer.json -> id
	vocabSize int
	vocabIDs  []uint64          // while a load reads added_tokens: a bit per id model.vocab gives
	byBytes   map[string]uint32 // token's bytes -> id, for ignore_merges
	byteID    [256]uint32
	merges    *mergeTable
	// What Decode and Token read, made by decodeTables on first use.
	decodeOnce sync.Once
	tokens     [][]byte // id -> bytes that Decode emits
	tokenStr   []string // id -> token as written in tokenizer.json

	added   []addedToken
	rawSet  *addedSet // added tokens matched on the text as given
	normSet *addedSet // added tokens matched after normalization
	isAdded map[uint32]bool
	isSpec  map[uint32]bool
	states  chan *encoderState
	// shared is the word table of the calls that encode on many cores
	// (EncodeBatch, EncodeReader), made by the first of them and replaced
	// by a larger one as it fills.
	shared     atomic.Pointer[sharedWords]
	sharedOnce sync.Once
	// long is the table of longer words for the same calls.
	long longTable
	// batchIDsPerKiB is the ids per 1024 bytes of text of the last
	// EncodeBatch, which sizes the next one's blocks (0 before the first).
	batchIDsPerKiB atomic.Int64
	// lastSplit is the stage whose words go to BPE as they are: the last
	// that splits, when the stages after it change nothing (GPT-4's Split
	// is followed by a ByteLevel that does not split), so that its words
	// skip a call per stage.
	lastSplit int
}

func (t *Tokenizer) init() {
	var raw, normed []addedToken
	t.isAdded = map[uint32]bool{}
	t.isSpec = map[uint32]bool{}
	for _, a := range t.added {
		if a.normalized && t.nfc {
			normed = append(normed, a)
		} else {
			raw = append(raw, a)
		}
		t.isAdded[a.id] = true
		if a.special {
			t.isSpec[a.id] = true
		}
	}
	t.rawSet, t.normSet = newAddedSet(raw), newAddedSet(normed)
	t.states = make(chan *encoderState, runtime.GOMAXPROCS(0)*2)
	t.lastSplit = len(t.stages) - 1
	for k := len(t.stages) - 1; k >= 0; k-- {
		if s := t.stages[k]; s.split != nil || s.prefixSpace {
			t.lastSplit = k
			break
		}
	}
}

// SHA256 is the hex SHA-256 of the tokenizer.json bytes, which token stores
// record to say which tokenizer made them.
func (t *Tokenizer) SHA256() string { return t.sha256() }

// VocabSize is one more than the largest id the tokenizer can emit,
// counting added tokens: the size an embedding table needs.
func (t *Tokenizer) VocabSize() int { return t.vocabSize }

// TokenID returns the id of a token as written in tokenizer.json (for
// example "<|endoftext|>" or "Ġthe").
func (t *Tokenizer) TokenID(tok string) (uint32, bool) {
	for _, a := range t.added {
		if a.content == tok {
			return a.id, true
		}
	}
	id, ok := t.vocab[tok]
	return id, ok
}

// Token returns the token with the given id as written in tokenizer.json,
// or "" for an id with no token.
func (t *Tokenizer) Token(id uint32) string {
	t.decodeTables()
	if int(id) >= len(t.tokenStr) {
		return ""
	}
	return t.tokenStr[id]
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id uint32) bool { return t.isSpec[id] }

// eosNames are end-of-text tokens of common tokenizers, most specific first.
var eosNames = []string{"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>", "<|eot_id|>"}

// IsEOSName reports whether name is one of the end-of-text tokens EOS
// looks for.
func IsEOSName(name string) bool { return slices.Contains(eosNames, name) }

// DroppedBytes lists the bytes that encoding drops from the text: those
// whose byte-level symbol the vocabulary lacks, where there is no unknown
// token to stand for them (HF's encoder drops them too, without a word).
// Every byte-level BPE that kiln or HF tokenizers trains holds all 256.
func (t *Tokenizer) DroppedBytes() []byte {
	if t.unk != noID {
		return nil
	}
	var out []byte
	for c, id := range t.byteID {
		if id == noID {
			out = append(out, byte(c))
		}
	}
	return out
}

// ByteSymbol is the character of the byte-level alphabet that stands for
// byte b in a vocabulary.
func ByteSymbol(b byte) string { return string(byteToRune[b]) }

// EOS returns the end-of-text token that separates documents in a token
// store: the first of the usual names (<|endoftext|>, <|end_of_text|>, </s>,
// <eos>, ...) that the tokenizer knows.
func (t *Tokenizer) EOS() (uint32, bool) {
	for _, name := range eosNames {
		if id, ok := t.TokenID(name); ok {
			return id, true
		}
	}
	return 0, false
}

// Encode returns the ids of s.
func (t *Tokenizer) Encode(s string) []uint32 {
	return t.AppendEncoded(nil, unsafe.Slice(unsafe.StringData(s), len(s)))
}

// EncodeBytes returns the ids of b, which need not be valid UTF-8 (see the
// package comment).
func (t *Tokenizer) EncodeBytes(b []byte) []uint32 { return t.AppendEncoded(nil, b) }

// AppendEncoded appends the ids of b to dst and returns it.
func (t *Tokenizer) AppendEncoded(dst []uint32, b []byte) []uint32 {
	st := t.getState()
	dst = st.encode(dst, b)
	t.putState(st)
	return dst
}

// AppendEncodedAmong is AppendEncoded for one of workers goroutines that
// encode with t at once, such as a pool that takes documents from a queue:
// with more than one, its words go through the tables t's workers share, as
// EncodeBatch's do, so that a word is merged once for all of them and one
// table, not one a goroutine, holds the words.
func (t *Tokenizer) AppendEncodedAmong(workers int, dst []uint32, b []byte) []uint32 {
	st := t.workerState(workers, 0)
	dst = st.encode(dst, b)
	t.putState(st)
	return dst
}

// EncodeBatch encodes documents on all cores; out[i] holds the ids of
// docs[i].
func (t *Tokenizer) EncodeBatch(docs []string) [][]uint32 {
	out := make([][]uint32, len(docs))
	var size int64
	for _, d := range docs {
		size += int64(len(d))
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), len(docs))
	room := t.batchRoom(size, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := t.workerState(workers, size)
			defer t.putState(st)
			// Each document is encoded straight into a block of ids the
			// worker's documents share: an allocation per megabyte of ids,
			// not per document, so that the collector, which held back all
			// cores when every document was an object, has almost nothing
			// to do. A block with room for an id a byte of the document
			// takes its ids without growing, unless a normalizer lengthened
			// the text; then append moves the block, and the documents
			// before keep their ids where they were.
			var block []uint32
			blockRoom := room
			for {
				i := int(next.Add(1) - 1)
				if i >= len(docs) {
					return
				}
				s := docs[i]
				if cap(block)-len(block) < len(s) {
					block = make([]uint32, 0, max(blockRoom, len(s)))
					// A worker that outgrows its share's room
					// takes a little more at a time.
					if room < batchBlock {
						blockRoom = room / 4
					}
				}
				n := len(block)
				block = st.encode(block, unsafe.Slice(unsafe.StringData(s), len(s)))
				// Capped at its length: an append to one document
				// reallocates rather than overwrite the next.
				out[i] = block[n:len(block):len(block)]
			}
		}()
	}
	wg.Wait()
	if size > 0 {
		var ids int64
		for _, o := range out {
			ids += int64(len(o))
		}
		t.batchIDsPerKiB.Store(max(1, ids<<10/size))
	}
	return out
}

// batchRoom is the ids a worker's first block has room for when workers
// encode size bytes between them: its share of the text at the ids per byte
// of the last batch (an id a byte before the first), and an eighth more, so
// that a worker whose share runs long rarely needs a second block, at most
// batchBlock. Blocks sized for a share, not at batchBlock each, keep the
// memory a call on many cores touches for the first time near one core's:
// on 16 cores 20 MB of text took 64 MiB of blocks for 37 MB of ids.
func (t *Tokenizer) batchRoom(size int64, workers int) int {
	perKiB := t.batchIDsPerKiB.Load()
	if perKiB == 0 {
		perKiB = 1 << 10
	}
	share := size / int64(max(workers, 1))
	return int(min(batchBlock, share*perKiB>>10*9/8))
}

// workerState is getState for one of workers goroutines encoding at
// once, textBytes of text between them (0 when unknown): with more than
// one, its words go through the shared table.
func (t *Tokenizer) workerState(workers int, textBytes int64) *encoderState {
	st := t.getState()
	if workers > 1 {
		st.words.share(t.sharedTable(textBytes))
	}
	return st
}

// sharedTable returns the Tokenizer's shared word table, made on first use:
// at its largest for a text of sharedWordsLargeText bytes or more, else at
// its smallest, to grow as it fills.
func (t *Tokenizer) sharedTable(textBytes int64) *sharedWords {
	t.sharedOnce.Do(func() {
		bits := sharedWordsMinBits
		if textBytes >= sharedWordsLargeText {
			bits = max(bits, sharedWordsMaxBits)
		}
		t.shared.Store(newSharedWords(bits, &t.shared))
	})
	return t.shared.Load()
}

// batchBlock is the size in ids of the blocks EncodeBatch copies
// documents' ids into (4 MiB).
const batchBlock = 1 << 20

// Decode returns the text of ids. Its bytes are exactly those encoded: for
// valid UTF-8 input that is HF's decode, and for invalid input it is the
// original bytes (see the package comment). An id outside the vocabulary is
// an error naming it.
func (t *Tokenizer) Decode(ids []uint32) (string, error) {
	b, err := t.AppendDecoded(nil, ids)
	return string(b), err
}

// AppendDecoded appends the bytes of ids to dst.
func (t *Tokenizer) AppendDecoded(dst []byte, ids []uint32) ([]byte, error) {
	t.decodeTables()
	for i, id := range ids {
		if int(id) >= len(t.tokens) || (t.tokens[id] == nil && t.tokenStr[id] == "") {
			return dst, fmt.Errorf("decode: id %d at position %d is not in the vocabulary of %d tokens", id, i, len(t.tokens))
		}
		dst = append(dst, t.tokens[id]...)
	}
	return dst, nil
}

func (t *Tokenizer) getState() *encoderState {
	select {
	case st := <-t.states:
		return st
	default:
		return newEncoderState(t)
	}
}

func newEncoderState(t *Tokenizer) *encoderState {
	st := &encoderState{t: t}
	st.words.init(wordTableMin)
	return st
}

func (t *Tokenizer) putState(st *encoderState) {
	select {
	case t.states <- st:
	default:
	}
}

// encoderState is one goroutine's scratch space and word cache. Each worker
// owns one, so the cache needs no lock.
type encoderState struct {
	t       *Tokenizer
	words   wordTable // words of up to maxPacked bytes -> ids
	long    longTable // longer words -> ids, when not shared
	ends    [][]int   // per stage
	syms    []uint32
	scratch mergeScratch
	// A bounded encode's (AppendEncodedBounded): the longest word it
	// merges (0: no bound), where its text lies in the document, and the
	// first word over the bound.
	maxWord int
	doc     docSpan
	tooLong *LongWordError
}

// encode runs added-token matching, normalization, pre-tokenization and BPE.
func (st *encoderState) encode(dst []uint32, b []byte) []uint32 {
	t := st.t
	if t.rawSet == nil {
		return st.encodeNormalized(dst, b)
	}
	return t.rawSet.split(b, dst, st.encodeNormalized)
}

func (st *encoderState) encodeNormalized(dst []uint32, b []byte) []uint32 {
	t := st.t
	if t.nfc && !norm.NFC.IsNormal(b) {
		nb := norm.NFC.Bytes(b)
		if st.maxWord > 0 {
			return st.encodeNormalCopy(dst, b, nb)
		}
		b = nb
	}
	return st.encodeNormal(dst, b)
}

// encodeNormal is encodeNormalized for normalized text.
func (st *encoderState) encodeNormal(dst []uint32, b []byte) []uint32 {
	t := st.t
	if t.normSet == nil {
		return st.pretokenize(dst, b, 0)
	}
	return t.normSet.split(b, dst, func(dst []uint32, seg []byte) []uint32 {
		return st.pretokenize(dst, seg, 0)
	})
}

// pretokenize runs stage k and the ones after it on piece.
func (st *encoderState) pretokenize(dst []uint32, piece []byte, k int) []uint32 {
	if len(piece) == 0 {
		return dst
	}
	t := st.t
	if k == len(t.stages) {
		return st.word(dst, piece)
	}
	s := t.stages[k]
	if s.prefixSpace && piece[0] != ' ' {
		spaced := append([]byte{' '}, piece...)
		if st.maxWord > 0 {
			return st.pretokenizeSpaced(dst, piece, spaced, k)
		}
		piece = spaced
	}
	if s.split == nil {
		return st.pretokenize(dst, piece, k+1)
	}
	for len(st.ends) <= k {
		st.ends = append(st.ends, nil)
	}
	if k == t.lastSplit {
		if s.gpt4Digits > 0 {
			return st.splitWordsGPT4(dst, piece, s.gpt4Digits)
		}
		if s.gpt2 {
			return st.splitWordsGPT2(dst, piece)
		}
		return st.splitWords(dst, piece, s.split, k)
	}
	for start := 0; start < len(piece); {
		ends := s.split(piece, start, st.ends[k][:0])
		st.ends[k] = ends
		for _, e := range ends {
			dst = st.pretokenize(dst, piece[start:e], k+1)
			start = e
		}
	}
	return dst
}

// splitWords encodes the words split cuts piece into. A word of up to 15 bytes
// that the hot table holds, most words of any text, is looked up and
// emitted here without a call; word does the rest.
func (st *encoderState) splitWords(dst []uint32, piece []byte, split splitter, k int) []uint32 {
	hot := st.words.hot
	for start := 0; start < len(piece); {
		ends := split(piece, start, st.ends[k][:0])
		st.ends[k] = ends
		for _, e := range ends {
			w := piece[start:e]
			start = e
			if len(w) <= maxPacked && cap(w) >= 16 {
				k0, k1 := packInPlace(w)
				h := &hot[hashWord(k0, k1)>>(64-hotBits)]
				if h.k0 == k0 && h.k1 == k1 {
					if lo, hi := uint32(h.v), uint32(h.v>>32); lo&inArena == 0 {
						if hi == noID {
							dst = append(dst, lo)
						} else {
							dst = append(dst, lo, hi)
						}
						continue
					}
				}
			}
			dst = st.word(dst, w)
		}
	}
	return dst
}

// splitWordsGPT4 is splitWords for the GPT-4 pattern (and Qwen2's, with
// digits 1): the splitter's ASCII path and the hot table's lookup in one
// loop, with no offsets stored and read back between them. Scanning and
// looking up took about 190 instructions a word through splitGPT4 and
// splitWords.
func (st *encoderState) splitWordsGPT4(dst []uint32, b []byte, digits int) []uint32 {
	hot := st.words.hot
	// The ids go into out, dst to its capacity, up to m: one test a word
	// for room, and no slice to rebuild.
	out, m := dst[:cap(dst)], len(dst)
	i := 0
	for i+16 <= len(b) {
		// The 16 bytes at i, read once: the splitter's tests and the
		// word's key come from them, with no bounds checks (the loop's
		// test is theirs: slicing b tested it again, and masked the
		// pointer, 8 instructions a word).
		w := (*[16]byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i))
		x0 := binary.LittleEndian.Uint64(w[:8])
		x1 := binary.LittleEndian.Uint64(w[8:])
		// The word's length, as gpt4Len finds it (the tests hold both
		// to the general scan), with no call for the words that end
		// in the 16 bytes with an ASCII byte; n stays 0 for the others.
		n := 0
		if k0, k1 := gpt4Kind[w[0]], gpt4Kind[w[1]]; k0 == kLetter || k1 == kLetter && k0 <= kBlank {
			// Past byte 0, the first letter or the prefix: byte 1 is
			// then a letter.
			if stop := nonLetterLanes(x0) &^ 0xff; stop != 0 {
				if stop&-stop&x0 == 0 {
					n = bits.TrailingZeros64(stop) / 8
				}
			} else if stop = nonLetterLanes(x1); stop != 0 && stop&-stop&x1 == 0 {
				n = 8 + bits.TrailingZeros64(stop)/8
			}
		} else {
			n = gpt4ShortLen(w, k0, k1, digits)
		}
		if n == 0 {
			n = gpt4Len(b, i, digits)
		}
		if n <= maxPacked {
			// The word's key, as packInPlace makes it.
			pm := &packMasks[n&15]
			k0, k1 := x0&pm[0], x1&pm[1]|uint64(n)<<56
			if h := &hot[hashWord(k0, k1)>>(64-hotBits)]; h.k0 == k0 && h.k1 == k1 {
				if lo, hi := uint32(h.v), uint32(h.v>>32); lo&inArena == 0 && m+2 <= len(out) {
					// One id or two: both stored, the count set by
					// whether the second is noID (ids are below 1<<31).
					out[m], out[m+1] = lo, hi
					m += 2 - int(hi>>31)
				} else {
					// Three ids or more, from the table's arena
					// (word would hash the word again).
					dst = st.words.appendIDs(out[:m], h.v)
					out, m = dst[:cap(dst)], len(dst)
				}
				i += n
				continue
			}
		}
		dst = st.word(out[:m], b[i:i+n])
		out, m = dst[:cap(dst)], len(dst)
		i += n
	}
	dst = out[:m]
	for i < len(b) {
		e := gpt4WordEnd(b, i, digits)
		dst = st.word(dst, b[i:e])
		i = e
	}
	return dst
}

// splitWordsGPT2 is splitWordsGPT4 for the GPT-2 pattern: gpt2Len's ASCII
// path and the hot table's lookup in one loop. A copy of that loop, not a
// loop shared through a function value or a flag: the word's length must
// be found inline, with no call, for the loop to gain (splitGPT2 and
// splitWords took about 190 instructions a word).
func (st *encoderState) splitWordsGPT2(dst []uint32, b []byte) []uint32 {
	hot := st.words.hot
	out, m := dst[:cap(dst)], len(dst)
	i := 0
	for i+16 <= len(b) {
		w := (*[16]byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), i))
		x0 := binary.LittleEndian.Uint64(w[:8])
		x1 := binary.LittleEndian.Uint64(w[8:])
		// The word's length, as gpt2Len finds it (the tests hold both
		// to the general scan), with no call for the words that end
		// in the 16 bytes with an ASCII byte; n stays 0 for the others.
		n := 0
		if k0, k1 := gpt4Kind[w[0]], gpt4Kind[w[1]]; k0 == kLetter || k0 == kSpace && k1 == kLetter {
			if stop := nonLetterLanes(x0) &^ 0xff; stop != 0 {
				if stop&-stop&x0 == 0 {
					n = bits.TrailingZeros64(stop) / 8
				}
			} else if stop = nonLetterLanes(x1); stop != 0 && stop&-stop&x1 == 0 {
				n = 8 + bits.TrailingZeros64(stop)/8
			}
		} else {
			n = gpt2ShortLen(w, k0, k1)
		}
		if n == 0 {
			n = gpt2Len(b, i)
		}
		if n <= maxPacked {
			pm := &packMasks[n&15]
			k0, k1 := x0&pm[0], x1&pm[1]|uint64(n)<<56
			if h := &hot[hashWord(k0, k1)>>(64-hotBits)]; h.k0 == k0 && h.k1 == k1 {
				if lo, hi := uint32(h.v), uint32(h.v>>32); lo&inArena == 0 && m+2 <= len(out) {
					out[m], out[m+1] = lo, hi
					m += 2 - int(hi>>31)
				} else {
					dst = st.words.appendIDs(out[:m], h.v)
					out, m = dst[:cap(dst)], len(dst)
				}
				i += n
				continue
			}
		}
		dst = st.word(out[:m], b[i:i+n])
		out, m = dst[:cap(dst)], len(dst)
		i += n
	}
	dst = out[:m]
	for i < len(b) {
		e := gpt2WordEnd(b, i)
		dst = st.word(dst, b[i:e])
		i = e
	}
	return dst
}

// packMasks[n] keeps the bytes of a word of n bytes in the two halves of
// its key: byteMask[min(n, 8)] and byteMask[n-min(n, 8)].
var packMasks = func() (m [16][2]uint64) {
	for n := range m {
		n0 := min(n, 8)
		m[n] = [2]uint64{byteMask[n0], byteMask[n-n0]}
	}
	return m
}()

// maxCachedWord bounds the words kept in the long words' table. Words of
// up to 1 KiB are kept: runs such as a comment's line of 70 dashes recur,
// and a word of 64 bytes and up, not kept before, was a quarter of the
// merging on Go sources (a run's merge takes time that grows as its length
// squared).
const maxCachedWord = 1 << 10

// word appends the ids of one pre-tokenized word.
func (st *encoderState) word(dst []uint32, w []byte) []uint32 {
	if len(w) <= maxPacked {
		var k0, k1 uint64
		if cap(w) >= 16 {
			k0, k1 = packInPlace(w)
		} else {
			k0, k1 = packWord(w)
		}
		c := &st.words
		hh := hashWord(k0, k1)
		hot := &c.hot[hh>>(64-hotBits)]
		if hot.k1 == k1 && hot.k0 == k0 {
			return c.appendIDs(dst, hot.v)
		}
		var sh uint64 // where the shared table's lookup ended
		if s := c.shared; s != nil {
			if cur := s.cur.Load(); cur != s {
				c.share(cur) // it grew
				s = cur
			}
			v, h, ok := s.get(hh, k0, k1)
			if ok {
				*hot = wordSlot{k0, k1, v}
				return c.appendIDs(dst, v)
			}
			sh = h
		}
		h := hh >> c.shift
		for ; ; h = (h + 1) & c.mask {
			e := &c.slots[h]
			if e.k1 == k1 && e.k0 == k0 {
				*hot = *e
				return c.appendIDs(dst, e.v)
			}
			if e.k1 == 0 {
				break
			}
		}
		start := len(dst)
		dst = st.merge(dst, w)
		if s := c.shared; s != nil {
			if v, ok := s.put(sh, k0, k1, dst[start:]); ok {
				*hot = wordSlot{k0, k1, v}
				return dst
			}
		}
		if c.put(h, k0, k1, dst[start:]) {
			*hot = c.slots[h]
		}
		return dst
	}
	if st.maxWord > 0 && len(w) > st.maxWord {
		return st.refuse(dst, w)
	}
	if len(w) > maxCachedWord {
		return st.merge(dst, w)
	}
	lt := &st.long
	if st.words.shared != nil {
		// One of many workers: the table they share.
		lt = &st.t.long
	}
	if ids, ok := lt.get(w); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = st.merge(dst, w)
	lt.put(w, dst[start:])
	return dst
}

// merge appends the ids of w from the BPE merges, no cache involved.
func (st *encoderState) merge(dst []uint32, w []byte) []uint32 {
	t := st.t
	if t.ignoreMerges {
		// With ignore_merges a word that is itself a token is emitted
		// whole (Llama-3 sets it).
		if id, ok := t.byBytes[string(w)]; ok {
			return append(dst, id)
		}
	}
	syms := st.syms[:0]
	if cap(syms) < len(w) {
		// At most a symbol a byte: made at that, not grown by append
		// through copies that a long word left behind (the room of
		// 4*longWord symbols is then kept for the words after).
		syms = make([]uint32, 0, max(len(w), 4*longWord))
	}
	for _, c := range w {
		id := t.byteID[c]
		if id == noID {
			// HF drops a character missing from the vocabulary unless
			// there is an unknown token.
			if t.unk == noID {
				continue
			}
			if t.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == t.unk {
				continue
			}
			id = t.unk
		}
		syms = append(syms, id)
	}
	syms = t.merges.mergeWith(syms, &st.scratch)
	dst = append(dst, syms...)
	if cap(syms) <= 4*longWord {
		st.syms = syms[:0]
	}
	return dst
}

// wordTable caches the ids of words of up to maxPacked bytes, the words
// that make up nearly all text (" the", "if", "():", "\n\t\t"): an
// open-addressing table keyed by the word's bytes packed with its length
// into two integers, so that a lookup is a multiply, a load and two
// compares, with the ids of most words in the slot itself. A Go map keyed
// by the word's string spent a quarter of the encoder's time hashing and
// comparing bytes (docs/benchmarks/tokenizer.md).
type wordTable struct {
	// hot is a direct-mapped copy of the words met last, small enough to
	// stay in the core's own cache: the table itself grows to megabytes,
	// and its lookups waited on memory more than they computed. 384 KiB
	// fits the second-level cache of current x86 cores (512 KiB to 2 MiB);
	// at 96 KiB, code and prose mixed evicted words their text met again
	// soon (docs/benchmarks/tokenizer.md, "The hot table four times larger").
	hot   *[1 << hotBits]wordSlot
	slots []wordSlot
	mask  uint64
	shift uint8
	n     int      // words held
	ids   []uint32 // ids of words of three ids or more
	// shared, when set, is looked up after hot and filled before slots,
	// which then hold only the words that did not fit in it; sharedIDs is
	// its ids, which a hot slot's v may point into.
	shared    *sharedWords
	sharedIDs []uint32
}

// maxPacked is the longest word a wordTable holds: 15 bytes, the length in
// the top byte of k1.
const maxPacked = 15

type wordSlot struct {
	k0, k1 uint64 // the word's bytes and length; k1 == 0 marks an empty slot
	// v is id0 | id1<<32 (id1 noID for a word of one id), or, with the
	// top bit of its low half set, the offset of the ids in the table's
	// ids (the shared table's, with inShared set too) and their count in
	// the high half.
	v uint64
}

const (
	wordTableMin = 1 << 12
	inArena      = 1 << 31
	inShared     = 1 << 30
	hotBits      = 14 // 16,384 slots, 384 KiB
)

// wordTableMax bounds a table at 24 MiB per encoder; a full one starts
// over. A variable for tests.
var wordTableMax = 1 << 20

// byteMask[n] keeps the low n bytes of a word (n up to 8). A table: a
// shift by a variable count costs Go several instructions for the case of
// a count of 64 or more, and the packing is done for every word.
var byteMask = [16]uint64{0, 0xff, 0xffff, 0xff_ffff, 0xffff_ffff, 0xff_ffff_ffff, 0xffff_ffff_ffff, 0xff_ffff_ffff_ffff, ^uint64(0)}

// packWord packs a word of 1 to maxPacked bytes and its length into two
// integers, distinct for distinct words.
func packWord(w []byte) (k0, k1 uint64) {
	if cap(w) < 16 {
		var b [16]byte
		copy(b[:], w)
		w = b[:len(w)]
	}
	return packInPlace(w)
}

// packInPlace is packWord for a word with 16 bytes from its start, as a
// word inside its document has: it reads them at once and keeps its own.
// Small enough to be inlined, for the lookups of every word.
func packInPlace(w []byte) (k0, k1 uint64) {
	n := len(w)
	w16 := w[:16:16]
	k0 = binary.LittleEndian.Uint64(w16)
	k1 = binary.LittleEndian.Uint64(w16[8:])
	n0 := min(n, 8)
	return k0 & byteMask[n0&15], k1&byteMask[(n-n0)&15] | uint64(n)<<56
}

// hashWord is the word (k0, k1)'s hash; its top bits pick a slot.
func hashWord(k0, k1 uint64) uint64 { return (k0*0x9E3779B97F4A7C15 ^ k1) * 0xBF58476D1CE4E5B9 }

func (c *wordTable) slot(k0, k1 uint64) uint64 {
	return hashWord(k0, k1) >> c.shift
}

func (c *wordTable) init(size int) {
	if c.hot == nil {
		c.hot = new([1 << hotBits]wordSlot)
	} else {
		clear(c.hot[:]) // its slots may point into ids, reset below
	}
	c.slots = make([]wordSlot, size)
	c.mask = uint64(size - 1)
	c.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	c.n = 0
	c.ids = c.ids[:0]
}

func (c *wordTable) appendIDs(dst []uint32, v uint64) []uint32 {
	lo, hi := uint32(v), uint32(v>>32)
	switch {
	case lo&inArena != 0:
		off := lo &^ (inArena | inShared)
		if lo&inShared != 0 {
			return append(dst, c.sharedIDs[off:off+hi]...)
		}
		return append(dst, c.ids[off:off+hi]...)
	case hi == noID:
		return append(dst, lo)
	}
	return append(dst, lo, hi)
}

// idsValue is a word slot's v for ids: one or two ids packed in it, or,
// for none or more than two, arena (inArena, with inShared for the shared
// table's ids) with the ids' count and their offset off in the arena.
func idsValue(ids []uint32, off, arena uint64) uint64 {
	switch len(ids) {
	case 0:
		return arena // a word of characters the vocabulary lacks
	case 1:
		return uint64(ids[0]) | uint64(noID)<<32
	case 2:
		return uint64(ids[0]) | uint64(ids[1])<<32
	}
	return off | arena | uint64(len(ids))<<32
}

// put stores ids for the word (k0, k1) in the empty slot h, where its
// lookup ended. It reports whether the word is in slot h afterwards (not
// when the table grew or started over).
func (c *wordTable) put(h, k0, k1 uint64, ids []uint32) bool {
	v := idsValue(ids, uint64(len(c.ids)), inArena)
	if len(ids) > 2 {
		c.ids = append(c.ids, ids...)
	}
	c.slots[h] = wordSlot{k0, k1, v}
	c.n++
	if 2*c.n <= len(c.slots) {
		return true
	}
	// Half full: double, or start over at the limit.
	old := c.slots
	if len(old) >= wordTableMax {
		c.init(wordTableMin)
		return false
	}
	c.slots = make([]wordSlot, 2*len(old))
	c.mask = uint64(len(c.slots) - 1)
	c.shift--
	for _, e := range old {
		if e.k1 == 0 {
			continue
		}
		h := c.slot(e.k0, e.k1)
		for c.slots[h].k1 != 0 {
			h = (h + 1) & c.mask
		}
		c.slots[h] = e
	}
	return false
}

// addedSet finds added tokens in text, leftmost first and longest first at
// one position, as HF's Aho-Corasick matcher does.
type addedSet struct {
	byFirst [256][]addedToken // sorted longest first
	first   []byte            // distinct first bytes
}

func newAddedSet(tokens []addedToken) *addedSet {
	if len(tokens) == 0 {
		return nil
	}
	s := &addedSet{}
	for _, a := range tokens {
		c := a.content[0]
		if len(s.byFirst[c]) == 0 {
			s.first = append(s.first, c)
		}
		s.byFirst[c] = append(s.byFirst[c], a)
	}
	for _, l := range s.byFirst {
		for i := 1; i < len(l); i++ {
			for j := i; j > 0 && len(l[j].content) > len(l[j-1].content); j-- {
				l[j], l[j-1] = l[j-1], l[j]
			}
		}
	}
	return s
}

// find returns the leftmost-longest match in b at or after from. A nil set
// (no added tokens) matches nothing.
func (s *addedSet) find(b []byte, from int) (start, end int, tok *addedToken) {
	if s == nil {
		return -1, -1, nil
	}
	for i := from; i < len(b); i++ {
		if len(s.first) == 1 {
			j := bytes.IndexByte(b[i:], s.first[0])
			if j < 0 {
				return -1, -1, nil
			}
			i += j
		}
		l := s.byFirst[b[i]]
		for k := range l {
			if bytes.HasPrefix(b[i:], []byte(l[k].content)) {
				return i, i + len(l[k].content), &l[k]
			}
		}
	}
	return -1, -1, nil
}

// split encodes the text between added tokens with enc and emits each added
// token's id, widening a match over neighbouring whitespace when the token
// asks for lstrip or rstrip.
func (s *addedSet) split(b []byte, dst []uint32, enc func([]uint32, []byte) []uint32) []uint32 {
	prev := 0
	for pos := 0; pos < len(b); {
		start, end, tok := s.find(b, pos)
		if tok == nil {
			break
		}
		if tok.lstrip {
			for start > prev {
				r, w := utf8.DecodeLastRune(b[prev:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= w
			}
		}
		if tok.rstrip {
			for end < len(b) {
				r, w := utf8.DecodeRune(b[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += w
			}
		}
		dst = enc(dst, b[prev:start])
		dst = append(dst, tok.id)
		prev, pos = end, end
	}
	return enc(dst, b[prev:])
}
