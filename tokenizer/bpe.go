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

// merge applies the BPE merges to syms in place, lowest rank first and
// leftmost first among equal ranks, as HF's Word::merge_all does, and
// returns the merged symbols.
func (m *mergeTable) merge(syms []uint32) []uint32 {
	var scratch mergeScratch
	return m.mergeWith(syms, &scratch)
}

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

// mergeWith is merge with scratch space. The symbols stay where they are,
// linked in order, and a merge takes the smallest key by a branch-free
// scan: shifting the symbols and their ranks after each merge (two copies)
// and finding the lowest rank by comparisons that the branch predictor
// missed took half as long again.
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

// mergeHeap is merge for long words: a doubly linked list of symbols and a
// binary min-heap of candidate merges keyed by (rank, position). Entries go
// stale when a neighbour merges; they are recognised on pop by comparing the
// pair's current merge with the one recorded.
func (m *mergeTable) mergeHeap(syms []uint32) []uint32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	type cand struct {
		val uint64 // rank<<32 | new id
		pos int32
	}
	less := func(a, b cand) bool { return a.val < b.val || (a.val == b.val && a.pos < b.pos) }
	var h []cand
	push := func(c cand) {
		h = append(h, c)
		for i := len(h) - 1; i > 0; {
			p := (i - 1) / 2
			if !less(h[i], h[p]) {
				break
			}
			h[i], h[p] = h[p], h[i]
			i = p
		}
	}
	pop := func() cand {
		top := h[0]
		last := len(h) - 1
		h[0] = h[last]
		h = h[:last]
		for i := 0; ; {
			l, r, s := 2*i+1, 2*i+2, i
			if l < len(h) && less(h[l], h[s]) {
				s = l
			}
			if r < len(h) && less(h[r], h[s]) {
				s = r
			}
			if s == i {
				break
			}
			h[i], h[s] = h[s], h[i]
			i = s
		}
		return top
	}
	for i := 0; i+1 < n; i++ {
		if v := m.get(syms[i], syms[i+1]); v != noMerge {
			push(cand{v, int32(i)})
		}
	}
	for len(h) > 0 {
		c := pop()
		i := c.pos
		if !alive[i] || next[i] < 0 {
			continue
		}
		j := next[i]
		if m.get(syms[i], syms[j]) != c.val {
			continue
		}
		syms[i] = uint32(c.val)
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if v := m.get(syms[p], syms[i]); v != noMerge {
				push(cand{v, p})
			}
		}
		if k := next[i]; k >= 0 {
			if v := m.get(syms[i], syms[k]); v != noMerge {
				push(cand{v, i})
			}
		}
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}
