package tokenizer

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"testing"
)

// randomWords returns n words of 1 to maxLen bytes of ASCII code and prose
// characters, one in ten with UTF-8 bytes appended, whole or cut.
func randomWords(rng *rand.Rand, n, maxLen int) [][]byte {
	alphabet := []byte(" \t\nabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789(){}[]<>.,;:=+-*/_'\"!?#@$%^&|~`\\\x00")
	words := make([][]byte, 0, n)
	for range n {
		w := make([]byte, 1+rng.IntN(maxLen))
		for i := range w {
			w[i] = alphabet[rng.IntN(len(alphabet))]
		}
		if rng.IntN(10) == 0 {
			w = append(w, "é€"...)[:min(len(w)+3, maxLen)]
		}
		words = append(words, w)
	}
	return words
}

// randomMix joins 1 to most pieces drawn at random.
func randomMix(rng *rand.Rand, pieces []string, most int) []byte {
	var b []byte
	for range 1 + rng.IntN(most) {
		b = append(b, pieces[rng.IntN(len(pieces))]...)
	}
	return b
}

// scanEnds is where the general scan end (gpt2WordEnd, gpt4WordEnd)
// ends each word of b.
func scanEnds(b []byte, end func(b []byte, i int) int) []int {
	var ends []int
	for i := 0; i < len(b); {
		i = end(b, i)
		ends = append(ends, i)
	}
	return ends
}

// splitterEnds is where split ends each word of b.
func splitterEnds(b []byte, split splitter) []int {
	var got, ends []int
	for i := 0; i < len(b); {
		ends = split(b, i, ends[:0])
		got = append(got, ends...)
		i = ends[len(ends)-1]
	}
	return got
}

// wordByWord is the ids of b's words as the general scan end cuts them,
// encoded one at a time by st.
func wordByWord(st *encoderState, b []byte, end func(b []byte, i int) int) []uint32 {
	var ids []uint32
	for i := 0; i < len(b); {
		e := end(b, i)
		ids = st.word(ids, b[i:e])
		i = e
	}
	return ids
}

// Every word comes out of the word caches with the ids that the merges give
// it, whether the caches are cold or warm, growing or starting over: tens of
// thousands of words of 1 to 20 bytes (the packed table up to 15, the long
// words' table beyond), each encoded from the merges alone and then twice by
// one warm state, once with the tables' limits low enough that they fill and
// start over.
func TestWordCacheAgreesWithTheMerges(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	words := randomWords(rng, 40_000, 20)
	// Long words, cached up to maxCachedWord bytes: runs of one
	// character, as a comment's line of dashes, and mixes.
	for n := 16; n <= maxCachedWord+100; n += 1 + n/8 {
		words = append(words, bytes.Repeat([]byte{"-= \t\n"[rng.IntN(5)]}, n), randomWords(rng, 1, n)[0])
	}
	defer func(old, oldBits int) { wordTableMax, longWordsMaxBits = old, oldBits }(wordTableMax, longWordsMaxBits)
	largest, largestBits := wordTableMax, longWordsMaxBits
	for _, limit := range []int{largest, 2 * wordTableMin} {
		// The low limits fill the tables and the long words' table.
		wordTableMax, longWordsMaxBits = limit, largestBits
		if limit < largest {
			longWordsMaxBits = longWordsMinBits
		}
		for _, style := range styles {
			tk := loadStyle(t, style)
			warm, fresh := newEncoderState(tk), newEncoderState(tk)
			for round := range 2 {
				for _, w := range words {
					want := fresh.merge(nil, w)
					// The word at the start of a longer buffer, as inside a
					// document: its key is read 16 bytes at a time.
					buf := append(slices.Clone(w), "zzzzzzzzzzzzzzzz"...)
					got := warm.word(nil, buf[:len(w)])
					if !slices.Equal(got, want) {
						t.Fatalf("%s, limit %d, round %d, word %q: %v from the warm state, %v from the merges", style, limit, round, w, got, want)
					}
				}
			}
		}
	}
}

