package tokenizer

import (
	"hash/maphash"
	"sync/atomic"
)

// longWords holds the ids of words too long for a word slot (more than
// maxPacked bytes, up to maxCachedWord): a Go import path, an identifier
// in camel case, a comment's line of dashes. Their merges are the dearest
// (a word's merge takes time that grows as its length squared), so each is
// merged once and then looked up.
//
// It holds no pointer the collector must follow: the slots are integers,
// the words' bytes and their ids lie in two arenas, and a slot names its
// word and ids by offset. Sixteen workers, each with a map of strings to
// slices for these words, gave the collector 12-17 ms of marking a cycle
// against 1.5-1.9 on one worker, on the GPU host's EncodeBatch of 20 MB of
// Go: a cycle a call, a tenth of the CPU time the call took.
//
// One table serves an encoder on its own, or all the workers of one
// Tokenizer at once (longTable), so that a word that sixteen workers
// meet is merged once: on 200 MB of Go and prose, 16 workers each with its
// own merged 140,739 GPT-2-style words, 36,873 of them long, against one
// worker's 109,472 (5,625 long). A slot is written once, in the order of
// sharedWords': its hash is claimed with a compare-and-swap, the word and
// its ids are copied to space claimed in the arenas and named in the slot,
// and the hash is then published, so a reader that sees a word's hash sees
// the rest. A word two workers merge at once may be held twice, with the
// same ids. A table takes words until half its slots or either arena is
// claimed; its longTable then replaces it with an empty one four times
// the size, or of the same size at longWordsMaxBits, and the words are
// merged again as they come.
type longWords struct {
	seed  maphash.Seed
	slots []longSlot
	shift uint8
	bits  int
	text  []byte   // the words' bytes
	ids   []uint32 // their ids
	// The counters every insert updates, on a cache line of their own.
	_     [64]byte
	n     atomic.Int64 // slots claimed
	ntext atomic.Int64 // bytes of text claimed
	nids  atomic.Int64 // ids claimed
}

type longSlot struct {
	h    atomic.Uint64 // 0: empty; longBusy: being written; else the word's hash, odd
	word uint64        // offset in text << 16 | length
	ids  uint64        // offset in ids << 16 | count
}

const longBusy = 2

// longWordsMinBits and longWordsMaxBits bound a table's slots: 1<<10 (24
// KiB, and arenas of 16 KiB and 4K ids) for an encoder that meets few long
// words, up to 1<<18 (6 MiB of slots, 4 MiB of text and 1M ids, room for
// 131,072 words of 32 bytes and 8 ids). A variable for tests.
const longWordsMinBits = 10

var longWordsMaxBits = 18

func newLongWords(bits int) *longWords {
	return &longWords{
		seed:  maphash.MakeSeed(),
		slots: make([]longSlot, 1<<bits),
		shift: uint8(64 - bits),
		bits:  bits,
		text:  make([]byte, 16<<bits),
		ids:   make([]uint32, 4<<bits),
	}
}

func (l *longWords) hash(w []byte) uint64 {
	return maphash.Bytes(l.seed, w) | 1
}

// get returns the ids of w, a slice of the table's arena the caller must
// not write.
func (l *longWords) get(w []byte) ([]uint32, bool) {
	h := l.hash(w)
	mask := uint64(len(l.slots) - 1)
	for i := h >> l.shift; ; i = (i + 1) & mask {
		e := &l.slots[i]
		k := e.h.Load()
		if k == 0 {
			return nil, false
		}
		if k == h {
			if ids, ok := l.match(e, w); ok {
				return ids, true
			}
		}
	}
}

// match returns the ids of the published slot e if its word is w.
func (l *longWords) match(e *longSlot, w []byte) ([]uint32, bool) {
	off, n := e.word>>16, int(e.word&0xffff)
	if n != len(w) || string(l.text[off:off+uint64(n)]) != string(w) {
		return nil, false
	}
	ioff, in := e.ids>>16, e.ids&0xffff
	return l.ids[ioff : ioff+in : ioff+in], true
}

// put keeps ids as the ids of w and reports whether it could: false when
// the table is full, and its owner should replace it (next).
func (l *longWords) put(w []byte, ids []uint32) bool {
	if l.n.Load() >= int64(len(l.slots)/2) {
		return false
	}
	tend := l.ntext.Add(int64(len(w)))
	iend := l.nids.Add(int64(len(ids)))
	if tend > int64(len(l.text)) || iend > int64(len(l.ids)) {
		return false
	}
	toff, ioff := tend-int64(len(w)), iend-int64(len(ids))
	copy(l.text[toff:tend], w)
	copy(l.ids[ioff:iend], ids)
	h := l.hash(w)
	mask := uint64(len(l.slots) - 1)
	for i := h >> l.shift; ; i = (i + 1) & mask {
		e := &l.slots[i]
		k := e.h.Load()
		if k == 0 && e.h.CompareAndSwap(0, longBusy) {
			e.word = uint64(toff)<<16 | uint64(len(w))
			e.ids = uint64(ioff)<<16 | uint64(len(ids))
			e.h.Store(h)
			l.n.Add(1)
			return true
		}
		if k == h {
			if _, ok := l.match(e, w); ok {
				return true // another worker's, the same ids
			}
		}
	}
}

// next is the table that replaces a full l: four times its size, or l's
// size at the largest.
func (l *longWords) next() *longWords {
	return newLongWords(min(l.bits+2, max(longWordsMaxBits, longWordsMinBits)))
}

// longTable is the long words' table in use, made at the first word put
// and replaced when full: an encoder's own, or the one a Tokenizer's
// workers share.
type longTable struct{ cur atomic.Pointer[longWords] }

func (t *longTable) get(w []byte) ([]uint32, bool) {
	if l := t.cur.Load(); l != nil {
		return l.get(w)
	}
	return nil, false
}

// put keeps ids as the ids of w. A full table is replaced (next) by the
// first of the workers that finds it so, and w goes into its successor,
// which, empty, takes any word of up to maxCachedWord bytes.
func (t *longTable) put(w []byte, ids []uint32) {
	l := t.cur.Load()
	if l == nil {
		t.cur.CompareAndSwap(nil, newLongWords(longWordsMinBits))
		l = t.cur.Load()
	}
	if l.put(w, ids) {
		return
	}
	if t.cur.Load() == l {
		t.cur.CompareAndSwap(l, l.next())
	}
	t.cur.Load().put(w, ids)
}
