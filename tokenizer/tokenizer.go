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
	sha256       string
	nfc          bool
	stages       []stage
	ignoreMerges bool
	unk          uint32
	fuseUnk      bool

	vocab    map[string]uint32 // token as written in tokenizer.json -> id
	byBytes  map[string]uint32 // token's bytes -> id, for ignore_merges
	tokens   [][]byte          // id -> bytes that Decode emits
	tokenStr []string          // id -> token as written in tokenizer.json
	byteID   [256]uint32
	merges   *mergeTable

	added    []addedToken
	rawSet   *addedSet // added tokens matched on the text as given
	normSet  *addedSet // added tokens matched after normalization
	isAdded  map[uint32]bool
	isSpec   map[uint32]bool
	states   chan *encoderState
	maxCache int
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
	t.maxCache = 1 << 17
}

// SHA256 is the hex SHA-256 of the tokenizer.json bytes, which token stores
// record to say which tokenizer made them.
func (t *Tokenizer) SHA256() string { return t.sha256 }

// VocabSize is one more than the largest id the tokenizer can emit,
// counting added tokens: the size an embedding table needs.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

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
	if int(id) >= len(t.tokenStr) {
		return ""
	}
	return t.tokenStr[id]
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id uint32) bool { return t.isSpec[id] }

// eosNames are end-of-text tokens of common tokenizers, most specific first.
var eosNames = []string{"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eos|>", "<|im_end|>", "<|eot_id|>"}

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

// EncodeBatch encodes documents on all cores; out[i] holds the ids of
// docs[i].
func (t *Tokenizer) EncodeBatch(docs []string) [][]uint32 {
	out := make([][]uint32, len(docs))
	var next atomic.Int64
	var wg sync.WaitGroup
	workers := min(runtime.GOMAXPROCS(0), len(docs))
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st := t.getState()
			defer t.putState(st)
			// Each document is encoded into one buffer that grows once,
			// then copied out at its size: one allocation a document,
			// not the doublings of a slice grown id by id.
			var buf []uint32
			for {
				i := int(next.Add(1) - 1)
				if i >= len(docs) {
					return
				}
				s := docs[i]
				buf = st.encode(buf[:0], unsafe.Slice(unsafe.StringData(s), len(s)))
				out[i] = slices.Clone(buf)
			}
		}()
	}
	wg.Wait()
	return out
}

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
		return &encoderState{t: t, short: new(shortWords), cache: make(map[string][]uint32, 1024)}
	}
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
	t     *Tokenizer
	short *shortWords         // words of up to 7 bytes and 2 ids, looked up first
	cache map[string][]uint32 // word bytes -> ids
	arena []uint32            // backing store for cached ids
	ends  [][]int             // per stage
	syms  []uint32
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
		b = norm.NFC.Bytes(b)
	}
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
		piece = append([]byte{' '}, piece...)
	}
	if s.split == nil {
		return st.pretokenize(dst, piece, k+1)
	}
	for len(st.ends) <= k {
		st.ends = append(st.ends, nil)
	}
	ends := s.split(piece, st.ends[k][:0])
	st.ends[k] = ends
	start := 0
	last := k+1 == len(t.stages)
	for _, e := range ends {
		if last {
			dst = st.word(dst, piece[start:e])
		} else {
			dst = st.pretokenize(dst, piece[start:e], k+1)
		}
		start = e
	}
	return dst
}

// maxCachedWord bounds the words kept in the cache; longer ones are rare
// and would make the cache's memory unbounded.
const maxCachedWord = 64

// word appends the ids of one pre-tokenized word.
func (st *encoderState) word(dst []uint32, w []byte) []uint32 {
	key, short := shortKey(w)
	if short {
		if e := &st.short[shortSlot(key)]; e.key == key {
			if e.ids[1] == noID {
				return append(dst, e.ids[0])
			}
			return append(dst, e.ids[0], e.ids[1])
		}
	}
	if ids, ok := st.cache[string(w)]; ok {
		if short {
			st.short.put(key, ids)
		}
		return append(dst, ids...)
	}
	t := st.t
	start := len(dst)
	if id, ok := t.byBytes[string(w)]; t.ignoreMerges && ok {
		// With ignore_merges a word that is itself a token is emitted
		// whole (Llama-3 sets it).
		dst = append(dst, id)
	} else {
		syms := st.syms[:0]
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
		syms = t.merges.merge(syms)
		dst = append(dst, syms...)
		if cap(syms) <= 4*longWord {
			st.syms = syms[:0]
		}
	}
	if len(w) <= maxCachedWord {
		if len(st.cache) >= t.maxCache {
			clear(st.cache)
			st.arena = nil
		}
		ids := dst[start:]
		if cap(st.arena)-len(st.arena) < len(ids) {
			st.arena = make([]uint32, 0, 1<<14)
		}
		n := len(st.arena)
		st.arena = append(st.arena, ids...)
		st.cache[string(w)] = st.arena[n:len(st.arena):len(st.arena)]
		if short {
			st.short.put(key, ids)
		}
	}
	return dst
}

// shortWords is a direct-mapped table in front of the word cache, for the
// words that make up most text (" the", "if", "():"): up to 7 bytes, packed
// with their length into one integer, and up to 2 ids, so that a lookup is
// a multiply, a load and a compare on a table that stays in the core's own
// cache, where the map's was a hash of the bytes, a probe and a compare of
// the bytes (a quarter of ingest's CPU, docs/benchmarks/tokenizer.md). Two
// words in one slot take turns; a miss falls back to the map.
type shortWords [1 << shortBits]shortWord

const shortBits = 13 // 8192 slots, 128 KiB

type shortWord struct {
	key uint64    // 0: empty (no word is empty)
	ids [2]uint32 // ids[1] is noID for a word of one id
}

// shortKey packs a word of 1 to 7 bytes and its length into one integer,
// distinct for distinct words; ok is false for a longer word.
func shortKey(w []byte) (key uint64, ok bool) {
	if len(w) == 0 || len(w) > 7 {
		return 0, false
	}
	var b uint64
	if cap(w) >= 8 {
		// The word sits inside its document: read the 8 bytes from its
		// start at once and keep its own.
		b = binary.LittleEndian.Uint64(w[:8]) & (1<<(8*len(w)) - 1)
	} else {
		for i, c := range w {
			b |= uint64(c) << (8 * i)
		}
	}
	return uint64(len(w))<<56 | b, true
}

func shortSlot(key uint64) uint64 { return (key * 0x9e3779b97f4a7c15) >> (64 - shortBits) }

// put remembers ids for key if they fit: one or two ids.
func (t *shortWords) put(key uint64, ids []uint32) {
	switch len(ids) {
	case 1:
		t[shortSlot(key)] = shortWord{key: key, ids: [2]uint32{ids[0], noID}}
	case 2:
		t[shortSlot(key)] = shortWord{key: key, ids: [2]uint32{ids[0], ids[1]}}
	}
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

// find returns the leftmost-longest match in b at or after from.
func (s *addedSet) find(b []byte, from int) (start, end int, tok *addedToken) {
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