// A packed word is its bytes and its length: "a" and "a\x00" differ, and the
// key read 16 bytes at a time equals the one built byte by byte.
func TestPackedWords(t *testing.T) {
	a0, a1 := packWord([]byte("a"))
	b0, b1 := packWord([]byte("a\x00"))
	if a0 == b0 && a1 == b1 {
		t.Fatal(`"a" and "a\x00" share a key`)
	}
	for n := 1; n <= maxPacked; n++ {
		doc := []byte("0123456789abcdefghijklmnop")
		i0, i1 := packWord(doc[:n])
		c0, c1 := packWord(slices.Clip(slices.Clone(doc[:n])))
		if i0 != c0 || i1 != c1 {
			t.Fatalf("%d bytes: key %x %x inside a document, %x %x alone", n, i0, i1, c0, c1)
		}
		if i1 == 0 {
			t.Fatalf("%d bytes: key %x %x is the empty slot's", n, i0, i1)
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
		b := randomMix(rng, pieces, 30)
		i := rng.IntN(len(b))
		for _, cl := range []class{clsOther, clsLetter, clsNumber, clsSpace} {
			if got, want := scanClass(b, i, cl), plain(b, i, cl); got != want {
				t.Fatalf("%q from %d, class %d: ends at %d, want %d", b, i, cl, got, want)
			}
		}
	}
}

func TestByteMask(t *testing.T) {
	for n := 0; n <= 8; n++ {
		var want uint64
		for i := 0; i < n; i++ {
			want |= 0xff << (8 * i)
		}
		if byteMask[n] != want {
			t.Errorf("byteMask[%d] = %#x, want %#x", n, byteMask[n], want)
		}
	}
}

// lettersEnd8 ends a run of letters where scanLetters does, or declines.
func TestLettersEnd8AgreesWithScanLetters(t *testing.T) {
	pieces := []string{"a", "Z", "q", "é", "日", "—", "\xe1", "1", " ", "\n", "(", "_", "@", "[", "`", "{", "\x80"}
	rng := rand.New(rand.NewPCG(9, 10))
	declined := 0
	for range 50_000 {
		b := randomMix(rng, pieces, 14)
		j := rng.IntN(len(b))
		e, ok := lettersEnd8(b, j)
		if !ok {
			declined++
			continue
		}
		if want := scanLetters(b, j); e != want {
			t.Fatalf("%q from %d: ends at %d, scanLetters at %d", b, j, e, want)
		}
	}
	if declined == 0 || declined == 50_000 {
		t.Fatalf("declined %d of 50000", declined)
	}
}

// The GPT-4 and Qwen2 splitters' ASCII path cuts every text where the
// general scan, one word at a time, does: random mixes of what the
// pattern tells apart (contractions in either case, runs of digits,
// spaces and line breaks of every kind, punctuation, multi-byte letters,
// numbers and spaces, invalid UTF-8), long enough that the 16 bytes the
// ASCII path reads ahead run out inside them.
func TestGPT4SplitterMatchesTheGeneralScan(t *testing.T) {
	pieces := []string{
		"a", "Z", "q", "foo", "Hello", "é", "日本", "ſ", "'", "'s", "'T", "'re", "'VE", "'ll", "'d", "'m", "'x",
		"1", "22", "333", "4444", "٣", "½", " ", "  ", "\t", "\v", "\f", "\r", "\n", "\r\n", "\n\n\t",
		"\u00a0", "\u0085", "\u2003", "(", ").", "_", "{", "—", "\x80", "\xff", "\xc5", "\x00", "\x1f", "\x7f",
		"))))))))", "\n\n\n\n\n\n\n\n", "        ", "\t\t\t\t", "12345678", "abcdefghijklm",
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for range 30_000 {
		b := randomMix(rng, pieces, 40)
		for _, sp := range []struct {
			split     splitter
			maxDigits int
		}{{splitGPT4, 3}, {splitQwen2, 1}} {
			want := scanEnds(b, func(b []byte, i int) int { return gpt4WordEnd(b, i, sp.maxDigits) })
			if got := splitterEnds(b, sp.split); !slices.Equal(got, want) {
				t.Fatalf("%q, %d digits: cut at %v, the general scan at %v", b, sp.maxDigits, got, want)
			}
		}
	}
}

// splitWordsGPT4, the GPT-4 pattern's scan and the hot table's lookup in
// one loop, gives every text the ids of its words cut by the general
// scan and encoded one by one, with its table cold and warm: random
// mixes as above, of many lengths (the last 16 bytes, which it leaves to
// the general scan, fall anywhere among their words), and the golden
// texts.
func TestSplitWordsGPT4MatchesWordByWord(t *testing.T) {
	tk := loadStyle(t, "gpt4-style")
	pieces := []string{
		"a", "Z", "foo", "Hello", "return", "abcdefghijklmnopq", "é", "日本", "ſ", "'", "'s", "'T", "'re", "'VE", "'ll",
		"'x", "1", "22", "333", "4444", "٣", " ", "  ", "\t", "\r", "\n", "\r\n", "\n\n\t", "\u00a0", "\u2003",
		"(", ").", "_", "{", "—", "\x80", "\xff", "\x00", ":=", "))))))))", "\n\n\n\n\n\n\n\n", "        ", "12345678",
	}
	rng := rand.New(rand.NewPCG(13, 14))
	var docs [][]byte
	for range 3_000 {
		docs = append(docs, randomMix(rng, pieces, 60))
	}
	for _, name := range texts {
		docs = append(docs, readTestdata(t, name+".txt"))
	}
	for _, digits := range []int{3, 1} {
		fused, plain := newEncoderState(tk), newEncoderState(tk)
		for round := range 2 {
			for _, text := range docs {
				want := wordByWord(plain, text, func(b []byte, i int) int { return gpt4WordEnd(b, i, digits) })
				if got := fused.splitWordsGPT4(nil, text, digits); !slices.Equal(got, want) {
					t.Fatalf("%d digits, round %d, %q: %v, want %v", digits, round, text, got, want)
				}
			}
		}
	}
}

// The GPT-4 splitter and splitWordsGPT4 cut any bytes where the general
// scan does, and give its words' ids.
func FuzzGPT4MatchesTheGeneralScan(f *testing.F) {
	for _, s := range []string{"", "Hello, world!\n", "\tx := y[12345]\r\n\n  // it's 'ok'", "日本語 ſt\u00a0\u2003 ٣٤ \xff\xc5"} {
		f.Add([]byte(s))
	}
	tk := loadStyle(f, "gpt4-style")
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, digits := range []int{3, 1} {
			end := func(b []byte, i int) int { return gpt4WordEnd(b, i, digits) }
			split := func(b []byte, i int, ends []int) []int { return splitGPT4Like(b, i, ends, digits) }
			ends, want := scanEnds(b, end), wordByWord(newEncoderState(tk), b, end)
			if got := splitterEnds(b, split); !slices.Equal(got, ends) {
				t.Fatalf("%q, %d digits: cut at %v, the general scan at %v", b, digits, got, ends)
			}
			fused := newEncoderState(tk)
			for round := range 2 {
				if got := fused.splitWordsGPT4(nil, b, digits); !slices.Equal(got, want) {
					t.Fatalf("%q, %d digits, round %d: %v, want %v", b, digits, round, got, want)
				}
			}
		}
	})
}

