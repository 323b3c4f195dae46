package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// wordEnd is the general scan of the golden tokenizer's pattern.
func wordEnd(style string) func(b []byte, i int) int {
	if style == "gpt2-style" {
		return gpt2WordEnd
	}
	return func(b []byte, i int) int { return gpt4WordEnd(b, i, 3) }
}

// longestWord is the offset and length of b's first longest word.
func longestWord(b []byte, end func(b []byte, i int) int) (off, n int) {
	for i := 0; i < len(b); {
		e := end(b, i)
		if e-i > n {
			off, n = i, e-i
		}
		i = e
	}
	return off, n
}

// boundedEntries are the bounded encodes, each called as it would be:
// AppendEncodedAmongBounded from one of four goroutines encoding at once.
var boundedEntries = []struct {
	name   string
	encode func(tk *Tokenizer, dst []uint32, b []byte, maxWord int) ([]uint32, error)
}{
	{"AppendEncodedBounded", (*Tokenizer).AppendEncodedBounded},
	{"AppendEncodedAmongBounded", func(tk *Tokenizer, dst []uint32, b []byte, maxWord int) ([]uint32, error) {
		var ids []uint32
		var err error
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if w == 0 {
					ids, err = tk.AppendEncodedAmongBounded(4, dst, b, maxWord)
					return
				}
				tk.AppendEncodedAmongBounded(4, nil, b, maxWord) // the same words at once
			}()
		}
		wg.Wait()
		return ids, err
	}},
}

// longWordDocs are documents with one long word, of each class of
// character, among random text: letters, spaces at the end and before a
// letter, line breaks, punctuation, digits (one word under the GPT-2
// pattern, words of three under GPT-4's) and multi-byte letters.
func longWordDocs(rng *rand.Rand) [][]byte {
	runs := []string{"x", " ", "\n", "-", "7", "é", "\t "}
	var docs [][]byte
	for i, r := range runs {
		for _, n := range []int{20, 1000, 5000} {
			run := strings.Repeat(r, n/len(r))
			docs = append(docs,
				slices.Concat(randomText(rng, 300+i), []byte(" "+run+"a"), randomText(rng, 200)),
				slices.Concat(randomText(rng, 100), []byte(run)))
		}
	}
	return docs
}

// A bounded encode refuses a document whose longest word is one byte over
// its bound, naming that word, and leaves dst as it was; at the word's
// length it gives Encode's ids, for both patterns, through each entry
// point. Refusing leaves nothing behind: the tokenizer then encodes the
// documents unbounded with a fresh one's ids.
func TestBoundedEncodeRefusesAWordOverTheBound(t *testing.T) {
	docs := longWordDocs(rand.New(rand.NewPCG(9, 10)))
	for _, style := range styles {
		fresh := loadStyle(t, style)
		for _, e := range boundedEntries {
			tk := loadStyle(t, style)
			for _, doc := range docs {
				off, n := longestWord(doc, wordEnd(style))
				if n < maxPacked+1 {
					continue // digits under the GPT-4 pattern
				}
				dst := []uint32{7, 8, 9}
				got, err := e.encode(tk, dst, doc, n-1)
				var long *LongWordError
				if !errors.As(err, &long) {
					t.Fatalf("%s, %s, a word of %d bytes at %d under a bound of %d: error %v, want a LongWordError", style, e.name, n, off, n-1, err)
				}
				if *long != (LongWordError{Offset: off, Length: n, Max: n - 1}) {
					t.Errorf("%s, %s: %+v, want the word of %d bytes at %d over %d", style, e.name, *long, n, off, n-1)
				}
				if !slices.Equal(got, dst) || cap(got) != cap(dst) {
					t.Errorf("%s, %s: refused, dst came back as %v, want %v", style, e.name, got, dst)
				}
				want := append([]uint32{7, 8, 9}, fresh.EncodeBytes(doc)...)
				got, err = e.encode(tk, []uint32{7, 8, 9}, doc, n)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("%s, %s, a word of %d bytes at %d under a bound of as many: %d ids (%v), want Encode's %d", style, e.name, n, off, len(got), err, len(want))
				}
			}
			for _, doc := range docs {
				if got, want := tk.EncodeBytes(doc), fresh.EncodeBytes(doc); !slices.Equal(got, want) {
					t.Fatalf("%s, %s: after the bounded encodes, Encode gives %d ids, a fresh tokenizer %d", style, e.name, len(got), len(want))
				}
			}
		}
	}
}

// Under a bound at or above every word, a bounded encode gives Encode's
// ids: HF's on the golden texts, and one encoder's on random text, for
// both patterns, through each entry point.
func TestBoundedEncodeMatchesEncode(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var random [][]byte
	for range 8 {
		random = append(random, randomText(rng, 20_000))
	}
	for _, style := range styles {
		one := loadStyle(t, style)
		for _, e := range boundedEntries {
			tk := loadStyle(t, style)
			for _, name := range texts {
				text := readTestdata(t, name+".txt")
				_, longest := longestWord(text, wordEnd(style))
				for _, bound := range []int{DefaultMaxWordBytes, max(longest, maxPacked)} {
					got, err := e.encode(tk, nil, text, bound)
					if err != nil {
						t.Fatalf("%s, %s, %s under a bound of %d (its longest word %d): %v", style, e.name, name, bound, longest, err)
					}
					if i := firstDiff(got, goldenIDs(t, style, name)); i >= 0 {
						t.Fatalf("%s, %s, %s under a bound of %d: differs from HF's ids at %d", style, e.name, name, bound, i)
					}
				}
			}
			for i, text := range random {
				_, longest := longestWord(text, wordEnd(style))
				for _, bound := range []int{DefaultMaxWordBytes, max(longest, maxPacked)} {
					got, err := e.encode(tk, nil, text, bound)
					if j := firstDiff(got, one.EncodeBytes(text)); err != nil || j >= 0 {
						t.Fatalf("%s, %s, random text %d under a bound of %d (its longest word %d): %v; ids differ at %d", style, e.name, i, bound, longest, err, j)
					}
				}
			}
		}
	}
}

