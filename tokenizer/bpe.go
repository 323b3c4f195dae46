package tokenizer

import "math/bits"

// mergeTable maps a pair of token ids to the merge's rank and the id it
// produces. It is an open-addressing table: lookups of adjacent pairs are
// the inner loop of every cache miss, and a Go map costs about twice as
// much there.
type mergeTable struct {
	slots []mergeSlot
	mask  uint64
	shift uint8 // 64 - log2(len(slots)): a slot is the product's top bits
}

// mergeSlot keeps a pair and its merge side by side: one cache line read
// per lookup, where separate arrays of keys and values took two.
type mergeSlot struct {
	key uint64 // (left<<32 | right) + 1; 0 marks an empty slot
	val uint64 // rank<<32 | new id
}

func newMergeTable(n int) *mergeTable {
	size := 1
	for size < 2*n+2 {
		size <<= 1
	}
	return &mergeTable{slots: make([]mergeSlot, size), mask: uint64(size - 1), shift: uint8(64 - bits.TrailingZeros(uint(size)))}
}

func pairKey(a, b uint32) uint64 { return (uint64(a)<<32 | uint64(b)) + 1 }

// hash is the slot of key k: the top bits of its product with an odd
// constant, which depend on all of k. (Bits 20 and up of the product, as
// before, depended only on the right id and four bits of the left, so the
// pairs sharing a right id piled into runs a dozen slots long.)
func (m *mergeTable) hash(k uint64) uint64 { return (k * 0x9E3779B97F4A7C15) >> m.shift }

// put stores a merge unless the pair already has one: HF keeps the first
// (lowest-rank) merge of a pair listed twice.
func (m *mergeTable) put(a, b, rank, id uint32) {
	k := pairKey(a, b)
	for h := m.hash(k); ; h = (h + 1) & m.mask {
		switch m.slots[h].key {
		case 0:
			m.slots[h] = mergeSlot{k, uint64(rank)<<32 | uint64(id)}
			return
		case k:
			return
		}
	}
}

// get returns rank<<32|id of the merge of (a, b), or noMerge.
func (m *mergeTable) get(a, b uint32) uint64 {
	k := pairKey(a, b)
	for h := m.hash(k); ; h = (h + 1) & m.mask {
		switch s := &m.slots[h]; s.key {
		case k:
			return s.val
		case 0:
			return noMerge
		}
	}
}

const noMerge = ^uint64(0)

// longWord is the symbol count above which merging switches from the
// quadratic scan (fastest for the short words that make up almost all text)
// to the heap, so that a 10 MB word without whitespace stays O(n log n).
const longWord = 128

// mergeScratch is mergeWith's working space for a word of up to longWord
// symbols, which an encoder keeps: zeroing a fresh one for every word it
// merged was a tenth of the merging.
type mergeScratch struct {
	// keys[i] is the merge of the pair starting at symbol i as rank<<8 | i,
	// so that the smallest is the lowest rank, leftmost; noKey when the
	// pair has no merge or symbol i is merged away; ids[i] its token.
	keys       [longWord]uint64
	ids        [longWord]uint32
	next, prev [longWord]uint8 // the symbols left, in order
}

// noKey is above every merge's key (a rank has 32 bits), and leaves keys'
// differences in an int64.
const noKey = uint64(1) << 62

// minKey is min(a, b) for keys, with no branch.
func minKey(a, b uint64) uint64 {
	d := int64(a - b)
	return b + uint64(d&(d>>63))
}

// mergeWith applies the BPE merges to syms in place, lowest rank first and
// leftmost first among equal ranks, as HF's Word::merge_all does, and
// returns the merged symbols; s is its working space. The symbols stay
// where they are, linked in order, and a merge takes the smallest key by a
// branch-free scan: shifting the symbols and their ranks after each merge
// (two copies) and finding the lowest rank by comparisons that the branch
// predictor missed took half as long again.
func (m *mergeTable) mergeWith(syms []uint32, s *mergeScratch) []uint32 {
	n := len(syms)
	if n < 2 {
		return syms
	}
	if n > longWord {
		return m.mergeHeap(syms)
	}
	keys := s.keys[:n]
	pair := func(i, j int) {
		v := m.get(syms[i], syms[j])
		keys[i], s.ids[i] = v>>32<<8|uint64(i), uint32(v)
		if v == noMerge {
			keys[i] = noKey
		}
	}
	for i := 0; i < n-1; i++ {
		pair(i, i+1)
		s.next[i], s.prev[i+1] = uint8(i+1), uint8(i)
	}
	keys[n-1], s.next[n-1], s.prev[0] = noKey, uint8(n), 0xff
	for {
		// Two chains of minima, side by side, by arithmetic: Go
		// compiles min and comparisons of these to branches.
		best, b1 := keys[len(keys)-1], noKey
		for i := 0; i+2 <= len(keys); i += 2 {
			best, b1 = minKey(best, keys[i]), minKey(b1, keys[i+1])
		}
		best = minKey(best, b1)
		if best == noKey {
			break
		}
		i := int(best & 0xff)
		j := int(s.next[i])
		syms[i] = s.ids[i]
		keys[j] = noKey
		k := int(s.next[j])
		s.next[i] = uint8(k)
		if k < n {
			s.prev[k] = uint8(i)
			pair(i, k)
		} else {
			keys[i] = noKey
		}
		if p := int(s.prev[i]); p < n {
			pair(p, i)
		}
	}
	out := syms[:0]
	for i := 0; i < n; i = int(s.next[i]) {
		out = append(out, syms[i])
	}
	return out
}