// The GPT-2 splitter's ASCII path (gpt2Len) cuts every text where the
// general scan, one word at a time, does: random mixes of what the
// pattern tells apart (contractions, which it matches in lower case only,
// a space before letters, digits or punctuation, runs of spaces of every
// kind, multi-byte letters, numbers and spaces, invalid UTF-8), long
// enough that the 16 bytes the ASCII path reads ahead run out inside them.
func TestGPT2SplitterMatchesTheGeneralScan(t *testing.T) {
	pieces := []string{
		"a", "Z", "q", "foo", "Hello", "é", "日本", "ſ", "'", "'s", "'S", "'t", "'re", "'RE", "'ve", "'ll", "'lL", "'d", "'m",
		"'x", "''", "1", "22", "333", "4444", "٣", "½", " ", "  ", "\t", "\v", "\f", "\r", "\n", "\r\n", "\n\n\t",
		"\u00a0", "\u0085", "\u2003", "(", ").", "_", "{", "—", "\x80", "\xff", "\xc5", "\x00", "\x1f", "\x7f",
		"))))))))", "\n\n\n\n\n\n\n\n", "        ", "\t\t\t\t", "12345678", "abcdefghijklm", " x", " 7", " (",
	}
	rng := rand.New(rand.NewPCG(15, 16))
	for range 30_000 {
		b := randomMix(rng, pieces, 40)
		if got, want := splitterEnds(b, splitGPT2), scanEnds(b, gpt2WordEnd); !slices.Equal(got, want) {
			t.Fatalf("%q: cut at %v, the general scan at %v", b, got, want)
		}
	}
}