// A bound below the words the word tables answer for is refused as such.
func TestBoundedEncodeRefusesABoundTooSmall(t *testing.T) {
	tk := loadStyle(t, "gpt4-style")
	for _, e := range boundedEntries {
		for _, bound := range []int{-1, 0, maxPacked - 1} {
			got, err := e.encode(tk, []uint32{1}, []byte("hello"), bound)
			var long *LongWordError
			if err == nil || errors.As(err, &long) || !strings.Contains(err.Error(), fmt.Sprint(bound)) || len(got) != 1 {
				t.Errorf("%s, bound %d: %v, %v; want dst and an error naming the bound", e.name, bound, got, err)
			}
		}
	}
}

// The document that made ingest's workers run out of memory, one run of
// spaces, is refused without its word being merged: the call allocates
// next to nothing, where merging 4 MiB of spaces took 480 MB.
func TestBoundedEncodeDoesNotMergeAWordOverTheBound(t *testing.T) {
	doc := bytes.Repeat([]byte{' '}, 4<<20)
	for _, style := range styles {
		tk := loadStyle(t, style)
		tk.AppendEncodedBounded(nil, doc, DefaultMaxWordBytes) // the encoder's own tables
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := tk.AppendEncodedBounded(nil, doc, DefaultMaxWordBytes)
		runtime.ReadMemStats(&after)
		var long *LongWordError
		if !errors.As(err, &long) || *long != (LongWordError{Offset: 0, Length: len(doc), Max: DefaultMaxWordBytes}) {
			t.Fatalf("%s: %v, want the word of %d bytes at 0 refused", style, err, len(doc))
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<10 {
			t.Errorf("%s: refusing a word of %d bytes allocated %d bytes", style, len(doc), alloc)
		}
	}
}

// variant is the GPT-2-style tokenizer with change applied to its JSON.
func variant(t *testing.T, change func(cfg map[string]any)) *Tokenizer {
	t.Helper()
	var cfg map[string]any
	if err := json.Unmarshal(readTestdata(t, "gpt2-style.tokenizer.json"), &cfg); err != nil {
		t.Fatal(err)
	}
	change(cfg)
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// A word's offset is the document's, past the text a tokenizer makes of
// it: a normalizer that changes the document (offsets of the normalized
// text), a prefix space (not counted) and added tokens (counted).
func TestLongWordErrorNamesTheWordInTheDocument(t *testing.T) {
	nfc := variant(t, func(cfg map[string]any) { cfg["normalizer"] = map[string]any{"type": "NFC"} })
	prefix := variant(t, func(cfg map[string]any) {
		cfg["pre_tokenizer"].(map[string]any)["add_prefix_space"] = true
	})
	added, err := Parse(withAdded(t, `[{"id":30093,"content":"<|endoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
		{"id":30094,"content":"<|end|>","single_word":false,"lstrip":true,"rstrip":true,"normalized":false,"special":true}]`))
	if err != nil {
		t.Fatal(err)
	}
	run := strings.Repeat("x", 100)
	decomposed := strings.Repeat("e\u0301", 10) // NFC: "é", a byte shorter each
	for _, c := range []struct {
		name      string
		tk        *Tokenizer
		doc       string
		off, size int
	}{
		{"NFC, normalized", nfc, "ab, " + run, 3, 101},
		{"NFC, changed", nfc, decomposed + ", " + run, 2*10 + 1, 101},
		{"prefix space, at the start", prefix, run + " y", 0, 101},
		{"prefix space, later", prefix, "ab, " + run, 3, 101},
		{"prefix space, after a space", prefix, " " + run, 0, 101},
		{"after an added token", added, "ab<|endoftext|>c, " + run, len("ab<|endoftext|>c,"), 101},
		{"after one that strips spaces", added, "ab <|end|>   " + run + "  <|end|>", len("ab <|end|>   "), 100},
	} {
		_, err := c.tk.AppendEncodedBounded(nil, []byte(c.doc), 50)
		var long *LongWordError
		if !errors.As(err, &long) || long.Offset != c.off || long.Length != c.size {
			t.Errorf("%s: %v, want the word of %d bytes at %d", c.name, err, c.size, c.off)
		}
		if got, err := c.tk.AppendEncodedBounded(nil, []byte(c.doc), c.size); err != nil || !slices.Equal(got, c.tk.Encode(c.doc)) {
			t.Errorf("%s: under a bound of the word's length, %v (%v), want Encode's %v", c.name, got, err, c.tk.Encode(c.doc))
		}
	}
	if !norm.NFC.IsNormal([]byte("ab, "+run)) || norm.NFC.IsNormal([]byte(decomposed)) {
		t.Fatal("the NFC cases are not what they say")
	}
}
