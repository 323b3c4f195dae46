package tokenizer

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// Every short word comes out of the short-word table with the ids that the
// merges give it, whether the table is cold, warm, or holds another word in
// the same slot: tens of thousands of words for 8192 slots, each encoded
// by a fresh state (no cache at all) and then twice by one warm state.
func TestShortWordTableAgreesWithTheMerges(t *testing.T) {
	alphabet := []byte(" \t\nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789(){}[]<>.,;:=+-*/_'\"!?#@$%^&|~`\\\x00")
	rng := rand.New(rand.NewPCG(5, 6))
	var words [][]byte
	for range 40_000 {
		w := make([]byte, 1+rng.IntN(7))
		for i := range w {
			w[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if rng.IntN(10) == 0 {
			w = append(w, "é€"...)[:min(len(w)+3, 7)] // UTF-8 bytes, whole or cut
		}
		words = append(words, w)
	}
	for _, style := range styles {
		tk := loadStyle(t, style)
		warm := &encoderState{t: tk, short: new(shortWords), cache: map[string][]uint32{}}
		fresh := &encoderState{t: tk, short: new(shortWords), cache: map[string][]uint32{}}
		for round := range 2 {
			for _, w := range words {
				// Nothing of w cached in fresh: its ids come from the merges.
				clear(fresh.cache)
				key, _ := shortKey(w)
				fresh.short[shortSlot(key)] = shortWord{}
				want := fresh.word(nil, slices.Clip(w))
				// The word at the start of a longer buffer, as inside a
				// document: its key is read 8 bytes at a time.
				buf := append(slices.Clone(w), "zzzzzzzz"...)
				got := warm.word(nil, buf[:len(w)])
				if !slices.Equal(got, want) {
					t.Fatalf("%s, round %d, word %q: %v from the warm state, %v from the merges", style, round, w, got, want)
				}
			}
		}
	}
}

// A short word's key is its bytes and its length: "a" and "a\x00" differ,
// and the key read 8 bytes at a time equals the one built byte by byte.
func TestShortKeys(t *testing.T) {
	a, _ := shortKey([]byte("a"))
	a0, _ := shortKey([]byte("a\x00"))
	if a == a0 {
		t.Fatal(`"a" and "a\x00" share a key`)
	}
	if _, ok := shortKey([]byte("12345678")); ok {
		t.Fatal("an 8-byte word has a short key")
	}
	if _, ok := shortKey(nil); ok {
		t.Fatal("the empty word has a short key")
	}
	for n := 1; n <= 7; n++ {
		doc := []byte("0123456789abcdef")
		inDoc, _ := shortKey(doc[:n])
		alone, _ := shortKey(slices.Clip(slices.Clone(doc[:n])))
		if inDoc != alone {
			t.Fatalf("%d bytes: key %x inside a document, %x alone", n, inDoc, alone)
		}
	}
}

// classLanes marks a byte exactly when the byte table says it is ASCII of
// that class, for every byte value in every lane, beside any neighbours.
func TestClassLanesMatchTheByteTable(t *testing.T) {
	for _, cl := range []class{clsOther, clsLetter, clsNumber, clsSpace} {
		for v := range 256 {
			for lane := range 8 {
				for _, fill := range []byte{0x00, 'a', '0', ' ', 0x7f, 0x80, 0xff} {
					var w [8]byte
					for i := range w {
						w[i] = fill
					}
					w[lane] = byte(v)
					got := classLanes(binary.LittleEndian.Uint64(w[:]), cl)>>(8*lane+7)&1 == 1
					want := v < 0x80 && asciiClass[v] == cl
					if got != want {
						t.Fatalf("class %d, byte %#x in lane %d among %#x: marked %v, want %v", cl, v, lane, fill, got, want)
					}
				}
			}
		}
	}
}

// scanClass ends a run where the one-character-at-a-time scan does, across
// the 8-byte steps, multi-byte letters and the end of the text.
func TestScanClassMatchesThePlainScan(t *testing.T) {
	plain := func(b []byte, i int, cl class) int {
		for i < len(b) {
			c, w := classAt(b, i)
			if c != cl {
				return i
			}
			i += w
		}
		return i
	}
	pieces := []string{"a", "Z", "é", "ß", "日", "1", "٣", " ", "\t", "\u00a0", "\u2003", "(", ".", "\x80", "\xff", "_"}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 20_000 {
		var b []byte
		for range 1 + rng.IntN(30) {
			b = append(b, pieces[rng.IntN(len(pieces))]...)
		}
		i := rng.IntN(len(b))
		for _, cl := range []class{clsOther, clsLetter, clsNumber, clsSpace} {
			if got, want := scanClass(b, i, cl), plain(b, i, cl); got != want {
				t.Fatalf("%q from %d, class %d: ends at %d, want %d", b, i, cl, got, want)
			}
		}
	}
}