// splitWordsGPT2, the GPT-2 pattern's scan and the hot table's lookup in
// one loop, gives every text the ids of its words cut by the general
// scan and encoded one by one, with its table cold and warm: random
// mixes as above, of many lengths (the last 16 bytes, which it leaves to
// the general scan, fall anywhere among their words), and the golden
// texts.
func TestSplitWordsGPT2MatchesWordByWord(t *testing.T) {
	tk := loadStyle(t, "gpt2-style")
	pieces := []string{
		"a", "Z", "foo", "Hello", " return", "abcdefghijklmnopq", "é", "日本", "ſ", "'", "'s", "'S", "'re", "'VE", "'ll",
		"'x", "1", "22", " 333", "4444", "٣", " ", "  ", "\t", "\r", "\n", "\r\n", "\n\n\t", "\u00a0", "\u2003",
		"(", ").", "_", " {", "—", "\x80", "\xff", "\x00", ":=", "))))))))", "\n\n\n\n\n\n\n\n", "        ", "12345678",
	}
	rng := rand.New(rand.NewPCG(17, 18))
	var docs [][]byte
	for range 3_000 {
		docs = append(docs, randomMix(rng, pieces, 60))
	}
	for _, name := range texts {
		docs = append(docs, readTestdata(t, name+".txt"))
	}
	fused, plain := newEncoderState(tk), newEncoderState(tk)
	for round := range 2 {
		for _, text := range docs {
			want := wordByWord(plain, text, gpt2WordEnd)
			if got := fused.splitWordsGPT2(nil, text); !slices.Equal(got, want) {
				t.Fatalf("round %d, %q: %v, want %v", round, text, got, want)
			}
		}
	}
}

// The GPT-2 splitter and splitWordsGPT2 cut any bytes where the general
// scan does, and give its words' ids.
func FuzzGPT2MatchesTheGeneralScan(f *testing.F) {
	for _, s := range []string{"", "Hello, world!\n", "\tx := y[12345]\r\n\n  // it's 'ok' 'S", "日本語 ſt\u00a0\u2003 ٣٤ ½ \xff\xc5"} {
		f.Add([]byte(s))
	}
	tk := loadStyle(f, "gpt2-style")
	f.Fuzz(func(t *testing.T, b []byte) {
		ends, want := scanEnds(b, gpt2WordEnd), wordByWord(newEncoderState(tk), b, gpt2WordEnd)
		if got := splitterEnds(b, splitGPT2); !slices.Equal(got, ends) {
			t.Fatalf("%q: cut at %v, the general scan at %v", b, got, ends)
		}
		fused := newEncoderState(tk)
		for round := range 2 {
			if got := fused.splitWordsGPT2(nil, b); !slices.Equal(got, want) {
				t.Fatalf("%q, round %d: %v, want %v", b, round, got, want)
			}
		}
	})
}
