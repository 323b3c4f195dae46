package tokenizer

import (
	"sync"
	"sync/atomic"
)

// A Tokenizer's shared word table starts at 1<<sharedWordsMinBits slots
// (1.5 MiB, room for the 30,000 distinct words of the 1 MB golden texts)
// and grows fourfold when half full, up to 1<<sharedWordsMaxBits (24 MiB,
// 512,000 words; 31 MB of Go and prose has 104,000 distinct words of up
// to 15 bytes with the GPT-2 pattern, 124,000 with GPT-4's). Starting
// small keeps a short text from paying for the pages of a large table (a
// fixed 12 MiB one cost a 1 MB stream a third more CPU time); growing
// fourfold, not twofold, copies the words fewer times.
// sharedWordsMaxBits is a variable for tests.
const sharedWordsMinBits = 16

var sharedWordsMaxBits = 20

// sharedWordsLargeText is the text, in bytes, from which a call that knows
// its size (EncodeBatch, a stream of a file) starts the table at its largest,
// the size such a text's words grow it to anyway: while a table grows,
// every word inserted meanwhile goes to the inserting worker's own table
// and is merged again by every other worker that meets it. On 200 MB of Go
// and prose with 16 workers, starting at 1<<16 slots merged 293,720
// GPT-4-style words (125,171 of them kept by one worker only) against
// 131,159 on one worker; starting at the largest, 168,723 (12); GPT-2
// style 195,158 (54,356) against 109,472, and 138,247 (17). The rest were
// words longer than a table's, which each worker then merged on its own
// (longWords now holds them for all), and words two workers met at once.
// A variable for tests.
var sharedWordsLargeText int64 = 64 << 20

// sharedWords is a word table that the workers of one Tokenizer fill and
// read together, so that a word met by sixteen workers is merged once,
// not sixteen times, and one table, not sixteen copies of it, competes
// for the last-level cache. A slot is written once: its k1 is claimed
// with a compare-and-swap, k0 and v are written, and k1 is then
// published, so a reader that sees a word's k1 also sees the rest. A
// word that two workers merge at once may be held twice, with the same
// ids. When the table is half full, the worker whose insert found it so
// copies it into one four times the size and publishes that in cur; the
// others move to it at their next lookup that misses their hot slots, and
// words inserted in the old table meanwhile are lost (they are merged
// again). At the largest size, words
// that do not fit go to each worker's own table.
type sharedWords struct {
	slots []sharedSlot
	mask  uint64
	shift uint8
	ids   []uint32 // ids of words of three ids or more; never reallocated
	cur   *atomic.Pointer[sharedWords]
	// The counters every insert updates, on a cache line of their own so
	// that inserts do not evict the fields every lookup reads.
	_       [64]byte
	n       atomic.Int64 // slots claimed
	nids    atomic.Int64 // ids claimed
	growing atomic.Bool
}

type sharedSlot struct {
	k0 uint64
	k1 atomic.Uint64 // 0: empty; slotBusy: being written
	v  uint64        // as wordSlot's, with inShared set on offsets
}

// slotBusy is a k1 no word has: its length byte is above maxPacked.
const slotBusy = ^uint64(0)

// newSharedWords returns an empty table of 1<<bits slots that replaces
// itself in cur when it grows.
func newSharedWords(bits int, cur *atomic.Pointer[sharedWords]) *sharedWords {
	s := &sharedWords{
		mask:  1<<bits - 1,
		shift: uint8(64 - bits),
		ids:   make([]uint32, 2<<bits),
		cur:   cur,
	}
	s.slots = sharedSlots(s, 1<<bits)
	return s
}

// hugeTableMin is the size in bytes from which a shared table's slots are
// mapped on huge pages where the system has them (sharedSlots): the
// largest table (24 MiB) and the one below it (6 MiB), not the smallest
// (1.5 MiB, less than a huge page).
const hugeTableMin = 4 << 20

// hugePage is the size of a transparent huge page on the machines kiln
// runs on (x86-64 and arm64 with 4 KiB base pages).
const hugePage = 2 << 20

// mappedTables holds, for the tests, the address of each table mapped
// outside the Go heap (sharedSlots) until it is unmapped.
var mappedTables sync.Map

// get looks up the word (k0, k1) of hash hh. It returns the word's v, or
// the empty slot where the lookup ended, for put.
func (s *sharedWords) get(hh, k0, k1 uint64) (v, h uint64, ok bool) {
	for h = hh >> s.shift; ; h = (h + 1) & s.mask {
		e := &s.slots[h]
		k := e.k1.Load()
		if k == k1 && e.k0 == k0 {
			return e.v, h, true
		}
		if k == 0 {
			return 0, h, false
		}
	}
}

// put stores ids for the word (k0, k1) in slot h, where its lookup ended,
// and returns the slot's v. It reports false, storing nothing, when the
// table is half full or its ids are full (growing it, once), or another
// worker took the slot.
func (s *sharedWords) put(h, k0, k1 uint64, ids []uint32) (uint64, bool) {
	if s.n.Load() >= int64(len(s.slots)/2) {
		s.grow()
		return 0, false
	}
	var off int64
	if len(ids) > 2 {
		end := s.nids.Add(int64(len(ids)))
		if end > int64(len(s.ids)) {
			s.grow()
			return 0, false
		}
		off = end - int64(len(ids))
		copy(s.ids[off:end], ids)
	}
	v := idsValue(ids, uint64(off), inArena|inShared)
	e := &s.slots[h]
	if !e.k1.CompareAndSwap(0, slotBusy) {
		return 0, false
	}
	s.n.Add(1)
	e.k0, e.v = k0, v
	e.k1.Store(k1)
	return v, true
}

// grow replaces s in cur with a table four times its size, unless s is of the
// largest size or another worker has replaced it.
func (s *sharedWords) grow() {
	if 2*len(s.slots) < 1<<sharedWordsMaxBits && s.growing.CompareAndSwap(false, true) {
		s.cur.Store(s.grown())
	}
}

// grown returns a table four times the size of s holding the words
// published in s. Other workers may be inserting into s meanwhile: a slot
// being written is skipped.
func (s *sharedWords) grown() *sharedWords {
	g := newSharedWords(64-int(s.shift)+2, s.cur)
	var n, nids int64
	for i := range s.slots {
		e := &s.slots[i]
		k1 := e.k1.Load()
		if k1 == 0 || k1 == slotBusy {
			continue
		}
		k0, v := e.k0, e.v
		if lo, hi := uint32(v), uint32(v>>32); lo&inArena != 0 && hi > 0 {
			off := lo &^ (inArena | inShared)
			copy(g.ids[nids:], s.ids[off:off+hi])
			v = uint64(nids) | inArena | inShared | uint64(hi)<<32
			nids += int64(hi)
		}
		h := hashWord(k0, k1) >> g.shift
		for g.slots[h].k1.Load() != 0 {
			h = (h + 1) & g.mask
		}
		g.slots[h].k0, g.slots[h].v = k0, v
		g.slots[h].k1.Store(k1)
		n++
	}
	g.n.Store(n)
	g.nids.Store(nids)
	return g
}

// share makes c read and fill s before its own slots. When s replaced the
// table c had, c's hot slots are cleared: they may hold offsets into the
// old table's ids.
func (c *wordTable) share(s *sharedWords) {
	if s == c.shared {
		return
	}
	if c.shared != nil {
		clear(c.hot[:])
	}
	c.shared, c.sharedIDs = s, s.ids
}
