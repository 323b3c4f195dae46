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
	var scratch [longWord]uint64
	return m.mergeWith(syms, &scratch)
}

// mergeWith is merge with scratch space for the ranks of short words, which
// an encoder keeps: zeroing a fresh array for every word it merged was a
// tenth of the merging.
func (m *mergeTable) mergeWith(syms []uint32, scratch *[longWord]uint64) []uint32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) > longWord {
		return m.mergeHeap(syms)
	}
	ranks := scratch[:len(syms)-1] // ranks[i]: merge of (syms[i], syms[i+1])
	for i := range ranks {
		ranks[i] = m.get(syms[i], syms[i+1])
	}
	for len(ranks) > 0 {
		best, at := noMerge, -1
		for i, r := range ranks {
			if r < best {
				best, at = r, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = uint32(best)
		copy(syms[at+1:], syms[at+2:])
		syms = syms[:len(syms)-1]
		copy(ranks[at:], ranks[at+1:])
		ranks = ranks[:len(ranks)-1]
		if at > 0 {
			ranks[at-1] = m.get(syms[at-1], syms[at])
		}
		if at < len(ranks) {
			ranks[at] = m.get(syms[at], syms[at+1])
		}
	}
	return syms
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