// mergeHeap is merge for long words: the symbols linked in order, and a
// binary min-heap of candidate merges, each rank<<32 | position, so that
// the smallest is the lowest rank, leftmost (a rank is one pair's, so it
// names the id too). Entries go stale when a neighbour merges; they are
// recognised on pop by the pair's current rank.
//
// With the symbols it holds 8 bytes a symbol and 8 a candidate, 17 bytes
// a byte of a word of spaces (every pair a candidate): with prev and alive
// arrays and candidates of 16 bytes in a heap grown by append it took 68
// at the peak (BenchmarkLongWordMemory), and a document of 16 MiB of
// spaces took 1.2 GB resident to encode, against 290 MB.
func (m *mergeTable) mergeHeap(syms []uint32) []uint32 {
	n := len(syms)
	// next[i] is where the symbol after symbol i starts, n after the last:
	// symbol i covers the positions up to it. A position merged away has a
	// negative next, ^start of the symbol it went into; at the last
	// position of a symbol of several that start is kept up to date, so
	// that the symbol before i is found from position i-1 with no prev
	// array.
	next := make([]int32, n)
	c0 := 0
	for i := range next {
		next[i] = int32(i + 1)
		if i+1 < n && m.get(syms[i], syms[i+1]) != noMerge {
			c0++
		}
	}
	// Room for the first candidates and an eighth more: the heap held at
	// most 1.01 times its first candidates on every word of 1 MiB tried
	// (runs of one character, letters, random letters, digits and bytes,
	// the golden vocabulary of 30,000 tokens), where its bound is the
	// first ones and one a merge, up to twice the symbols. Full, it drops
	// its stale entries before it grows (compact).
	h := make(mergeQueue, 0, mergeHeapRoom(c0))
	for i := 0; i+1 < n; i++ {
		if v := m.get(syms[i], syms[i+1]); v != noMerge {
			h = append(h, v>>32<<32|uint64(i))
		}
	}
	h.init()
	push := func(a, b int32) {
		v := m.get(syms[a], syms[b])
		if v == noMerge {
			return
		}
		if len(h) == cap(h) {
			h = m.compact(h, syms, next)
		}
		h = append(h, v>>32<<32|uint64(a))
		h.up(len(h) - 1)
	}
	for len(h) > 0 {
		c := h.pop()
		i, j, v, ok := m.current(c, syms, next)
		if !ok {
			continue
		}
		syms[i] = uint32(v)
		k := next[j]
		next[i], next[j], next[k-1] = k, ^i, ^i
		if i > 0 {
			p := i - 1
			if q := next[p]; q < 0 {
				p = ^q
			}
			push(p, i)
		}
		if k < int32(n) {
			push(i, k)
		}
	}
	out := syms[:0]
	for i := 0; i < n; i = int(next[i]) {
		out = append(out, syms[i])
	}
	return out
}

// current reports whether candidate c of mergeHeap is still the merge of
// the pair at its position: that position starts a symbol that has one
// after it, at j, and the two merge at c's rank. v is their merge.
func (m *mergeTable) current(c uint64, syms []uint32, next []int32) (i, j int32, v uint64, ok bool) {
	i = int32(uint32(c))
	j = next[i]
	if j < 0 || int(j) >= len(next) {
		return i, j, 0, false
	}
	// noMerge's rank half is above every rank.
	v = m.get(syms[i], syms[j])
	return i, j, v, v>>32 == c>>32
}

// mergeHeapRoom is the room mergeHeap makes for c0 first candidates. A
// variable for tests, which make it small to exercise compact.
var mergeHeapRoom = func(c0 int) int { return c0 + c0/8 + 16 }

// compact makes room in mergeHeap's full heap q: it drops the candidates
// pop would skip, and grows q by half when that frees less than a quarter
// of it, so that each compaction pays for the pushes that fill it. A
// candidate dropped as stale cannot become current later but by its pair
// forming again, which pushes it again.
func (m *mergeTable) compact(q mergeQueue, syms []uint32, next []int32) mergeQueue {
	kept := q[:0]
	for _, c := range q {
		if _, _, _, ok := m.current(c, syms, next); ok {
			kept = append(kept, c)
		}
	}
	kept.init()
	if len(kept) > cap(q)-cap(q)/4 {
		grown := make(mergeQueue, len(kept), cap(q)+cap(q)/2+1)
		copy(grown, kept)
		kept = grown
	}
	return kept
}

// mergeQueue is a binary min-heap of uint64s.
type mergeQueue []uint64

func (q mergeQueue) init() {
	for i := len(q)/2 - 1; i >= 0; i-- {
		q.down(i)
	}
}

func (q mergeQueue) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if q[p] <= q[i] {
			return
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
}

func (q mergeQueue) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(q) {
			return
		}
		s := l
		if r := l + 1; r < len(q) && q[r] < q[l] {
			s = r
		}
		if q[i] <= q[s] {
			return
		}
		q[i], q[s] = q[s], q[i]
		i = s
	}
}

// pop removes and returns the smallest.
func (q *mergeQueue) pop() uint64 {
	h := *q
	top, last := h[0], len(h)-1
	h[0] = h[last]
	h = h[:last]
	h.down(0)
	*q = h
	return top
}
