package tokenizer

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
)

// mergeHeapReference is mergeHeap as it was before it kept 8 bytes a
// candidate and no prev or alive arrays: candidates of (rank<<32 | id,
// position) in a heap grown by append. The heap merge is checked against
// it on words long enough to take it.
func mergeHeapReference(m *mergeTable, syms []uint32) []uint32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	type cand struct {
		val uint64
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

// longWordsToMerge returns words of longWord+1 to about 20,000 bytes of
// what long words are made of: runs of one character, letters with and
// without a pattern, code's characters, digits, bytes of every value, and
// runs inside them.
func longWordsToMerge(r *rand.Rand) [][]byte {
	alphabets := []string{"etaoinshrdlu_", "  \t\n-=*/(){}:;.,0123456789xyz", "0123456789", "\x00\x80\xff\xc3\xa9e", " ", "-", "ab"}
	var words [][]byte
	for trial := range 300 {
		n := longWord + 1 + r.IntN(1<<(8+r.IntN(7)))
		alphabet := alphabets[trial%len(alphabets)]
		w := make([]byte, n)
		for i := range w {
			w[i] = alphabet[r.IntN(len(alphabet))]
			if trial%5 == 0 && i > 0 && r.IntN(8) != 0 {
				w[i] = w[i-1] // runs of one character
			}
		}
		words = append(words, w)
	}
	return append(words, bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), 800), bytes.Repeat([]byte(" "), 20_000))
}

// The heap merge gives the reference's symbols on long words, with the
// room it makes for its candidates and with none to spare, so that it
// compacts its heap and grows it at the first push.
func TestMergeHeapMatchesTheReference(t *testing.T) {
	words := longWordsToMerge(rand.New(rand.NewPCG(7, 8)))
	defer func(room func(int) int) { mergeHeapRoom = room }(mergeHeapRoom)
	rooms := map[string]func(int) int{"default room": mergeHeapRoom, "no room": func(c0 int) int { return c0 }, "one": func(int) int { return 1 }}
	for _, style := range styles {
		tk := loadStyle(t, style)
		for name, room := range rooms {
			mergeHeapRoom = room
			for _, w := range words {
				syms := make([]uint32, len(w))
				for i, c := range w {
					syms[i] = tk.byteID[c]
				}
				want := mergeHeapReference(tk.merges, slices.Clone(syms))
				got := tk.merges.mergeHeap(syms)
				if i := firstDiff(got, want); i >= 0 {
					t.Fatalf("%s, %s, word of %d bytes %q...: %d symbols, want %d; first difference at %d", style, name, len(w), w[:20], len(got), len(want), i)
				}
			}
		}
	}
}

// The heap merge makes two allocations, its links and its heap: 13 bytes
// a symbol for a word of spaces, whose every pair merges, and fewer where
// fewer pairs merge (the symbols themselves, 4 bytes a byte, are the
// caller's). With the reference, encoding such a word allocated 114 bytes
// a byte as its heap and symbols grew, and held up to 68 at once
// (BenchmarkLongWordMemory).
func TestMergeHeapAllocations(t *testing.T) {
	const n = 1 << 16
	for _, style := range styles {
		tk := loadStyle(t, style)
		for _, w := range [][]byte{bytes.Repeat([]byte{' '}, n), bytes.Repeat([]byte("abcdefghijklmnopqrstuvwxyz"), n/26+1)[:n]} {
			syms := make([]uint32, n)
			run := func() {
				for i, c := range w {
					syms[i] = tk.byteID[c]
				}
				tk.merges.mergeHeap(syms)
			}
			allocs := testing.AllocsPerRun(3, run)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			run()
			runtime.ReadMemStats(&after)
			perSym := float64(after.TotalAlloc-before.TotalAlloc) / n
			if allocs > 2 || perSym > 13.2 {
				t.Errorf("%s, %q...: %v allocations of %.2f bytes a symbol, want at most 2 of 13.2", style, w[:8], allocs, perSym)
			}
			t.Logf("%s, %q...: %v allocations, %.2f bytes a symbol", style, w[:8], allocs, perSym)
		}
	}
}
